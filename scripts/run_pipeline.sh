#!/usr/bin/env bash
# The pipeline on the embedded default: preflight, then each phase that exists.
# Phases not built yet are reported as such; nothing is faked.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
PRESET=${PRESET:-cpu}

echo "== Preflight (python test_all.py --preset $PRESET) =="
"$PYTHON" test_all.py --preset "$PRESET"

missing=()
for script in phase1_prepare_data.py phase2_generate_teacher_traces.py phase3_train_grpo.py phase4_evaluate.py; do
  if [ -f "$script" ]; then
    echo "== $script --preset $PRESET =="
    "$PYTHON" "$script" --preset "$PRESET"
  else
    missing+=("$script")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo
  echo "NOT RUN (not built yet): ${missing[*]}"
  echo "The pipeline is incomplete: only the preflight and the phases above ran."
fi
