"""Where a run's per-step metrics go: `metrics.jsonl` and accelerate's trackers (tensorboard, wandb).

`metrics.jsonl` (one line per optimizer step, written by the main process) is always on; the
trackers are the Accelerator's `log_with` (`training.logging_backends`, see `make_accelerator`),
initialised under `training.tracker_project` with the flattened config, run name
`training.run_name` or the output folder's name. Metrics are averaged over processes first
(`reduce_over_processes`): each process saw different prompts.

The metrics record (`outputs/metrics.jsonl`, one line per optimizer step; a plain dict, not typed yet):
- always: `step`, `epoch`, `lr`, `grad_norm`, `reward/mean`, `reward/std`, `reward/format_mean`, `pass_rate`,
  `pass_fraction/mean`, `frac_reward_zero_std`, `frac_format_only_spread`, `frac_unscorable`,
  `sandbox/error_retried`, `sandbox/error_confirmed`, `teacher_sft/dropped_too_long`,
  `teacher_sft/over_rollout_budget`, `loss/grpo`, `loss/teacher_sft`, `loss/self_sft`, `loss/total`,
  `weight/grpo`, `weight/teacher_sft`, `weight/self_sft`, `completion/mean_length`, `completion/clipped_ratio`,
  `format/closed_think`, `self_sft/samples`, `teacher_sft/pool`, `time/rollout_s`, `time/reward_s`,
  `time/update_s`, `tokens_per_s`;
- `update/skipped`: 1 when the step had no signal beyond the format bonus, so no optimizer step was taken;
- with a GRPO weight: `clip_ratio/low_mean`, `clip_ratio/high_mean`, `ratio/mean`;
- with `kl_coef` > 0: `kl`, `loss/kl`, `weight/kl`;
- with `grpo.dynamic_sampling`: `sampling/rounds`, `sampling/groups_sampled`, `sampling/groups_kept`;
- with a vLLM backend: `rollout/logp_abs_diff`, `rollout/seq_ratio_mean`, `rollout/is_weight_mean`,
  `rollout/is_truncated_frac`.
  The sampler's log-probs come back with each sample.
  Each GRPO token's surrogate is weighted by the capped trainer/sampler ratio (`losses.truncated_importance_weights`),
  per token or per sequence (`grpo.importance_sampling`); the KL term is not reweighted;
- with `grpo.async_rollouts` (max_staleness > 0): `async/staleness_mean`, `async/staleness_max` (optimizer steps
  between the policy trained and the adapter that sampled the batch), `async/policy_version` (that adapter's step),
  `async/dropped_groups` (groups dropped this step for being older than max_staleness), `async/trainer_wait_s`
  (the trainer waiting for the batch), `async/sampler_wait_s` (the producer waiting for the trainer before
  sampling it), and the importance weights' tails `rollout/is_weight_p01`, `rollout/is_weight_p99`;
- with on-policy distillation (`dual_source.opd_weight` > 0): `loss/opd`, `weight/opd`, `opd/kl` (mean student −
  teacher log-prob over policy tokens: the per-token reverse-KL estimate), `opd/advantage_mean`,
  `opd/clipped_frac`, `opd/advantage_p01`, `opd/advantage_p99` (the raw advantages' tails, before the clip),
  `opd/teacher_s` (seconds the teacher took to score the rollout batch), `opd/teacher_tokens` (tokens it scored);
- when the sampler returns log-probs (kv, vLLM): `entropy/token_mean`, the mean −log-prob of the sampled policy
  tokens at the sampling temperature (a Monte Carlo estimate of the policy's per-token entropy);
- with `curriculum.enabled`: `curriculum/skipped` (tasks skipped while drawing this batch), `curriculum/forced`
  (drawn although settled: nothing else left), `curriculum/settled_share_plain_draw` (the share of settled tasks
  the unfiltered order would have drawn: the zero-spread share before the filter), `curriculum/zero_spread_share`
  (the share of this batch's groups whose correctness rewards are all equal: after the filter),
  `curriculum/known_tasks`, `curriculum/settled_all_pass`, `curriculum/settled_all_fail`, `curriculum/mean_rate`,
  `curriculum/skipped_total`;
- in a multi-turn mode: `multi_turn/*` (`training.scoring.multi_turn_metrics`: turns, the share truncated, the
  share that passed after more than one turn, the share of inserted tokens, tool calls and their success share, the
  mean shaping); `tokens_per_s` then counts policy tokens only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from config import Config, config_to_dict
from utils.jsonl import read_jsonl, write_jsonl_atomic


def metrics_row(metrics: dict) -> dict:
    """A metrics.jsonl row: floats rounded to 6 places, and a value that is not a finite number (a mean over
    nothing, an overflow) written as null, never as the bare NaN/Infinity that strict JSON readers refuse."""
    return {k: (round(v, 6) if math.isfinite(v) else None) if isinstance(v, float) else v for k, v in metrics.items()}


def wandb_init_kwargs(config: Config, output_dir: str | Path) -> dict[str, str]:
    """wandb.init's run name, and its entity when training.tracker_entity names one."""
    entity = config.training.tracker_entity
    return {"name": tracker_run_name(config, output_dir), **({"entity": entity} if entity else {})}


def tracker_run_name(config: Config, output_dir: str | Path) -> str:
    """training.run_name, or the output folder's name (one folder = one run)."""
    return config.training.run_name or Path(output_dir).resolve().name


def make_accelerator(config: Config, output_dir: str | Path, cpu: bool | None = None) -> Any:
    """The Accelerator a run uses, with training.logging_backends as its trackers (tensorboard files go to
    <output_dir>/tensorboard/<run name>/<tracker_project>) and training.ddp_timeout as its process group's
    timeout (torch's own default for NCCL is 10 minutes, less than the gap hf rollouts can open between ranks)."""
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    output_dir = Path(output_dir)
    project = ProjectConfiguration(
        project_dir=str(output_dir), logging_dir=str(output_dir / "tensorboard" / tracker_run_name(config, output_dir))
    )
    return Accelerator(
        cpu=not torch.cuda.is_available() if cpu is None else cpu,
        log_with=list(config.training.logging_backends) or None,
        project_config=project,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=config.training.ddp_timeout))],
    )


def reduce_over_processes(metrics: dict, accelerator: Any) -> dict:
    """Average numeric metrics over processes (each process saw different prompts).

    Ranks may report different keys (one whose groups were all filtered out has no GRPO loss),
    so the dicts are gathered as objects and each key is averaged over the ranks that have it.
    """
    if accelerator.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object

    everyone = gather_object([metrics])
    out = dict(metrics)
    for key in {k for m in everyone for k, v in m.items() if isinstance(v, (int, float))}:
        values = [float(m[key]) for m in everyone if isinstance(m.get(key), (int, float))]
        out[key] = sum(values) / len(values)
    out["step"] = metrics["step"]
    return out


class MetricSinks:
    """metrics.jsonl plus the Accelerator's trackers; used on the main process only."""

    def __init__(self, config: Config, output_dir: str | Path, accelerator: Any, progress: Any = None) -> None:
        self.config, self.output_dir, self.accelerator = config, Path(output_dir), accelerator
        self.metrics_path = self.output_dir / "metrics.jsonl"
        self._trackers: list = []
        self.progress = progress  # a training.rewards.RewardProgress (reward functions' trainer_state), or None

    def open(self, global_step: int) -> None:
        """Trim metrics.jsonl to `global_step` (a fresh run, step 0, starts a new file; a resumed one keeps its
        lines up to its step) and start the trackers."""
        if self.progress is not None:
            self.progress.global_step = global_step
        if self.metrics_path.exists():
            kept = (
                []
                if global_step == 0
                else [
                    row
                    for row in read_jsonl(self.metrics_path, tolerate_torn_tail=True)
                    if row.get("step", global_step + 1) <= global_step
                ]
            )
            write_jsonl_atomic(self.metrics_path, kept)
        if not self.accelerator.log_with:
            return
        flat = {
            f"{section}.{key}": value if isinstance(value, (int, float, str, bool)) else str(value)
            for section, values in config_to_dict(self.config).items()
            if isinstance(values, dict)
            for key, value in values.items()
        }
        self.accelerator.init_trackers(
            self.config.training.tracker_project,
            config=flat,
            init_kwargs={"wandb": wandb_init_kwargs(self.config, self.output_dir)},
        )
        self._trackers = list(self.accelerator.trackers)

    def write(self, metrics: dict) -> None:
        if self.progress is not None:
            self.progress.global_step = int(metrics.get("step", self.progress.global_step))
            self.progress.epoch = float(metrics.get("epoch", self.progress.epoch))
        with self.metrics_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(metrics_row(metrics), allow_nan=False) + "\n")
        if self._trackers:
            scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
            self.accelerator.log(scalars, step=metrics["step"])

    def close(self) -> None:
        if self._trackers:
            self.accelerator.end_training()
            self._trackers = []


def progress_loss(metrics: dict) -> str:
    """The progress bar's loss: `skipped` on a step without an update (its loss is not a number; `nan` would read as
    divergence), else the total loss to 3 decimals."""
    if metrics.get("update/skipped") == 1.0:
        return "skipped"
    return f"{metrics.get('loss/total', float('nan')):.3f}"
