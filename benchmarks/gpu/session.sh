#!/usr/bin/env bash
# One GPU session's checks, in order of worth, each under its own time limit so that one hang
# cannot eat the session; everything it prints goes to $OUT (or ./gpu_session/ without one).
#
#   bash benchmarks/gpu/session.sh [parts...]     parts: bench tests pipeline static (default: the first three)
#
#   bench     python -m benchmarks gpu, one run per model -> $OUT/gpu-gemma4.json, gpu-qwen.json (Qwen 3.5's
#             Gated DeltaNet on PyTorch's path) and gpu-qwen-fla.json (decoding with flash-linear-attention)
#   static    the decode part again on a static KV cache, which generate compiles on a GPU (CUDA graphs), batch
#             128 -> $OUT/gpu-<model>-static.json (not in the default parts: compiling takes minutes)
#             (limit $STATIC_S seconds each, default 180)
#   graphs    decode steps replayed as CUDA graphs: benchmarks.gpu.graph_decode per model at batch 32/128/256 (Qwen
#             with the runs' five-pass Gated DeltaNet step, and again with transformers' own: qwen-reference)
#             -> $OUT/graph-decode-<model>.jsonl (eager static step, graph replay, one step's kernel profile; limit
#             $GRAPH_S, default 120), pytest -m gpu of both, then stage=eval on Kuhn at full
#             size for each model of $GRAPH_EVALS (default gemma4) as the runs decode now (dynamic cache) and with
#             model.static_cache=true model.decode_graphs=true, each under $EVAL_S seconds (default 120)
#             -> $OUT/eval_<model>_<arm>.json
#   tests     pytest -m gpu tests/test_gpu.py
#   agreement whether each full-size random model's sampler and teacher-forced pass agree on the sampled tokens'
#             log-probs (Gemma 4 raw and tempered) -> $OUT/logprob_agreement.jsonl (limit $AGREEMENT_S, default 150;
#             AGREEMENT_ARGS reach it, e.g. "--shape narrow --device cpu" for a rehearsal)
#   sepo      stage=sepo alone from the saved random checkpoint of each model:game of $PIPELINES, side by side
#             (limit $SEPO_S seconds, default 240)
#   pipeline  the main job's every stage through main.py at full size, random weights saved once as a
#             local checkpoint with the tiny tokenizer: datagen, Base eval, SFT (a few steps), SFT
#             eval, SEPO (2 steps, n = 4, the three pools), SEPO eval (2 episodes per opponent), for
#             each model:game of $PIPELINES, in order, each under $PIPELINE_S seconds (default: qwen:kuhn
#             gemma4:ipd qwen:ipd gemma4:kuhn, 400 s: the phases measured on an H100 add up to 6-7 min for one) -> $OUT/results_<model>_<game>.csv
#             A pipeline whose SEPO diverged is followed, with RETRY_S set (seconds), by two stage=sepo runs from
#             its SFT model side by side: eager attention, and SDPA under torch's anomaly mode (retry_sepo).
#   The log of everything: $OUT/session.log. More settings: BENCH_ARGS (e.g. "--override sepo.micro_batch=8")
#   reaches every benchmark run, RUN_ARGS (e.g. "sepo.micro_batch=4") every main.py run.
#
# Needs: the wheels of benchmarks/gpu/wheels.sh in .whl/ (carried), a CUDA build of torch.
# Rehearsal on a CPU: WHEELS=none SAVE_ARGS="--tiny --device cpu" bash benchmarks/gpu/session.sh pipeline
set -uo pipefail
OUT=${OUT:-gpu_session}
mkdir -p "$OUT"
LOG="$OUT/session.log"
PARTS=("${@:-bench tests pipeline}")
PARTS=(${PARTS[*]})
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

say() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
step() {  # step SECONDS NAME command...: run under a time limit, log its output and exit status
    local limit=$1 name=$2
    shift 2
    say "start $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    say "end $name: rc $? after $((SECONDS - t0))s"
}
has() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }

[ "${WHEELS:-}" = none ] || . benchmarks/gpu/wheels.sh install
say "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo no GPU)"
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)' >>"$LOG" 2>&1

json_run() {  # json_run SECONDS NAME MODULE args...: one `python -m MODULE` run, its output in $OUT/NAME
    local limit=$1 name=$2
    shift 2
    say "start $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" python3 -m "$@" >"$OUT/$name" 2>>"$LOG"
    say "end $name: rc $? after $((SECONDS - t0))s"
}
bench() {  # bench SECONDS NAME args...: one `python -m benchmarks gpu` run, its JSON in $OUT/NAME.json
    local limit=$1 name=$2
    shift 2
    json_run "$limit" "$name.json" benchmarks gpu "$@"
}
SIZES=(--decode-steps "${DECODE_STEPS:-32}" --sft-steps "${SFT_STEPS:-3}" ${BENCH_ARGS:-})
CKPT=/tmp/sepo_ckpt
pipeline() {  # pipeline SECONDS MODEL GAME: the main job's every stage, small, on the saved random checkpoint
    local limit=$1 model=$2 game=$3
    [ -d "$CKPT/$model" ] || step 90 "save $model" python3 -m benchmarks gpu --model "$model" --save-to "$CKPT" ${SAVE_ARGS:-}
    step "$limit" "pipeline $model $game" python3 main.py stage=pipeline "game=$game" "model=$model" \
        "model.path=$CKPT/$model" logger=none "datagen.datasets=[$( [ "$game" = kuhn ] && echo kuhn || echo multi )]" \
        datagen.episodes_per_opponent=4 \
        sft.max_steps=3 sft.max_examples=64 sft.max_valid_examples=16 sft.agreement_examples=16 \
        sft.agreement_max_new_tokens=32 sepo.steps=2 sepo.rollouts_per_opponent=4 "sepo.checkpoint_steps=[]" \
        sepo.max_new_tokens=32 eval.episodes_per_opponent=2 eval.max_new_tokens=32 eval.action_samples=16 \
        eval.progress=false "hydra.run.dir=/tmp/sepo_runs/${model}_$game" paths.cache_dir=/tmp/sepo_cache ${RUN_ARGS:-}
    cp "/tmp/sepo_runs/${model}_$game/tables/results.csv" "$OUT/results_${model}_$game.csv" 2>/dev/null
    [ -n "${RETRY_S:-}" ] && grep -qs diverged "/tmp/sepo_runs/${model}_$game/FAILED" && retry_sepo "$model" "$game"
}
SEPO_SIZES=(logger=none sepo.steps=2 sepo.rollouts_per_opponent=4 "sepo.checkpoint_steps=[]" sepo.max_new_tokens=32
    eval.episodes_per_opponent=2 eval.max_new_tokens=32 eval.action_samples=16 eval.progress=false paths.cache_dir=/tmp/sepo_cache)
retry_sepo() {  # retry_sepo MODEL GAME: after SEPO diverged, two runs of stage=sepo from the pipeline's SFT model, side
    # by side within $RETRY_S seconds: one with eager attention (does the SDPA kernel's backward make the NaN?), one
    # on SDPA with torch's anomaly mode (which operation makes it, and where in the forward pass)
    local model=$1 game=$2 merged="/tmp/sepo_runs/${model}_$game/sft/merged" limit=$RETRY_S
    [ -n "${DEADLINE_EPOCH:-}" ] && limit=$((DEADLINE_EPOCH - $(date +%s) - 15 < limit ? DEADLINE_EPOCH - $(date +%s) - 15 : limit))
    [ -d "$merged" ] && [ "$limit" -gt 30 ] || return
    step "$limit" "sepo $model $game eager attention" env OMP_NUM_THREADS="${RETRY_THREADS:-4}" python3 main.py stage=sepo "game=$game" "model=$model" \
        "model.path=$merged" model.attn_implementation=eager "${SEPO_SIZES[@]}" \
        "hydra.run.dir=/tmp/sepo_runs/${model}_${game}_eager" ${RUN_ARGS:-} &
    step "$limit" "sepo $model $game anomaly mode" env OMP_NUM_THREADS="${RETRY_THREADS:-4}" python3 main.py stage=sepo "game=$game" "model=$model" \
        "model.path=$merged" sepo.debug_detect_anomaly=true "${SEPO_SIZES[@]}" \
        "hydra.run.dir=/tmp/sepo_runs/${model}_${game}_anomaly" ${RUN_ARGS:-}
    wait
}

# in order of worth: the GPU tests (a minute), each model's figures, the main job through main.py (a run cut
# by its limit is marked FAILED; the same command on the still-warm machine resumes it), the fast-kernel decode
has tests && step 90 "pytest -m gpu" python3 -m pytest -q -n 0 -m gpu tests/test_gpu.py -p no:cacheprovider
has agreement && json_run "${AGREEMENT_S:-150}" logprob_agreement.jsonl benchmarks.gpu.logprob_agreement ${AGREEMENT_ARGS:-}
if has graphs; then  # CUDA-graph decoding: the step alone, the tests, then through main.py
    for model in gemma4 qwen qwen-reference; do  # qwen-reference: transformers' own Gated DeltaNet step
        json_run "${GRAPH_S:-120}" "graph-decode-$model.jsonl" benchmarks.gpu.graph_decode --model "${model%-reference}" \
            $([ "$model" = qwen-reference ] && echo --reference-delta-rule) --batch ${GRAPH_BATCHES:-32 128 256} ${GRAPH_ARGS:-}
    done
    step 120 "pytest -m gpu graphs" python3 -m pytest -q -n 0 -m gpu tests/test_graph_decoding.py \
        tests/test_gated_delta_decode.py -p no:cacheprovider
    for model in ${GRAPH_EVALS:-gemma4}; do
        [ -d "$CKPT/$model" ] || step 90 "save $model" python3 -m benchmarks gpu --model "$model" --save-to "$CKPT" ${SAVE_ARGS:-}
        for arm in dynamic graphs; do
            extra=(); [ "$arm" = graphs ] && extra=(model.static_cache=true model.decode_graphs=true)
            step "${EVAL_S:-120}" "eval $model kuhn $arm" python3 main.py stage=eval game=kuhn "model=$model" \
                "model.path=$CKPT/$model" logger=none eval.episodes_per_opponent=2 eval.max_new_tokens=32 \
                eval.action_samples=16 eval.progress=false "hydra.run.dir=/tmp/sepo_runs/eval_${model}_$arm" \
                paths.cache_dir=/tmp/sepo_cache "${extra[@]}" ${RUN_ARGS:-}
            cp "/tmp/sepo_runs/eval_${model}_$arm/results.json" "$OUT/eval_${model}_$arm.json" 2>/dev/null
        done
    done
fi
has bench && bench 150 gpu-gemma4 --model gemma4 "${SIZES[@]}"
has bench && bench 130 gpu-qwen --model qwen "${SIZES[@]}"
if has sepo; then  # stage=sepo alone on the saved random checkpoints, side by side (no SFT before it)
    for pair in ${PIPELINES:-qwen:kuhn gemma4:ipd}; do
        model=${pair%%:*} game=${pair##*:}
        [ -d "$CKPT/$model" ] || step 90 "save $model" python3 -m benchmarks gpu --model "$model" --save-to "$CKPT" ${SAVE_ARGS:-}
        step "${SEPO_S:-240}" "sepo $model $game" python3 main.py stage=sepo "game=$game" "model=$model" \
            "model.path=$CKPT/$model" "${SEPO_SIZES[@]}" "hydra.run.dir=/tmp/sepo_runs/${model}_${game}_sepo" ${RUN_ARGS:-} &
    done
    wait
fi
if has pipeline; then
    for pair in ${PIPELINES:-qwen:kuhn gemma4:ipd qwen:ipd gemma4:kuhn}; do
        pipeline "${PIPELINE_S:-400}" "${pair%%:*}" "${pair##*:}"
    done
fi
has bench && PYTHONPATH="/tmp/site-fla:$PYTHONPATH" bench 60 gpu-qwen-fla --model qwen --parts decode "${SIZES[@]}"
for model in gemma4 qwen; do  # the decode on a static cache, which generate compiles (CUDA graphs), at batch 128
    has static && bench "${STATIC_S:-180}" "gpu-$model-static" --model "$model" --parts decode --decode-cache static --batch-sizes 128 "${SIZES[@]}"
done
say "session done"
