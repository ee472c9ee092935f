"""GPU benchmark of the paper's two architectures at full size (`python -m benchmarks gpu`).

No checkpoint can be downloaded where this runs, and speed does not depend on what the weights
are, so the real classes (`Gemma4ForConditionalGeneration`, `Qwen3_5ForCausalLM`) are built from
their config classes at the published sizes with random weights, in bfloat16, directly on the
GPU. A tokenizer is needed only by the SEPO step (LMPolicy renders chat prompts): the project's
tiny tokenizer, built offline, serves; its ids (< 2,048) are valid rows of either real embedding.

What it reports, per model, and why:

- decode steps/s at batch 32, 128 and 256 after a ~600-token random prompt, timed through
  `generate` (what the arena calls): a decode step has to read every weight it uses once, so
  `weight bytes / bandwidth` is a floor on its time and `floor / measured` says how much of the
  memory system a step uses. The bandwidth is measured in the same run by a device-to-device
  copy (bytes read + written / time), so the fraction does not depend on a datasheet figure.
  Weight bytes are what one step reads: the language model's matrices and the output head, not
  the input embedding tables (a step gathers B rows of them) nor the vision and audio towers. The
  KV / recurrent cache read at large batch is reported beside it (`cache_mib`, at the end of the
  generation), since at batch 256 it can rival the weights.
- one SEPO step (rollout batch, reference log-probs, optimizer step) through the project's own
  code (`sepo.training.rollouts.BatchBuilder`, `sepo.training.passes.reference_logprobs`, `sepo.stages.sepo_loop.update`), with
  its time and peak memory, once with the reference = adapter disabled (the project's default)
  and once with a 4-bit (bitsandbytes NF4) reference (`sepo.ref_4bit`, `sepo.models.quantized_reference`:
  the linear layers quantized, everything else (embeddings, norms: frozen under LoRA) shared with
  the policy), so the comparison shows the cost or saving of the quantized copy itself.
- SFT tokens/s: forward + backward + AdamW step of the SFT stage's LoRA (rank, targets, gradient
  checkpointing, batch size from `conf/sft`) on random sequences of `sft.max_length` tokens, with
  transformers' own loss over every position (an upper bound on the stage's cost: the stage takes
  vocabulary logits on the answer tokens only).
- which code path Qwen 3.5's Gated DeltaNet layers use: transformers binds the fast kernels of
  `flash-linear-attention` (`fla`) and `causal-conv1d` at import time when they are installed and
  otherwise falls back, with a single easily missed warning, to reference PyTorch code that is
  many times slower; a speed figure means nothing without knowing which one ran.

Gemma 4 is built at the E4B shape (`--gemma4-preset e4b`, the published text config of
google/gemma-4-E4B-it: 42 layers, hidden 2560, KV shared over the last 18 layers, per-layer
embeddings), with transformers' default vision and audio towers, or at transformers' default
`Gemma4TextConfig()` (`--gemma4-preset default`); Qwen 3.5 at the published shape of
Qwen/Qwen3.5-4B.

`--save-to DIR` measures nothing: it saves each model as a random-weight checkpoint (the dressed tiny
tokenizer beside it) in DIR/<model>, so every stage of `main.py` can run at full size where nothing can
be downloaded (benchmarks/gpu/session.sh does so).

`--tiny` (hidden) runs the whole flow on tiny random models of both architectures, and with
`--device cpu` in float32 on a CPU, so the code path is exercised where there is no GPU (the
tests do both: tests/test_gpu.py).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sepo.run.compose import compose_config

log = logging.getLogger(__name__)

HELP = (
    "full-size Gemma 4 / Qwen 3.5 on CUDA: decode speed vs the bandwidth floor, SEPO step time and memory, SFT tokens/s"
)

MIB = 2**20

#: text_config of google/gemma-4-E4B-it as published (the checkpoint's config.json as third-party loaders
#: reproduce it; the same figures in NVIDIA Megatron-Bridge's E4B recipe and gemma.cpp's E4B config).
GEMMA4_E4B_TEXT: dict[str, Any] = {
    "vocab_size": 262_144,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size": 2560,
    "hidden_size_per_layer_input": 256,
    "intermediate_size": 10_240,
    "num_hidden_layers": 42,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_kv_shared_layers": 18,
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 131_072,
    "use_double_wide_mlp": False,
    "attention_k_eq_v": False,
    "enable_moe_block": False,
    "tie_word_embeddings": True,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 7,
}

#: text_config of Qwen/Qwen3.5-4B (hybrid: every 4th layer softmax attention, the others Gated DeltaNet), as
#: third-party loaders reproduce its config.json; the rope base is the family's (speed does not depend on it).
QWEN35_4B_TEXT: dict[str, Any] = {
    "vocab_size": 248_320,
    "hidden_size": 2560,
    "intermediate_size": 9216,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "tie_word_embeddings": True,
    "max_position_embeddings": 262_144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
}

ARCHS = ("gemma4", "qwen")
#: Gemma 4's chat format: <|turn>role ... <turn|>, the assistant is "model", thinking via <|think|>.
GEMMA4_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|turn>system\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<|think|>\\n' -}}{%- endif -%}"
    "{{- messages[0]['content'] | trim -}}{{- '<turn|>\\n' -}}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}{{- message['content'] | trim -}}{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)
#: Qwen 3.5's ChatML with thinking: without enable_thinking the generation prompt closes an empty block.
QWEN35_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
#: each architecture's chat format on the tiny vocabulary: (template, end-of-turn token, special tokens to add)
CHAT_FORMATS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gemma4": (GEMMA4_TEMPLATE, "<turn|>", ("<|turn>", "<turn|>", "<|think|>")),
    "qwen": (QWEN35_TEMPLATE, "<|im_end|>", ()),
}
MODEL_CLASS = {"gemma4": "Gemma4ForConditionalGeneration", "qwen": "Qwen3_5ForCausalLM"}

#: full-size defaults of the sizes a user may change, and the sizes of the `--tiny` debug flow
FULL = {
    "batch_sizes": [32, 128, 256],
    "prompt_tokens": 600,
    "decode_steps": 64,
    "bandwidth_mib": 1024,
    "bandwidth_repeats": 50,
    "sepo_max_new_tokens": 16,
    "sepo_rounds": None,
    "sft_batch": None,
    "sft_tokens": None,
    "sft_steps": 5,
}
TINY = {
    "batch_sizes": [2, 4],
    "prompt_tokens": 24,
    "decode_steps": 4,
    "bandwidth_mib": 16,
    "bandwidth_repeats": 5,
    "sepo_max_new_tokens": 4,
    "sepo_rounds": 2,
    "sft_batch": 2,
    "sft_tokens": 32,
    "sft_steps": 2,
}


# ------------------------------------------------------------------------------------- configs
def gemma4_config(preset: str = "e4b", towers: bool = True):
    """Gemma4Config at the E4B shape or transformers' default text shape, with the default vision and
    audio towers (their weights take memory in a real checkpoint even though text never runs them)."""
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    if preset not in ("e4b", "default"):
        raise ValueError(f"gemma4 preset {preset!r}; allowed: e4b, default")
    text = Gemma4TextConfig(**GEMMA4_E4B_TEXT) if preset == "e4b" else Gemma4TextConfig()
    extra = {"vision_config": Gemma4VisionConfig(), "audio_config": Gemma4AudioConfig()} if towers else {}
    return Gemma4Config(text_config=text, **extra)


def qwen35_config():
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**QWEN35_4B_TEXT)


def tiny_config(arch: str, vocab: int, pad_id: int = 0, eos_id: int = 2):
    """A few-layer random model of the real architecture: every layer kind of the full model
    (Gemma 4: sliding and full attention, KV sharing, per-layer embeddings, both towers; Qwen 3.5:
    linear and full attention), small enough for a CPU test."""
    if arch == "gemma4":
        from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

        text = Gemma4TextConfig(
            vocab_size=vocab,
            vocab_size_per_layer_input=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
            num_kv_shared_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            global_head_dim=16,
            hidden_size_per_layer_input=8,
            sliding_window=16,
            max_position_embeddings=1024,
            final_logit_softcapping=30.0,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            bos_token_id=None,
        )
        vision = Gemma4VisionConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
        )
        audio = Gemma4AudioConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            subsampling_conv_channels=[4, 4],
            output_proj_dims=16,
        )
        return Gemma4Config(text_config=text, vision_config=vision, audio_config=audio)
    if arch == "qwen":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            max_position_embeddings=1024,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
        )
    raise ValueError(f"arch {arch!r}; allowed: {', '.join(ARCHS)}")


def build_model(arch: str, config: Any, device: str = "cpu", dtype: Any = None, temper: bool = True):
    """The architecture's class with random weights, created and initialised on `device` (the
    full-size models never pass through host memory; `device='meta'` only counts parameters).
    `temper`: Gemma 4's attention logits at a trained model's scale (`temper_attention_logits`)."""
    import torch
    import transformers

    from sepo.models import without_cudnn_attention

    if str(device).startswith("cuda"):
        without_cudnn_attention()  # as the runs load it: cuDNN attention's backward returned NaN
    cls = getattr(transformers, MODEL_CLASS[arch])
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype or torch.float32)
    if temper:
        temper_attention_logits(model)
    return model.eval()


def temper_attention_logits(model: Any) -> int:
    """Give a random Gemma 4 the attention-logit scale a trained one has; returns the norms changed.

    Gemma 4 scores attention as q . k with no 1/sqrt(head_dim): its q and k norms carry the scale, and
    a trained checkpoint has learned it. transformers initialises those norms' weights to 1, so a random
    model's attention logits have a standard deviation of sqrt(head_dim) (16 in E4B's sliding layers,
    22.6 in its global ones) and every query attends to nearly one key. Such a model is a chaotic function
    of rounding: in bfloat16 its log-probs differ from float32's by 0.84 on average at full size, and
    its sampler's log-probs (cached decode) from the teacher-forced pass's, which on an H200 clipped 86%
    of SEPO's first ratios on a fresh batch (docs/speed.md §4f). Weights of head_dim**-0.25 on both norms
    give q . k the usual 1/sqrt(head_dim) (the KV-shared layers have only a q norm; the keys they reuse
    were scaled by the layer that made them). Other architectures are left as they are."""
    import torch

    changed = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ != "Gemma4TextAttention":
                continue
            for norm in (module.q_norm, getattr(module, "k_norm", None)):
                if norm is not None and getattr(norm, "with_scale", False):
                    norm.weight.fill_(norm.weight.shape[0] ** -0.25)
                    changed += 1
    return changed


# ------------------------------------------------------------------------------------- arithmetic
def _towers(name: str) -> bool:
    return any(word in name.lower() for word in ("vision", "visual", "audio"))


def parameter_counts(model: Any) -> dict[str, int]:
    """Total parameters, those of the language model, and those outside its input embedding tables
    (the published "effective" size of Gemma's E-models excludes the per-layer embeddings)."""
    import torch

    total = language = embeddings = 0
    seen: set[int] = set()
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            if not _towers(f"{name}.{pname}"):
                language += p.numel()
                if isinstance(module, torch.nn.Embedding):
                    embeddings += p.numel()
    return {"total": total, "language_model": language, "language_model_without_embeddings": language - embeddings}


def decode_weight_bytes(model: Any) -> int:
    """Bytes of the weights one decode step reads: every language-model parameter except the input
    embedding tables (a step gathers only B rows), plus the output head (read whole, tied or not)."""
    import torch

    head = model.get_output_embeddings()
    counted: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        if _towers(name) or (isinstance(module, torch.nn.Embedding) and module is not head):
            continue
        for p in module.parameters(recurse=False):
            if id(p) not in counted:
                counted.add(id(p))
                total += p.numel() * p.element_size()
    if head is not None and id(head.weight) not in counted:
        total += head.weight.numel() * head.weight.element_size()
    return total


def bandwidth_floor_fraction(weight_bytes: float, bandwidth: float, seconds_per_step: float) -> float:
    """Share of the memory-bandwidth floor a decode step reaches: (weight_bytes / bandwidth) /
    seconds_per_step; 1.0 means every step only streams the weights at the measured bandwidth."""
    if weight_bytes < 0 or bandwidth <= 0 or seconds_per_step <= 0:
        raise ValueError(
            f"need weight_bytes >= 0, bandwidth > 0 and seconds_per_step > 0; got "
            f"{weight_bytes}, {bandwidth}, {seconds_per_step}"
        )
    return (weight_bytes / bandwidth) / seconds_per_step


def cache_bytes(cache: Any) -> int:
    """Bytes held by a generate cache (KV of attention layers, conv and recurrent states of linear
    attention), each tensor once: layers that share KV point at the same storage."""
    import torch

    seen: set[tuple[int, int]] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.numel():
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        elif isinstance(t, (list, tuple)):
            for x in t:
                add(x)
        elif isinstance(t, dict):  # linear-attention layers keep their states in dicts
            for x in t.values():
                add(x)

    for layer in getattr(cache, "layers", None) or []:
        for value in vars(layer).values():
            add(value)
    for key, value in vars(cache).items():  # caches that keep their tensors on the object itself
        if key != "layers":
            add(value)
    return total


# ------------------------------------------------------------------------------------- environment
def linear_attention_kernels() -> dict[str, Any]:
    """Which implementation Qwen 3.5's Gated DeltaNet calls, read from transformers itself.

    transformers wraps each of these functions at import time and keeps the chosen implementation
    in the wrapper's closure (`use_kernel_func_from_hub_with_fallback`); when the wrapper is not
    there (another transformers release), the packages' importability stands in for it.
    """
    import importlib

    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    from sepo.lm.gated_delta_decode import kernel_binding

    functions = {
        "chunk_gated_delta_rule": ("torch_chunk_gated_delta_rule", "fla"),
        "fused_recurrent_gated_delta_rule": ("torch_recurrent_gated_delta_rule", "fla"),
        "causal_conv1d_fn": ("causal_conv1d_fn", "causal_conv1d"),
        "causal_conv1d_update": ("causal_conv1d_update", "causal_conv1d"),
    }
    paths: dict[str, str] = {}
    for kernel, (attr, package) in functions.items():
        nonlocals = kernel_binding(getattr(modeling, attr, None))
        if "is_new_implementation" in nonlocals:
            impl = nonlocals.get("implementation")
            paths[kernel] = (
                f"{package} ({getattr(impl, '__module__', '?')})" if nonlocals["is_new_implementation"] else "torch"
            )
        else:
            try:
                importlib.import_module(package)
                paths[kernel] = f"{package} (importable)"
            except Exception:  # noqa: BLE001 - any import failure means the fallback
                paths[kernel] = "torch"
    fast = all(p != "torch" for p in paths.values())
    missing = sorted({pkg for k, (_, pkg) in functions.items() if paths[k] == "torch"})
    names = {"fla": "flash-linear-attention", "causal_conv1d": "causal-conv1d"}
    how = {"fla": "pip install -e '.[gpu]'", "causal_conv1d": "pip install --no-build-isolation -e '.[gpu-conv1d]'"}
    return {
        "paths": paths,
        "fast": fast,
        "missing": [names[m] for m in missing],
        "note": "all fast kernels bound"
        if fast
        else f"reference PyTorch fallback for {', '.join(k for k, p in paths.items() if p == 'torch')}: "
        + "; ".join(f"install {names[m]} ({how[m]})" for m in missing),
    }


def bitsandbytes_status() -> dict[str, Any]:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as err:  # noqa: BLE001 - ImportError, or a broken native library
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return {"available": False, "reason": f"bitsandbytes is not importable ({first}); pip install -e '.[gpu]'"}
    return {"available": True, "version": getattr(bitsandbytes, "__version__", "?")}


def measure_bandwidth(device: str, mib: int, repeats: int) -> dict[str, float]:
    """Device-to-device copy bandwidth: (bytes read + bytes written) / time, over `repeats` copies
    of a `mib` MiB buffer after one warm-up copy. A buffer much larger than the L2 cache keeps the
    figure that of the memory, not of the cache."""
    import torch

    n = int(mib) * MIB
    src = torch.empty(n, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(int(repeats)):
        dst.copy_(src)
    _sync(device)
    seconds = time.perf_counter() - start
    del src, dst
    return {
        "bytes_per_s": 2 * n * repeats / seconds,
        "gb_per_s": round(2 * n * repeats / seconds / 1e9, 1),
        "buffer_mib": mib,
        "repeats": repeats,
    }


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class PeakMemory:
    """Peak allocated device memory of a block (None on a CPU, where torch keeps no such count)."""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.mib: float | None = None

    def __enter__(self) -> PeakMemory:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.mib = round(torch.cuda.max_memory_allocated() / MIB, 1)


def _oom_types() -> tuple[type, ...]:
    import torch

    return tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if t is not None
    )


def _free(device: str) -> None:
    import torch

    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- decode
def _time_generate(
    model: Any,
    ids: Any,
    extras: dict,
    new_tokens: int,
    pad_id: int,
    eos_ids: list[int],
    device: str,
    cache: str = "dynamic",
) -> tuple[float, Any]:
    """Seconds of one greedy `generate` of exactly `new_tokens` tokens (min = max, so an end token
    drawn by the random weights cannot stop a row early), and its cache. `cache="static"`: transformers'
    preallocated cache, with which `generate` compiles the forward on a GPU (CUDA graphs: one launch
    per step instead of hundreds, the lever of an overhead-bound decode)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=eos_ids,
        use_cache=True,
        return_dict_in_generate=True,
        **({"cache_implementation": "static"} if cache == "static" else {}),
    )
    mask = torch.ones_like(ids)
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **extras)
    _sync(device)
    return time.perf_counter() - start, out


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far. generate compiles its forward on a
    static cache only where transformers' criteria allow (a GPU, a model that compiles whole), and
    says nothing when it does not: the count tells a static-cache figure that ran on CUDA graphs from
    one that ran eagerly, and one that recompiled while timed."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class _TimingNoise(RuntimeError):
    """The difference of two timings is not positive: no figure is better than a wrong one."""


def decode_benchmark(
    model: Any,
    model_cfg: Any,
    batch_sizes: list[int],
    prompt_tokens: int,
    decode_steps: int,
    bandwidth: float,
    device: str,
    pad_id: int,
    eos_ids: list[int],
    seed: int = 0,
    cache: str = "dynamic",
) -> dict[str, Any]:
    """Decode steps/s per batch size: (t(1 + steps tokens) - t(1 token)) / steps, both generate calls
    on the same random prompt, so prompt processing and setup cancel out and only the steps remain.
    With `cache="static"` each of the two lengths is generated once untimed first: a compiled forward
    is built per cache length, and building it is not decode time."""
    import torch

    from sepo.models import forward_extras

    weight_bytes = decode_weight_bytes(model)
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {
        "weight_bytes": weight_bytes,
        "weight_mib": round(weight_bytes / MIB, 1),
        "floor_ms_per_step": round(1e3 * weight_bytes / bandwidth, 3),
        "batches": [],
    }
    for batch in batch_sizes:
        row: dict[str, Any] = {"batch": batch, "prompt_tokens": prompt_tokens, "decode_steps": decode_steps}
        try:
            ids = torch.randint(3, vocab, (batch, prompt_tokens), generator=generator).to(device)
            extras = forward_extras(model, model_cfg, ids)
            # warm-up at the measured shapes: kernel selection, compilation and allocator growth are not decode time
            for tokens in (1, 1 + decode_steps) if cache == "static" else (2,):
                _time_generate(model, ids, extras, tokens, pad_id, eos_ids, device, cache)
            graphs_before = compiled_graphs()
            with PeakMemory(device) as peak:
                first, _ = _time_generate(model, ids, extras, 1, pad_id, eos_ids, device, cache)
                full, result = _time_generate(model, ids, extras, 1 + decode_steps, pad_id, eos_ids, device, cache)
            held = cache_bytes(getattr(result, "past_key_values", None))
            del result
            if full <= first:
                raise _TimingNoise(
                    f"{decode_steps} decode steps took no measurable time beyond the 1-token "
                    f"generate ({full:.4f} s vs {first:.4f} s): raise --decode-steps"
                )
            per_step = (full - first) / decode_steps
            row.update(
                steps_per_s=round(1 / per_step, 2),
                ms_per_step=round(1e3 * per_step, 3),
                tokens_per_s=round(batch / per_step, 1),
                prompt_s=round(first, 3),
                floor_fraction=round(bandwidth_floor_fraction(weight_bytes, bandwidth, per_step), 4),
                cache_mib=round(held / MIB, 1),
                floor_fraction_with_cache=round(bandwidth_floor_fraction(weight_bytes + held, bandwidth, per_step), 4),
                peak_mib=peak.mib,
                compiled_graphs_while_timed=compiled_graphs() - graphs_before,
                compiled_graphs_in_all=compiled_graphs(),
            )
        except _oom_types() as err:
            row["error"] = f"out of memory ({str(err).splitlines()[0][:120]})"
        except _TimingNoise as err:
            row["error"] = str(err)
        _free(device)
        log.info("decode %s", row)
        _say(
            f"  decode batch {batch}: "
            + (
                f"{row['steps_per_s']} steps/s, {row['floor_fraction']:.1%} of the bandwidth floor"
                if "steps_per_s" in row
                else row["error"]
            )
        )
        out["batches"].append(row)
    return out


def finite_logits(model: Any, model_cfg: Any, device: str, tokens: int = 16) -> bool:
    """Whether random weights give finite logits: sampling from NaN probabilities would index past
    the vocabulary and, on a GPU, end the whole process with a device-side assert."""
    import torch

    from sepo.models import forward_extras

    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(3, vocab, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **forward_extras(model, model_cfg, ids)
        ).logits
    return bool(torch.isfinite(logits.float()).all())


# ------------------------------------------------------------------------------------- SEPO step
def sepo_step_benchmark(model: Any, tokenizer: Any, cfg: Any, device: str, ref_4bit: bool) -> dict[str, Any]:
    """One SEPO step as `run_sepo` takes it: collect a rollout batch, reference log-probs, one optimizer
    step (fresh AdamW, so its state's first allocation is in the peak), each phase timed."""
    import torch

    from sepo.errors import Diverged
    from sepo.games import make_game
    from sepo.models import quantized_reference
    from sepo.policies.recording import RecordingPolicy
    from sepo.stages.sepo_loop import training_parts, update
    from sepo.training.objective import sepo_settings
    from sepo.training.passes import generated_tokens, reference_logprobs

    s = sepo_settings(cfg)
    game = make_game(cfg.game)
    policy, optimizer, estimator, builder = training_parts(cfg, s, model, tokenizer)
    out: dict[str, Any] = {"ref_4bit": ref_4bit}
    ref_model = None
    try:
        if ref_4bit:
            cuda = str(device).startswith("cuda")
            before = torch.cuda.memory_allocated() if cuda else 0
            start = time.perf_counter()
            ref_model = quantized_reference(model, compute_dtype=model.get_input_embeddings().weight.dtype)
            _sync(device)
            out["quantize_s"] = round(time.perf_counter() - start, 2)
            extra = (
                torch.cuda.memory_allocated() - before
                if cuda
                else sum(
                    p.numel() * p.element_size() for p in ref_model.parameters() if type(p).__name__ == "Params4bit"
                )
            )
            out["reference_extra_mib"] = round(extra / MIB, 1)  # what the quantized copy holds beyond the policy
        with PeakMemory(device) as peak:
            t0 = time.perf_counter()
            batch = builder.collect(game, RecordingPolicy(policy), 0, estimator)
            _sync(device)
            t1 = time.perf_counter()
            ref = reference_logprobs(model, policy, batch, s, ref_model)
            _sync(device)
            t2 = time.perf_counter()
            try:
                loss, skipped = update(model, policy, optimizer, batch, ref, s, step=0)["loss"], False
            except Diverged:  # a non-finite loss or gradient: no step taken
                loss, skipped = float("nan"), True
            _sync(device)
            t3 = time.perf_counter()
        out.update(
            step_s=round(t3 - t0, 3),
            rollout_s=round(t1 - t0, 3),
            reference_s=round(t2 - t1, 3),
            update_s=round(t3 - t2, 3),
            peak_mib=peak.mib,
            decisions=len(batch.decisions),
            generated_tokens=generated_tokens(batch),
            loss=round(float(loss), 6),
            skipped=skipped,
        )
    except _oom_types() as err:
        out["error"] = f"out of memory ({str(err).splitlines()[0][:120]})"
    finally:
        del ref_model, optimizer
        _free(device)
    _say(
        f"  SEPO step ({'4-bit reference' if ref_4bit else 'reference = adapter off'}): "
        + (f"{out['step_s']} s, peak {out['peak_mib']} MiB" if "step_s" in out else out.get("error", ""))
    )
    return out


def sft_benchmark(
    model: Any, cfg: Any, device: str, batch: int, tokens: int, steps: int, seed: int = 0
) -> tuple[Any, dict[str, Any]]:
    """Training tokens/s of the SFT stage's update (its LoRA or full fine-tune, its gradient
    checkpointing) on random sequences; returns the model without the SFT adapter again."""
    import torch

    from sepo.models import forward_extras
    from sepo.stages.sft import apply_lora, sft_settings

    s = sft_settings(cfg)
    out: dict[str, Any] = {
        "batch": batch,
        "tokens_per_sequence": tokens,
        "steps": steps,
        "mode": "full" if s.full_finetune else f"lora r={int(s.lora.r)}",
        "gradient_checkpointing": bool(s.gradient_checkpointing),
    }
    if s.full_finetune:
        model.requires_grad_(True)
        trained = model
    else:
        trained = apply_lora(model, s)  # the SFT stage's own adapter
    if s.gradient_checkpointing:
        trained.gradient_checkpointing_enable()
        if not s.full_finetune:
            trained.enable_input_require_grads()
    params = [p for p in trained.parameters() if p.requires_grad]
    out["trainable_parameters"] = sum(p.numel() for p in params)
    optimizer = torch.optim.AdamW(params, lr=float(s.lr))
    vocab = trained.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(seed)

    def step() -> None:
        ids = torch.randint(3, vocab, (batch, tokens), generator=generator).to(device)
        loss = trained(
            input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, **forward_extras(trained, cfg.model, ids)
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    trained.train()
    try:
        step()  # warm-up: optimizer state, kernels
        with PeakMemory(device) as peak:
            _sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            _sync(device)
            seconds = time.perf_counter() - start
        out.update(
            tokens_per_s=round(batch * tokens * steps / seconds, 1),
            s_per_step=round(seconds / steps, 3),
            peak_mib=peak.mib,
        )
    except _oom_types() as err:
        out["error"] = f"out of memory ({str(err).splitlines()[0][:120]})"
    finally:
        trained.eval()
        optimizer.state.clear()  # free the Adam moments before the next measurement
        if s.gradient_checkpointing:
            trained.gradient_checkpointing_disable()
        model = trained if s.full_finetune else trained.unload()
        model.requires_grad_(False)
        _free(device)
    _say(
        "  SFT: "
        + (f"{out['tokens_per_s']} tokens/s, peak {out['peak_mib']} MiB" if "tokens_per_s" in out else out["error"])
    )
    return model, out


# ------------------------------------------------------------------------------------- checkpoints
def chat_tokenizer(arch: str, tiny_dir: str | Path):
    """The tiny tokenizer dressed as `arch`'s: its chat template, end-of-turn token and special
    tokens, so prompts render and answers end the way the real model's do (its ids stay < 2,048,
    valid rows of either real embedding)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    template, end_of_turn, special = CHAT_FORMATS[arch]
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    if special:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], special_tokens=True)
    tok.eos_token = end_of_turn
    tok.chat_template = template
    return tok


def save_random_checkpoint(arch: str, out: str | Path, cache_dir: str | Path, tiny: bool, preset: str = "e4b") -> Path:
    """A random-weight checkpoint of the real class, saved as the hub has it (bfloat16 weights and the
    dressed tiny tokenizer), so `main.py model=<arch> model.path=<out>` runs every stage on it where
    nothing can be downloaded. Built on the GPU when there is one (a full-size model never passes
    through host memory), on the CPU otherwise."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from sepo.builders.tiny import build_tiny, padded_vocab

    tiny_dir = build_tiny(
        compose_config(["model=tiny", "logger=none", f"paths.cache_dir={cache_dir}"]).model, cache_dir
    )
    tok = chat_tokenizer(arch, tiny_dir)
    end_of_turn, pad = tok.convert_tokens_to_ids(tok.eos_token), tok.pad_token_id
    vocab = padded_vocab(tok)
    if tiny:
        config = tiny_config(arch, vocab, pad, end_of_turn)
    else:
        config = gemma4_config(preset) if arch == "gemma4" else qwen35_config()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if tiny and device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    model = build_model(arch, config, device, dtype)
    model.generation_config = GenerationConfig(eos_token_id=[end_of_turn, pad], pad_token_id=pad, bos_token_id=None)
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    _free(device)
    AutoTokenizer.from_pretrained(out)  # fails here, not in a run, if the tokenizer did not save whole
    return out


# ------------------------------------------------------------------------------------- one model
def tiny_tokenizer(cache_dir: str | Path):
    """The project's tiny tokenizer (ChatML, left padding), built offline on first use."""
    from transformers import AutoTokenizer

    from sepo.builders.tiny import build_tiny

    tiny = compose_config(["model=tiny", "logger=none", f"paths.cache_dir={cache_dir}"])
    return AutoTokenizer.from_pretrained(build_tiny(tiny.model, cache_dir))


def benchmark_model(
    arch: str, args: argparse.Namespace, sizes: dict[str, Any], tokenizer: Any, bandwidth: float, bnb: dict[str, Any]
) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig

    from sepo.builders.tiny import padded_vocab

    device = args.device
    # bfloat16 as the real runs use it; float32 only for the tiny debug models on a CPU
    dtype = torch.float32 if args.tiny and not str(device).startswith("cuda") else torch.bfloat16
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    vocab = padded_vocab(tokenizer)
    config, shape = model_shape(arch, args, vocab, pad_id, eos_id)
    cfg = run_config(arch, args, sizes)

    _say(f"{arch}: building {MODEL_CLASS[arch]} ({shape}) on {device} in {str(dtype).removeprefix('torch.')}")
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    model = build_model(arch, config, device, dtype)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None)
    _sync(device)
    result: dict[str, Any] = {
        "class": MODEL_CLASS[arch],
        "shape": shape,
        "dtype": str(dtype).removeprefix("torch."),
        "build_s": round(time.perf_counter() - start, 1),
        "parameters": parameter_counts(model),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    if arch == "qwen" and cfg.model.get("lean_delta_decode", False):  # as the runs load it (sepo.models)
        from sepo.lm.gated_delta_decode import use_lean_delta_decode

        result["lean_delta_decode"] = use_lean_delta_decode()
    result["logits_finite"] = finite_logits(model, cfg.model, device)
    if not result["logits_finite"]:
        _say(f"  WARNING: the random {arch} model's logits are not finite; the SEPO step (which samples) is skipped")
    if arch == "qwen":
        result["linear_attention"] = linear_attention_kernels()
        if not result["linear_attention"]["fast"]:
            log.warning("qwen: %s", result["linear_attention"]["note"])  # printed even without logging set up
    if "decode" in args.parts:
        result["decode"] = _part_or_error(
            "decode",
            decode_benchmark,
            model,
            cfg.model,
            sizes["batch_sizes"],
            sizes["prompt_tokens"],
            sizes["decode_steps"],
            bandwidth,
            device,
            pad_id,
            [eos_id, pad_id],
            args.seed,
            args.decode_cache,
        )
    model_intact = True
    if "sft" in args.parts:
        from sepo.stages.sft import sft_settings

        s = sft_settings(cfg)
        trained = _part_or_error(
            "sft",
            sft_benchmark,
            model,
            cfg,
            device,
            sizes["sft_batch"] or int(s.per_device_batch_size),
            sizes["sft_tokens"] or int(s.max_length),
            sizes["sft_steps"],
            args.seed,
        )
        if "error" in trained:
            result["sft"], model_intact = trained, False
        else:
            model, result["sft"] = trained
    if "sepo" in args.parts and not model_intact:
        result["sepo_step"] = [{"skipped": "the SFT part failed and may have left its adapter on the model"}]
    elif "sepo" in args.parts and result["logits_finite"]:
        result["sepo_settings"], result["sepo_step"] = sepo_steps(model, tokenizer, cfg, device, bnb)
    del model
    _free(device)
    return result


def model_shape(arch: str, args: argparse.Namespace, vocab: int, pad_id: int, eos_id: int) -> tuple[Any, str]:
    """The architecture's config at the size asked for, and its description in the output."""
    if args.tiny:
        config, shape = tiny_config(arch, vocab, pad_id, eos_id), "tiny"
    elif arch == "gemma4":
        config, shape = (
            gemma4_config(args.gemma4_preset),
            (
                "Gemma 4 E4B (published text config; default vision and audio towers)"
                if args.gemma4_preset == "e4b"
                else "transformers' default Gemma4TextConfig() (not E4B)"
            ),
        )
    else:
        config, shape = qwen35_config(), "Qwen 3.5 4B (published text config)"
    return config, shape


def run_config(arch: str, args: argparse.Namespace, sizes: dict[str, Any]) -> Any:
    """The run config the SEPO and SFT parts read: the model's own, at the benchmark's sizes."""
    overrides = [
        f"model={arch}",
        f"game={args.sepo_game}",
        "logger=none",
        f"paths.cache_dir={args.cache_dir}",
        f"paths.output_dir={tempfile.gettempdir()}",
        f"sepo.rollouts_per_opponent={args.sepo_rollouts}",
        f"sepo.max_new_tokens={sizes['sepo_max_new_tokens']}",
        f"seed={args.seed}",
    ]
    cfg = compose_config(overrides + list(args.override))
    if sizes["sepo_rounds"] and "rounds" in cfg.game:  # games without rounds (Kuhn: hands) keep theirs
        cfg.game.rounds = int(sizes["sepo_rounds"])
    return cfg


def sepo_steps(model: Any, tokenizer: Any, cfg: Any, device: str, bnb: dict[str, Any]) -> tuple[dict, list]:
    """One SEPO step with the adapter-off reference, then one with the 4-bit reference (where bitsandbytes
    loads): the settings they ran at and each step's figures."""
    import torch

    from sepo.models import attach_lora
    from sepo.training.objective import sepo_settings

    s = sepo_settings(cfg)
    settings = {
        "game": cfg.game.name,
        "rounds": int(cfg.game.rounds) if "rounds" in cfg.game else None,
        "rollouts_per_opponent": int(s.rollouts_per_opponent),
        "max_new_tokens": int(s.max_new_tokens),
        "micro_batch": int(s.micro_batch),
        "lora_r": int(s.lora.r),
        "penalty_mode": str(s.penalty_mode),
    }
    torch.manual_seed(int(s.seed))
    peft_model = attach_lora(
        model, cfg.model.lora.target_modules, int(s.lora.r), int(s.lora.alpha), float(s.lora.dropout)
    )
    steps = [_part_or_error("sepo", sepo_step_benchmark, peft_model, tokenizer, cfg, device, ref_4bit=False)]
    if bnb["available"]:
        steps.append(_part_or_error("sepo", sepo_step_benchmark, peft_model, tokenizer, cfg, device, ref_4bit=True))
    else:
        steps.append({"ref_4bit": True, "skipped": bnb["reason"]})
        _say(f"  SEPO step with 4-bit reference skipped: {bnb['reason']}")
    del peft_model
    return settings, steps


def _part_or_error(name: str, measure: Any, *args: Any, **kwargs: Any) -> Any:
    """One part's measurement, or {"error": ...} in its place: a part that breaks on a new stack (a
    kernel library refusing the GPU, say) must not take the other parts' figures with it."""
    try:
        return measure(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 -- reported in the JSON, never swallowed silently
        message = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
        _say(f"  {name} failed: {message}")
        log.debug("%s failed", name, exc_info=True)
        return {"error": message}


# ------------------------------------------------------------------------------------- entry points
def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `gpu` command's options; sizes left unset take the full-size defaults (or the tiny ones)."""
    p = parser
    p.add_argument("--model", choices=("gemma4", "qwen", "both"), default="both", help="architectures to benchmark")
    p.add_argument(
        "--gemma4-preset",
        choices=("e4b", "default"),
        default="e4b",
        help="e4b: the published Gemma 4 E4B text config; default: transformers' Gemma4TextConfig()",
    )
    p.add_argument(
        "--parts",
        nargs="+",
        choices=("decode", "sft", "sepo"),
        default=["decode", "sft", "sepo"],
        help="what to measure per model",
    )
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help=f"decode batch sizes (default {' '.join(map(str, FULL['batch_sizes']))})",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help=f"random prompt length before decoding (default {FULL['prompt_tokens']})",
    )
    p.add_argument(
        "--decode-steps",
        type=int,
        default=None,
        help=f"timed decode steps per batch size (default {FULL['decode_steps']})",
    )
    p.add_argument(
        "--decode-cache",
        choices=("dynamic", "static"),
        default="dynamic",
        help="the decode part's KV cache: dynamic (the runs' own) or static (generate then compiles the forward on a GPU)",
    )
    p.add_argument(
        "--bandwidth-mib",
        type=int,
        default=None,
        help=f"buffer of the bandwidth copy, MiB (default {FULL['bandwidth_mib']})",
    )
    p.add_argument(
        "--bandwidth-repeats",
        type=int,
        default=None,
        help=f"timed copies of the buffer (default {FULL['bandwidth_repeats']})",
    )
    add_step_arguments(p)


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The SEPO and SFT parts' options, the seed, the cache and the save mode."""
    p.add_argument("--sepo-game", default="ipd", help="game of the SEPO step")
    p.add_argument("--sepo-rollouts", type=int, default=2, help="sepo.rollouts_per_opponent of the SEPO step (n)")
    p.add_argument(
        "--sepo-max-new-tokens",
        type=int,
        default=None,
        help=f"sepo.max_new_tokens of the SEPO step (default {FULL['sepo_max_new_tokens']})",
    )
    p.add_argument(
        "--sepo-rounds", type=int, default=None, help="game.rounds of the SEPO step (default: the game's own)"
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="a further Hydra override for the SEPO/SFT config, e.g. sepo.micro_batch=16 (repeatable)",
    )
    p.add_argument(
        "--sft-batch", type=int, default=None, help="SFT sequences per step (default sft.per_device_batch_size)"
    )
    p.add_argument("--sft-tokens", type=int, default=None, help="SFT tokens per sequence (default sft.max_length)")
    p.add_argument("--sft-steps", type=int, default=None, help=f"timed SFT steps (default {FULL['sft_steps']})")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the random weights and inputs")
    p.add_argument("--cache-dir", default=".cache", help="where the tiny tokenizer is built (shared with runs)")
    p.add_argument(
        "--save-to",
        default=None,
        help="instead of benchmarking: save each model as a random-weight checkpoint in DIR/<model> "
        "(for main.py model=<model> model.path=DIR/<model>)",
    )
    # debug: the whole flow on tiny models, e.g. on a CPU
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)  # torch CPU threads (0: torch's)


def resolved_sizes(args: argparse.Namespace) -> dict[str, Any]:
    """Every size: the command line's where given, else the full-size or tiny default."""
    defaults = TINY if args.tiny else FULL
    return {
        key: getattr(args, key, None) if getattr(args, key, None) is not None else value
        for key, value in defaults.items()
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"python -m benchmarks gpu needs a CUDA device, and torch {torch.__version__} sees none "
            "(torch.cuda.is_available() is False); run it on a GPU machine with a CUDA build of torch"
        )
    import transformers

    if not str(args.device).startswith("cuda") and getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)  # tiny models are all small ops: more threads only contend
    sizes = resolved_sizes(args)
    archs = list(ARCHS) if args.model == "both" else [args.model]
    if args.save_to:
        return {
            arch: str(
                save_random_checkpoint(arch, Path(args.save_to) / arch, args.cache_dir, args.tiny, args.gemma4_preset)
            )
            for arch in archs
        }
    device = args.device
    name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else "cpu"
    _say(f"python -m benchmarks gpu on {name}: {', '.join(archs)}{' (tiny debug models)' if args.tiny else ''}")
    bandwidth = measure_bandwidth(device, sizes["bandwidth_mib"], sizes["bandwidth_repeats"])
    _say(f"copy bandwidth: {bandwidth['gb_per_s']} GB/s (read + write)")
    bnb = bitsandbytes_status()
    tokenizer = tiny_tokenizer(args.cache_dir)
    result: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tiny": bool(args.tiny),
        "bandwidth": bandwidth,
        "bitsandbytes": bnb,
        "linear_attention": linear_attention_kernels(),
        "settings": {
            **sizes,
            "parts": list(args.parts),
            "gemma4_preset": args.gemma4_preset,
            "sepo_game": args.sepo_game,
            "sepo_rollouts": args.sepo_rollouts,
            "overrides": list(args.override),
            "tokenizer": f"tiny ({len(tokenizer)} tokens)",
            "prompts": "random token ids",
            "decode": "greedy generate, min_new_tokens = max_new_tokens",
            "decode_cache": args.decode_cache,
        },
        "models": {},
    }
    for arch in archs:
        result["models"][arch] = benchmark_model(arch, args, sizes, tokenizer, bandwidth["bytes_per_s"], bnb)
    return result
