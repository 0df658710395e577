#!/usr/bin/env bash
# The whole pipeline on the embedded default: preflight, phase 1, the local teacher + phase 2,
# phase 3, phase 4 with the baseline. Each phase resumes what an earlier run left (phase 2 skips
# existing traces, phase 4 reuses cached completions); `make run FRESH=1` starts clean.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
PRESET=${PRESET:-cpu}
PORT=${TEACHER_PORT:-8129}
TEACHER_URL="http://127.0.0.1:$PORT/v1"

step() { printf '\n== %s ==\n' "$*"; }

if [ "${FRESH:-0}" = "1" ]; then
  step "FRESH=1: removing generated data/ files and outputs/"
  find data -mindepth 1 -maxdepth 1 ! -name embedded -exec rm -rf {} +
  rm -rf outputs
fi

step "Preflight (python test_all.py --preset $PRESET)"
"$PYTHON" test_all.py --preset "$PRESET" --teacher_url "$TEACHER_URL"

step "Phase 1: data (python phase1_prepare_data.py --preset $PRESET)"
"$PYTHON" phase1_prepare_data.py --preset "$PRESET"

step "Phase 2: teacher traces (local teacher on port $PORT)"
teacher_pid=""
if ! curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  "$PYTHON" scripts/serve_local_teacher.py --port "$PORT" > data/local_teacher.log 2>&1 &
  teacher_pid=$!
  trap '[ -n "$teacher_pid" ] && kill "$teacher_pid" 2>/dev/null || true' EXIT
  for _ in $(seq 1 180); do
    curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 "$teacher_pid" 2>/dev/null || { echo "the local teacher died; see data/local_teacher.log"; exit 1; }
    sleep 1
  done
fi
# exit code 3: some requests failed (kept as api_error rows; the next run retries them) - train on what came back
"$PYTHON" phase2_generate_teacher_traces.py --preset "$PRESET" --api_url "$TEACHER_URL" || [ $? -eq 3 ]
if [ -n "$teacher_pid" ]; then kill "$teacher_pid" 2>/dev/null || true; wait "$teacher_pid" 2>/dev/null || true; teacher_pid=""; fi

step "Phase 3: GRPO + teacher-SFT + self-SFT (python phase3_train_grpo.py --preset $PRESET)"
if [ -f outputs/final_model/adapter_config.json ]; then
  echo "outputs/final_model exists: training skipped (make run FRESH=1 retrains)"
elif ls -d outputs/checkpoint-* >/dev/null 2>&1; then
  "$PYTHON" phase3_train_grpo.py --preset "$PRESET" --resume_from_checkpoint latest
else
  "$PYTHON" phase3_train_grpo.py --preset "$PRESET"
fi

step "Phase 4: pass@k of the trained adapter and of the base model (--baseline)"
"$PYTHON" phase4_evaluate.py --preset "$PRESET" --baseline

printf '\nDone. Results: outputs/evaluation_results.json (per sample: outputs/eval_samples.jsonl);\n'
printf 'adapter: outputs/final_model; training metrics: outputs/metrics.jsonl, outputs/training_curves.png\n'
