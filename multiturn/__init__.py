"""Multi-turn rollouts: the rollout loop (`loop`) over the environments in `environments.code_env`."""
