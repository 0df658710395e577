"""Environments that answer a policy between its turns: the code environments over the sandbox pool (`code_env`)."""
