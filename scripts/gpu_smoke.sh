#!/usr/bin/env bash
# GPU smoke test of the vLLM path, in one command, on a machine with 1 or 2 CUDA GPUs and
# requirements-gpu.txt installed:   bash scripts/gpu_smoke.sh [MODEL]   (default Qwen/Qwen3-0.6B)
# NOT RUN in this project's CI (no GPU there): the vLLM path is otherwise covered only by fakes and
# contract tests (tests/test_vllm_path.py, tests/test_vllm_ddp.py, tests/test_vllm_contract.py).
#
# It trains 3 steps with grpo.rollout_backend=vllm (on every visible GPU, one process each), evaluates
# the result and the base model with vLLM (--baseline), and checks:
#   - each training process's engine is on its own GPU (cuda:LOCAL_RANK),
#   - |logp_vllm - logp_train| stays small (rollout/logp_abs_diff < 0.05 nats per token),
#   - at most one adapter folder is left in outputs/.vllm_adapters,
#   - the trained and baseline evaluations sampled different completions,
#   - a 2-step tool-mode run (multi-turn rollouts continued on the same engine) logs its multi_turn/*
#     metrics and keeps |logp_vllm - logp_train| small on the policy's tokens (inserted results masked).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-Qwen/Qwen3-0.6B}
PY=${PYTHON:-python}
OUT=${OUT:-outputs/gpu_smoke}
GPUS=$($PY -c "import torch; print(min(torch.cuda.device_count(), 2))")
[ "$GPUS" -ge 1 ] || { echo "gpu_smoke: no CUDA GPU visible" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
$PY phase1_prepare_data.py --preset cpu --set paths.data_dir="$OUT/data" >/dev/null
COMMON=(--preset gpu --set student.model_name="$MODEL" --set paths.data_dir="$OUT/data" --set paths.output_dir="$OUT"
        --set grpo.rollout_backend=vllm --set grpo.max_new_tokens=256 --set lora.r=16 --set lora.lora_alpha=32
        --set training.per_device_train_batch_size=2 --set training.gradient_accumulation_steps=1
        --set dual_source.teacher_sft_weight=0 --set training.save_steps=0)
if [ "$GPUS" -gt 1 ]; then
  LAUNCH=(accelerate launch --multi_gpu --num_processes "$GPUS" --mixed_precision no --dynamo_backend no)
else
  LAUNCH=($PY)
fi
"${LAUNCH[@]}" phase3_train_grpo.py "${COMMON[@]}" --max_steps 3 2>&1 | tee "$OUT/train.log"
$PY phase4_evaluate.py "${COMMON[@]}" --model_path "$OUT/final_model" --baseline --max_tasks 8 --num_samples 4 \
    --k 1 2 4 --max_new_tokens 256 2>&1 | tee "$OUT/eval.log"
"${LAUNCH[@]}" phase3_train_grpo.py "${COMMON[@]}" --set paths.output_dir="$OUT/tool" --mode tool --max_steps 2 \
    2>&1 | tee "$OUT/train_tool.log"
$PY - "$OUT" "$GPUS" <<'PYEOF'
import json, re, sys
from pathlib import Path
out, gpus = Path(sys.argv[1]), int(sys.argv[2])
log = (out / "train.log").read_text()
engines = {int(r): int(d) for r, _, d in re.findall(r"vLLM engine: rank (\d+) \(local (\d+)\) on cuda:(\d+)", log)}
assert len(engines) == gpus and all(r == d for r, d in engines.items()), f"engine devices: {engines}"
rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
diffs = [r["rollout/logp_abs_diff"] for r in rows]
assert diffs and max(diffs) < 0.05, f"|logp_vllm - logp_train| per step: {diffs}"
folders = list((out / ".vllm_adapters").iterdir())
assert len(folders) <= 1, f"adapter folders left: {folders}"
samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
by_role = {role: [s["completion"] for s in samples if s["model"] == role] for role in ("trained", "baseline")}
assert by_role["trained"] and by_role["trained"] != by_role["baseline"], "trained and baseline completions are identical"
tool = [json.loads(line) for line in (out / "tool" / "metrics.jsonl").read_text().splitlines()]
assert tool and all(r["multi_turn/turns_mean"] >= 1 for r in tool), "tool-mode run logged no multi-turn metrics"
tool_diffs = [r["rollout/logp_abs_diff"] for r in tool]
assert max(tool_diffs) < 0.05, f"tool mode |logp_vllm - logp_train| per step: {tool_diffs}"
print(f"gpu_smoke: OK ({gpus} GPU(s); engines {engines}; logp diff per step {[round(d, 4) for d in diffs]})")
PYEOF
