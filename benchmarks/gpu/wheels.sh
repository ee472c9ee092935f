#!/usr/bin/env bash
# The project's dependencies for a GPU machine that has CUDA torch but nothing can be fetched on
# (the workplace's `device` machines: torch 2.11 + CUDA, transformers 5.17, peft, accelerate,
# huggingface_hub 1.33, tokenizers 0.23, safetensors, pandas, rich, tqdm already there).
#
#   here:  bash benchmarks/gpu/wheels.sh download   # wheels into .whl/ (ignored by git), ~57 MB
#   there: . benchmarks/gpu/wheels.sh install       # installs them into /tmp/site and exports PYTHONPATH
#
# flash-linear-attention goes to its own folder, /tmp/site-fla, on PYTHONPATH only while FLA=1 is
# exported when installing: fla 0.6 refuses the backward pass of Qwen 3.5's Gated DeltaNet on Hopper
# GPUs with Triton < 3.7.1 (the image's torch 2.11 brings Triton 3.6), so training there runs
# transformers' PyTorch path, and decoding can be measured with the fast kernels separately.
#
# What travels and why: transformers at this checkout's version (the version the CPU tests run;
# 5.17 lacks fixes the Gemma 4 and Qwen 3.5 paths rely on), peft at the same version, Hydra and its
# config library (not in the image), bitsandbytes for the 4-bit reference (sepo.ref_4bit), and
# flash-linear-attention, the fast Gated DeltaNet kernels of Qwen 3.5. antlr4-python3-runtime 4.9.3
# (Hydra's parser) is published as a source archive only, so it is built into a wheel here.
set -uo pipefail
WHEELS=.whl
PY_VERSION=3.12
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
PACKAGES=(
    transformers==5.24.0
    peft==0.21.2
    hydra-core==1.3.8
    omegaconf==2.3.1
    bitsandbytes==0.50.2
    fla-core==0.6.0
    flash-linear-attention==0.6.0
)

download() {
    mkdir -p "$WHEELS"
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    local platform_args=()
    for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
        "${platform_args[@]}" -d "$WHEELS" "${PACKAGES[@]}"
    python3 -m pip wheel -q --no-deps -w "$WHEELS" antlr4-python3-runtime==4.9.3
    du -ch "$WHEELS"/*.whl | tail -1
}

install() {
    local fla=("$WHEELS"/fla_core-*.whl "$WHEELS"/flash_linear_attention-*.whl)
    local rest=()
    for w in "$WHEELS"/*.whl; do [[ " ${fla[*]} " == *" $w "* ]] || rest+=("$w"); done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${rest[@]}"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-fla "${fla[@]}"
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ "${FLA:-0}" = 1 ]; then export PYTHONPATH="/tmp/site-fla:$PYTHONPATH"; fi
}

"${1:?usage: benchmarks/gpu/wheels.sh download|install}"
set +e  # sourced: leave the caller's shell as it was
