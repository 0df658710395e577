#!/usr/bin/env bash
# The pipeline on the embedded default: preflight, phase 1, the local teacher + phase 2, then the
# phases that exist. Phases not built yet are reported as such; nothing is faked.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
PRESET=${PRESET:-cpu}
PORT=${TEACHER_PORT:-8129}
TEACHER_URL="http://127.0.0.1:$PORT/v1"

step() { printf '\n== %s ==\n' "$*"; }

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
"$PYTHON" phase2_generate_teacher_traces.py --preset "$PRESET" --api_url "$TEACHER_URL"
if [ -n "$teacher_pid" ]; then kill "$teacher_pid" 2>/dev/null || true; wait "$teacher_pid" 2>/dev/null || true; teacher_pid=""; fi

missing=()
for script in phase3_train_grpo.py phase4_evaluate.py; do
  if [ -f "$script" ]; then
    step "$script --preset $PRESET"
    "$PYTHON" "$script" --preset "$PRESET"
  else
    missing+=("$script")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo
  echo "NOT RUN (not built yet): ${missing[*]}"
  echo "The pipeline is incomplete: preflight, phase 1 and phase 2 ran; outputs are in data/."
fi
