#!/bin/bash
# Phase 4's sampling cost on the real-data experiment's evaluation sets, measured as CPU seconds per sample so the
# figure holds on a shared machine: the base model, 16 problems x 4 samples at T 0.7, <= 256 new tokens, on MBPP
# test and HumanEval with the kv sampler, on the fixture held-out tasks at the fixture rerun's first budget (the
# calibration leg), and on MBPP test and HumanEval with vLLM's CPU engine (VLLM=1; needs .venv-vllm). One line per leg in
# $OUT/throughput.txt: name, exit code, wall s, user s, system s (the process and its reaped children), load.
#   bash experiments/real_data/throughput.sh            # from the repository root
set -u
OUT=${OUT:-outputs/real_data_throughput}
MBPP=${MBPP:-../shared/data/mbpp.jsonl}
mkdir -p "$OUT"
leg() {  # name, python, then phase 4 flags; ENVV: extra environment
  local name=$1 py=$2; shift 2
  /usr/bin/time -f "%e %U %S" -o "$OUT/$name.time" nice -n 10 env "${ENVV[@]}" "$py" phase4_evaluate.py --preset cpu \
    --model_path embedded:SmolLM2-135M-Instruct --num_samples 4 --k 1 --temperature 0.7 --set evaluation.top_p=1.0 \
    --output_dir "$OUT/$name" --output "$OUT/$name/result.json" --samples_output "$OUT/$name/samples.jsonl" \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc $? time $(tail -1 "$OUT/$name.time") load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/throughput.txt"
}
ENVV=(OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE)  # one thread, no spinning: CPU seconds = work
.venv/bin/python phase1_prepare_data.py --preset cpu --val_ratio 0.5 --seed 42 --output_dir "$OUT/fixtures" > /dev/null
head -16 "$OUT/fixtures/val.jsonl" > "$OUT/fixtures/val16.jsonl"
leg fixture_kv .venv/bin/python --eval_file "$OUT/fixtures/val16.jsonl" --max_new_tokens 256 --set training.seed=1
leg mbpp_kv .venv/bin/python --eval_set mbpp_test --mbpp_path "$MBPP" --max_tasks 16 --max_new_tokens 256
leg humaneval_kv .venv/bin/python --eval_set humaneval --max_tasks 16 --max_new_tokens 256
if [ "${VLLM:-0}" = 1 ]; then
  ENVV=(OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_CI_ENV=1
        HF_HUB_OFFLINE=1)
  leg mbpp_vllm .venv-vllm/bin/python --eval_set mbpp_test --mbpp_path "$MBPP" --max_tasks 16 --max_new_tokens 256 \
    --set evaluation.backend=vllm
  leg humaneval_vllm .venv-vllm/bin/python --eval_set humaneval --max_tasks 16 --max_new_tokens 256 \
    --set evaluation.backend=vllm
fi
