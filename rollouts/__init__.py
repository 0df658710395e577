"""Rollouts: how completions are sampled from a policy (settings, backends, model resolution).

A layer below `training/` and `evaluation/` (both use it) and above `sandbox/` and `utils/`.
"""
