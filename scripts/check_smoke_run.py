"""The checks of `scripts/gpu_smoke.sh` on the folder its legs wrote; exit 0 when every check holds.

    python scripts/check_smoke_run.py OUT GPUS TOLERANCE

Each check reads the run's own records and fails only when the pipeline did something wrong, never because the
model was unlucky:

- with 2 GPUs, each training process's engine sat on its own GPU (cuda:LOCAL_RANK, from train.log);
- |logp_vllm - logp_train| of the sampled tokens stayed below TOLERANCE every step (single, tool, and the
  sleep-mode leg when OUT/sleep exists: the second wake-up follows an update);
- at most one adapter folder is left in .vllm_adapters;
- training moved the adapter (some lora_B entry of final_model is non-zero: B starts at 0) *when some step had a
  gradient* (grad_norm > 0). A correct run can have none: no group with reward spread and no passing sample for
  self-SFT leave every term's gradient at 0 at B = 0, and AdamW then leaves B exactly 0;
- phase 4 scored both roles on the same tasks;
- tool mode: multi-turn metrics were logged and, when the policy called a tool in some step, inserted tokens were
  present and masked (multi_turn/environment_token_share > 0). Whether any tool ran is printed, since a small
  model may never call one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def largest_lora_b(adapter: Path) -> float:
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as handle:
        return max(float(handle.get_tensor(k).abs().max()) for k in handle.keys() if "lora_B" in k)  # noqa: SIM118 - no __iter__


def logp_failures(rows: list[dict], tolerance: float, leg: str) -> list[str]:
    diffs = [r["rollout/logp_abs_diff"] for r in rows]
    if not diffs or max(diffs) >= tolerance:
        return [f"{leg}: |logp_vllm - logp_train| per step {diffs} (tolerance {tolerance})"]
    return []


def adapter_failures(rows: list[dict], moved: float) -> list[str]:
    """A step with a gradient must move lora_B off 0; without any gradient there is nothing to require."""
    if any(r.get("grad_norm", 0.0) > 0 for r in rows) and moved == 0:
        return [
            "training had a gradient (grad_norm > 0) but left every lora_B at 0: the update did not reach the adapter"
        ]
    return []


def tool_failures(rows: list[dict], tolerance: float) -> list[str]:
    if not rows or any("multi_turn/turns_mean" not in r for r in rows):
        return ["tool mode: no multi_turn/* metrics were logged"]
    failures = logp_failures(rows, tolerance, "tool mode")
    called = [r for r in rows if r.get("multi_turn/tool_calls_mean", 0) > 0]
    if called and not any(r.get("multi_turn/environment_token_share", 0) > 0 for r in called):
        failures.append("tool mode: the policy called tools but no inserted (environment) token was in any batch")
    return failures


def engine_failures(log: str, gpus: int) -> tuple[list[str], dict[int, int]]:
    engines = {int(r): int(d) for r, _, d in re.findall(r"vLLM engine: rank (\d+) \(local (\d+)\) on cuda:(\d+)", log)}
    if gpus > 1 and not (len(engines) == gpus and all(r == d for r, d in engines.items())):
        return [f"engine devices: {engines}"], engines
    return [], engines


def check(out: Path, gpus: int, tolerance: float) -> list[str]:
    """Every failed check's message (empty: all hold); prints one summary line."""
    rows = read_rows(out / "metrics.jsonl")
    failures, engines = engine_failures((out / "train.log").read_text(), gpus)
    failures += logp_failures(rows, tolerance, "single-turn")
    folders = list((out / ".vllm_adapters").iterdir()) if (out / ".vllm_adapters").is_dir() else []
    if len(folders) > 1:
        failures.append(f"adapter folders left: {folders}")
    moved = largest_lora_b(out / "final_model")
    failures += adapter_failures(rows, moved)
    samples = read_rows(out / "eval_samples.jsonl")
    tasks = {role: {s["task_id"] for s in samples if s["model"] == role} for role in ("trained", "baseline")}
    if not tasks["trained"] or tasks["trained"] != tasks["baseline"]:
        failures.append(f"phase 4 roles scored different tasks: {tasks}")
    tool = read_rows(out / "tool" / "metrics.jsonl")
    failures += tool_failures(tool, tolerance)
    sleep = read_rows(out / "sleep" / "metrics.jsonl") if (out / "sleep").is_dir() else None
    if sleep is not None:
        failures += logp_failures(sleep, tolerance, "sleep mode")
        if len(sleep) < 2:
            failures.append(f"sleep mode: {len(sleep)} step(s) logged; 2 are needed for a wake-up after an update")
    gradient = any(r.get("grad_norm", 0.0) > 0 for r in rows)
    tools = sum(r.get("multi_turn/tool_calls_mean", 0) for r in tool)
    print(
        f"gpu_smoke: {'FAIL' if failures else 'OK'} ({gpus} GPU(s); engines {engines or 'n/a (under 2 GPUs)'}; "
        f"logp diff per step {[round(r['rollout/logp_abs_diff'], 5) for r in rows]}; max |lora_B| {moved:.2e}"
        f"{'' if gradient else ' (no step had a gradient: the adapter check did not apply)'}; tool calls per "
        f"sample summed over steps {tools:.2f}{'' if tools else ' (masking of inserted results not exercised)'}; "
        f"sleep-mode leg {'run' if sleep is not None else 'not run'})"
    )
    for failure in failures:
        print(f"gpu_smoke: FAIL: {failure}")
    return failures


if __name__ == "__main__":
    sys.exit(1 if check(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])) else 0)
