"""Multi-turn rollouts (issue 17): environments (`environments`), the rollout loop (`loop`)."""
