#!/usr/bin/env bash
# A 15-minute GPU session's plan when the main job's pipelines cannot run one after another within it:
# two pipelines side by side on one GPU (a full-size Qwen 3.5 and Gemma 4 fit an H200 together), the
# GPU tests and the static-cache decode (whose compiling is CPU work) beside them, then the decode timed
# again alone once the pipelines end, on the compiled kernels the first run left in the inductor cache.
# Timings taken beside the pipelines share the GPU: upper bounds, not figures. Everything ends within
# $BUDGET_S seconds and is packed into $OUT/session.tgz (a call returns at most 8 files).
#
#   bash benchmarks/gpu/side_by_side.sh      (after carrying .whl/, as benchmarks/gpu/session.sh)
# AGREEMENT=0 leaves out the log-prob agreement of the full-size random models (sampler against teacher-forced).
# STATIC=0 leaves the static-cache decode out (its compile is CPU work that slows the pipelines beside it);
# RETRY_S reaches session.sh (a diverged SEPO is retried twice, side by side, within that many seconds).
# Rehearsal on a CPU: WHEELS=none SAVE_ARGS="--tiny --device cpu" BENCH_ARGS="--tiny --device cpu" bash benchmarks/gpu/side_by_side.sh
set -uo pipefail
OUT=${OUT:-gpu_session}
BUDGET_S=${BUDGET_S:-550}
DEADLINE=$((SECONDS + BUDGET_S))
export DEADLINE_EPOCH=$(($(date +%s) + BUDGET_S))  # where session.sh's retries must end
WORK=/tmp/side_by_side
mkdir -p "$WORK" "$OUT"
[ "${WHEELS:-}" = none ] || . benchmarks/gpu/wheels.sh install
export WHEELS=none  # installed once above; the session.sh runs below reuse it
left() { echo $((DEADLINE - SECONDS)); }
{ nvidia-smi; df -h /tmp; } >"$WORK/machine.txt" 2>&1

for pair in ${PIPELINES:-qwen:kuhn gemma4:ipd}; do
    OUT="$WORK/pipeline_${pair/:/_}" PIPELINES="$pair" PIPELINE_S="${PIPELINE_S:-440}" \
        bash benchmarks/gpu/session.sh pipeline &
done
OUT="$WORK/tests" bash benchmarks/gpu/session.sh tests
[ "${AGREEMENT:-1}" = 1 ] && OUT="$WORK/agreement" bash benchmarks/gpu/session.sh agreement
[ "${STATIC:-1}" = 1 ] && OUT="$WORK/static_beside" STATIC_S="${STATIC_S:-170}" bash benchmarks/gpu/session.sh static
wait
per_model=$(($(left) / 2 - 5))
if [ "${STATIC:-1}" = 1 ] && [ "$per_model" -gt 30 ]; then
    OUT="$WORK/static_alone" STATIC_S="$per_model" bash benchmarks/gpu/session.sh static
fi
nvidia-smi --query-gpu=memory.used --format=csv >>"$WORK/machine.txt" 2>&1
tar czf "$OUT/session.tgz" -C "$WORK" .

ls -la "$OUT"
