"""Phase 3 with a planted defect, for tests/vllm_cpu: the vLLM samplers publish the policy's adapter once and
never again, so from the second step on vLLM samples with a stale adapter while the trainer scores the
current policy. Same flags as phase3_train_grpo.py."""

from __future__ import annotations

import sys

import phase3_train_grpo
from rollouts.vllm_engine import AdapterSyncedSampler


def sync_only_once(self: AdapterSyncedSampler, step: int) -> bool:
    return self._synced_step is None


if __name__ == "__main__":
    AdapterSyncedSampler.sync_due = sync_only_once  # type: ignore[method-assign]
    sys.exit(phase3_train_grpo.cli())
