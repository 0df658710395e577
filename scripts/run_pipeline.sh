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
# OpenMP's threads spin while they wait for each other; when other jobs keep the cores busy, a spinning thread
# takes the time its partner needs (a 2-thread matmul loop at load 8: 2.75x the wall time, 5x the CPU time of
# passive waiting; no measurable difference on an idle machine). Every phase and the local teacher inherit this.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

# each step's header says how long the run has taken so far (bash's SECONDS: seconds since the script began, or
# since RUN_STARTED, the epoch second `make run` began, so that the total includes the install)
if [ -n "${RUN_STARTED:-}" ]; then SECONDS=$(($(date +%s) - RUN_STARTED)); fi
elapsed() { printf '%d min %02d s' $((SECONDS / 60)) $((SECONDS % 60)); }
step() { printf '\n== %s  [%s] ==\n' "$*" "$(elapsed)"; }

# The local teacher, once started, is stopped on every way out: SIGTERM, then SIGKILL after
# TEACHER_STOP_SECONDS (its server would otherwise finish every request it has queued first).
teacher_pid=""
stop_teacher() {
  [ -n "$teacher_pid" ] || return 0
  kill -TERM "$teacher_pid" 2>/dev/null || true
  for _ in $(seq 1 $((${TEACHER_STOP_SECONDS:-5} * 5))); do
    kill -0 "$teacher_pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$teacher_pid" 2>/dev/null || true
  wait "$teacher_pid" 2>/dev/null || true
  teacher_pid=""
}
# Ctrl-C reaches every foreground process; the background teacher ignores it, so it is stopped here.
trap 'stop_teacher' EXIT
trap 'trap - EXIT; stop_teacher; printf "\ninterrupted: make run stopped (rc 130)\n" >&2; exit 130' INT TERM

# Refuse before writing anything. One `make run` per clone: it holds an flock on data/.tgrpo-pipeline.lock (the
# kernel drops it when the run dies) while it rewrites data/ and outputs/, which an earlier run's summary reads.
mkdir -p data
exec 9>>data/.tgrpo-pipeline.lock
if ! flock -n 9; then
  echo "error: another make run is using this folder's data/ and outputs/ ($(cat data/.tgrpo-pipeline.lock));" \
    "wait for it to end (or stop it), or run from another clone." >&2
  exit 1
fi
: > data/.tgrpo-pipeline.lock
echo "pid $$, started $(date '+%Y-%m-%d %H:%M:%S')" >&9
# This run starts and stops its own teacher on $PORT: something answering there already is refused now.
if curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  echo "error: something already answers on port $PORT (another pipeline's teacher, or \`make teacher\`)." >&2
  echo "This run starts and stops its own teacher: stop that one, or pick another port: make run TEACHER_PORT=N" >&2
  exit 1
fi

if [ "${FRESH:-0}" = "1" ]; then
  step "FRESH=1: removing generated data/ files and outputs/"
  find data -mindepth 1 -maxdepth 1 ! -name embedded ! -name .tgrpo-pipeline.lock -exec rm -rf {} +
  rm -rf outputs
fi

step "Preflight (python test_all.py --preset $PRESET; the teacher is checked once phase 2 has started it)"
"$PYTHON" test_all.py --preset "$PRESET" --teacher skip --quiet data/preflight.log

step "Phase 1: data (python phase1_prepare_data.py --preset $PRESET)"
"$PYTHON" phase1_prepare_data.py --preset "$PRESET"

step "Phase 2: teacher traces (local teacher on port $PORT)"
if curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then  # taken since the start
  echo "error: something already answers on port $PORT (another pipeline's teacher, or \`make teacher\`)." >&2
  echo "This run starts and stops its own teacher: stop that one, or pick another port: make run TEACHER_PORT=N" >&2
  exit 1
fi
# 9>&-: the teacher does not hold the run's lock
"$PYTHON" -m scripts.serve_local_teacher --port "$PORT" > data/local_teacher.log 2>&1 9>&- &
teacher_pid=$!
for _ in $(seq 1 180); do
  curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$teacher_pid" 2>/dev/null || { echo "the local teacher died; see data/local_teacher.log" >&2; exit 1; }
  sleep 1
done
kill -0 "$teacher_pid" 2>/dev/null || { echo "the local teacher died; see data/local_teacher.log" >&2; exit 1; }
curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 \
  || { echo "error: the local teacher did not answer within 180 s; see data/local_teacher.log" >&2; exit 1; }
echo "the local teacher (pid $teacher_pid) answers at $TEACHER_URL; its log: data/local_teacher.log"
"$PYTHON" test_all.py --preset "$PRESET" --teacher_url "$TEACHER_URL" --teacher only --quiet data/preflight_teacher.log
# Requests in flight: the kv engine (what serve_local_teacher picks when the kv sampler implements the model; its
# /health says so) generates every request that waits as one batch, so all of phase 2's go at once; the fallback,
# `transformers serve`, generates one at a time, so one. Neither can cancel a request whose client gave up, so a
# retried timeout only queues the same work again: no retries, and a timeout of 30 s plus 2 s per token of
# max_tokens (0.5 tokens/s, ~20x below either engine's speed, so only a stuck server times out).
max_tokens=$("$PYTHON" -c "from config import build_config; print(build_config('$PRESET').teacher.max_tokens)")
in_flight=1
case "$(curl -sf -m 2 "http://127.0.0.1:$PORT/health" 2>/dev/null)" in
  *'"engine": "kv"'*) in_flight=32 ;;
esac
echo "the local teacher takes $in_flight request(s) at a time"
local_teacher=(--set "teacher.max_concurrent_requests=$in_flight" --set teacher.max_retries=0
  --set "teacher.request_timeout=$((30 + 2 * max_tokens))")
# exit code 3: some requests failed (kept as api_error rows; the next run retries them) - train on what came back
phase2_rc=0
"$PYTHON" phase2_generate_teacher_traces.py --preset "$PRESET" --api_url "$TEACHER_URL" "${local_teacher[@]}" \
  || phase2_rc=$?
teacher_died=""
if ! kill -0 "$teacher_pid" 2>/dev/null; then  # failed requests above were the teacher dying, not the network
  teacher_died="the local teacher this run started (pid $teacher_pid) died during phase 2; its log: data/local_teacher.log"
  echo "warning: $teacher_died" >&2
fi
[ "$phase2_rc" -eq 0 ] || [ "$phase2_rc" -eq 3 ] || exit "$phase2_rc"
stop_teacher

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

printf '\nResults: outputs/evaluation_results.json (per sample: outputs/eval_samples.jsonl);\n'
printf 'adapter: outputs/final_model; training metrics: outputs/metrics.jsonl, outputs/training_curves.png;\nplot of pass@k, adapter vs base: outputs/evaluation_pass_at_k.png\n\n'
# exit code 3 when a phase degraded (the teacher answered under half, no usable trace, a phase wrote nothing)
summary_rc=0
"$PYTHON" -m training.run_summary --data_dir data --output_dir outputs ${teacher_died:+--warn "$teacher_died"} \
  || summary_rc=$?
printf '\nmake run took %s\n' "$(elapsed)"
exit "$summary_rc"
