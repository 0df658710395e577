"""Multi-turn rollouts: environments (`environments`), the rollout loop (`loop`)."""
