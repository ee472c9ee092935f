"""The one loader below every model: checkpoint directory or hub id in, model and tokenizer out.

One path serves every model, built or downloaded: `from_pretrained`, then the same tokenizer fixes
(left padding for batched generation, a pad token, a chat template). What a run loads is decided
above, in `sepo.builders` (a built model's cache directory, or `model.path`). Also here: what every
forward and generate call needs from the config (chat-template arguments, Gemma 4's token type
ids), LoRA adapters, and the 4-bit reference.

Real checkpoints (Gemma 4, Qwen 3.5) are never downloaded by the code's tests; they are loaded
from `model.path`, a local directory or a hub id already in the Hugging Face cache.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from omegaconf import OmegaConf

from sepo.errors import ModelLoadError
from sepo.lm.logprobs import densely_strided

log = logging.getLogger(__name__)

#: CPU flags of a native bfloat16 matmul (x86: AVX512-BF16 or AMX); without one bfloat16 is emulated, slower than float32
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


# --------------------------------------------------------------------------- prompts and inputs
def chat_template_kwargs(model_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for `apply_chat_template`: `enable_thinking` from `model.thinking`, then
    `model.chat_template_kwargs` (which win)."""
    extra = model_cfg.chat_template_kwargs
    extra = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else dict(extra)
    return {"enable_thinking": model_cfg.thinking, **extra}


def render_chat(
    tokenizer: Any, model_cfg: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> str:
    """The prompt text of `messages` exactly as the model's chat template writes it."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **chat_template_kwargs(model_cfg)
    )


def forward_extras(model: Any, model_cfg: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Extra inputs for every forward and generate call: all-zero token type ids when
    `model.token_type_ids` is set (Gemma 4: every token is text).

    transformers 5 calls Gemma 4's argument `mm_token_type_ids`, older releases `token_type_ids`;
    the name is read from the model's forward signature.
    """
    if not model_cfg.token_type_ids:
        return {}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    name = "mm_token_type_ids" if "mm_token_type_ids" in params else "token_type_ids"
    return {name: torch.zeros_like(input_ids)}


# --------------------------------------------------------------------------- loading
def _looks_local(path: str) -> bool:
    return Path(path).expanduser().is_absolute() or path.startswith((".", "~"))


def _load_error(path: str, err: Exception) -> ModelLoadError:
    """Turn whatever `from_pretrained` raised into one line saying what to set."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if Path(path).is_dir():
        return ModelLoadError(f"model.path={path} holds no loadable model or tokenizer ({first})")
    if isinstance(err, HFValidationError) or isinstance(err.__cause__ or err.__context__, HFValidationError):
        return ModelLoadError(f"model.path={path} is neither a local directory nor a valid hub id (owner/name)")
    return ModelLoadError(
        f"model.path={path} is not a local directory, not in the Hugging Face cache, and the hub cannot be "
        f"reached ({first}). Download the checkpoint where there is internet access (e.g. `hf download {path} "
        "--local-dir /local/dir`), copy it here and set model.path=/local/dir"
    )


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (Linux: /proc/cpuinfo's flags; elsewhere, ask torch's
    kernels, which only says whether they were built for it)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX")
    return any(f" {flag}" in flags for flag in BF16_CPU_FLAGS)


def resolve_dtype(name: str, device: str) -> Any:
    """`model.dtype` as torch's: auto stays "auto" (the checkpoint's own); bfloat16_if_fast is bfloat16 on a GPU
    or a CPU with native bfloat16 (2.6x float32's matmul rate on this project's CPU), else float32."""
    if name == "auto":
        return name
    if name == "bfloat16_if_fast":
        fast = device.startswith("cuda") or (device == "cpu" and cpu_has_native_bf16())
        return torch.bfloat16 if fast else torch.float32
    return _resolve(name, "model.dtype", torch)


def _resolve(name: str, what: str, module: Any) -> Any:
    value = getattr(module, name, None) if isinstance(name, str) else None
    if value is None:
        raise ModelLoadError(f"{what}={name!r} is not a {module.__name__} name")
    return value


def without_cudnn_attention() -> None:
    """Leave scaled_dot_product_attention's cuDNN kernel out (torch then picks flash or memory-efficient).

    On an H200 with torch 2.11 SDPA chose cuDNN for the teacher-forced passes, and its backward returned
    NaN (torch's anomaly mode: `ScaledDotProductCudnnAttentionBackward0` returned nan values) on finite
    log-probs and loss: SEPO diverged at its first or second update on both Gemma 4 and Qwen 3.5, while
    the same runs with eager attention trained (docs/speed.md §4e)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def load_pretrained(path: str | Path, model_cfg: Any, device: str | None = None):
    """The model at `path` (a directory or hub id; eval mode, on `device`, default cuda when
    available) and its tokenizer, with the settings of `model_cfg` (class, dtype, attention).

    The tokenizer comes back with left padding, a pad token and a chat template; the model's
    generation config with a pad id. Built models (tiny, smollm2) reach here as directories
    (`sepo.builders.load_model_and_tokenizer` resolves them).
    """
    import transformers

    path = str(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        without_cudnn_attention()
    model_class = _resolve(model_cfg.get("model_class", "AutoModelForCausalLM"), "model.model_class", transformers)
    dtype = resolve_dtype(model_cfg.get("dtype", "float32"), device)
    common = {
        "trust_remote_code": model_cfg.get("trust_remote_code", False),
        "revision": model_cfg.get("revision"),
        # a hub id is read from the local cache unless model.download says to fetch it: no network waits
        "local_files_only": not _looks_local(path) and not Path(path).is_dir() and not model_cfg.get("download", False),
    }
    extra = {"attn_implementation": model_cfg.attn_implementation} if model_cfg.get("attn_implementation") else {}
    if _looks_local(path):
        path = str(Path(path).expanduser())
        if not Path(path).is_dir():
            raise ModelLoadError(f"model.path={path}: no such directory")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, **common)
        model, info = model_class.from_pretrained(
            path, dtype=dtype, device_map=device, output_loading_info=True, **common, **extra
        )
    except (OSError, ValueError) as err:  # missing files, hub unreachable or offline, invalid hub id
        if isinstance(err, ValueError) and not (Path(path).is_dir() or isinstance(err, HFValidationError)):
            raise  # a bug, not a missing model: keep the traceback
        raise _load_error(path, err) from err
    except Exception as err:  # noqa: BLE001 (a cut safetensors file, a config that contradicts itself, ...)
        if not Path(path).is_dir():
            raise
        raise _load_error(path, err) from err
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # from_pretrained would fill them with random weights, and the run would report on those
        raise ModelLoadError(
            f"model.path={path} lacks {len(missing)} weights its config names (e.g. {missing[0]}); allowed: a "
            "checkpoint whose weights cover its config"
        )

    prepare_for_generation(model, tokenizer, path)
    use_fast_paths(model, model_cfg)
    model.eval()
    return model, tokenizer


def prepare_for_generation(model: Any, tokenizer: Any, path: str) -> None:
    """Left padding, a pad token and a chat template on the tokenizer; pad and eos ids in the model's generation
    config (what batched chat generation needs of a checkpoint, or a one-line error naming what it lacks)."""
    tokenizer.padding_side = "left"  # batched generation appends to the right end of every row
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"the tokenizer of model.path={path} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ModelLoadError(f"the tokenizer of model.path={path} has no chat template; use an instruct checkpoint")
    gen = model.generation_config
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id


def use_fast_paths(model: Any, model_cfg: Any) -> None:
    """The project's own fast paths the model's settings switch on (`sepo.lm`: a dense head input, cascade
    attention, prepacked linears, Qwen 3.5's lean delta decoding)."""
    dense_head_input(model)
    if model_cfg.get("cascade_attention", False):
        from sepo.lm.cascade_attention import use_cascade_attention

        use_cascade_attention(model)
    if model_cfg.get("packed_linears", False):
        from sepo.lm.packed_linear import use_packed_linears

        use_packed_linears(model)
    if model_cfg.get("lean_delta_decode", False) and model.config.get_text_config().model_type.startswith("qwen3_5"):
        from sepo.lm.gated_delta_decode import use_lean_delta_decode

        use_lean_delta_decode()


def dense_head_input(model: Any) -> None:
    """Hand the output head densely strided hidden states, whoever slices them.

    `logits_to_keep` (generate's prefill, SFT's answer positions), a last-position slice or a chunk of
    positions hands the head a strided view, and matmul then copies the head's weight once per row
    (`sepo.lm.logprobs.densely_strided`): a SEPO update pass of SmolLM2 spent a third of its time
    there. Copying the kept positions first costs kilobytes.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        head.register_forward_pre_hook(_dense_first_input)


def _dense_first_input(_module: torch.nn.Module, args: tuple) -> tuple:
    return (densely_strided(args[0]),) + tuple(args[1:])


# --------------------------------------------------------------------------- adapters
#: module-name fragments LoRA must never touch (multimodal towers; Gemma 4's clippable linears)
FORBIDDEN_LORA = ("vision", "audio")


def lora_module_names(model: Any) -> list[str]:
    """Names (relative to the base model) of the modules that carry LoRA weights."""
    names = []
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and len(module.lora_A) > 0:
            names.append(name.removeprefix("base_model.model."))
    return names


def attach_lora(
    model: Any, target_regex: str, r: int, alpha: float, dropout: float, key: str = "model.lora.target_modules"
) -> Any:
    """Wrap `model` with LoRA adapters on the modules `target_regex` matches in full (SFT and SEPO).

    Fails with a ConfigError naming `key` when the regex matches nothing usable or reaches a
    vision/audio module: adapters belong on the language model's projections only.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=int(r),
        lora_alpha=int(alpha),  # peft's field is an int, written to adapter_config.json (`sepo.lora.alpha` is a float)
        lora_dropout=float(dropout),
        target_modules=target_regex,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        model = get_peft_model(model, config)
    except ValueError as err:
        raise ModelLoadError(f"{key}={target_regex!r} matches no usable module of the model ({err})") from err
    bad = [n for n in lora_module_names(model) if any(w in n.lower() for w in FORBIDDEN_LORA)]
    if bad:
        raise ModelLoadError(
            f"{key}={target_regex!r} matches vision/audio modules, e.g. {bad[:3]}; "
            "restrict it to the language model's projections"
        )
    return model


@contextlib.contextmanager
def adapter_folded(model: Any, enabled: bool = True) -> Iterator[Any]:
    """`model` with its LoRA adapter folded into the weights it adapts, for passes without gradients.

    Decoding through an adapter runs two small products and a sum beside each adapted projection at
    every step; at a few rows a step that overhead counts (SmolLM2 on 2 cores: a Kuhn checkpoint's
    evaluation took 1.15x as long through its adapter, side by side: benchmarks/speed/folded_reads.py).
    Folded, the policy is the one a merged checkpoint deploys: W + scale * B @ A, summed in float32 and
    rounded once to W's dtype. The original weight tensors are put back on exit, untouched (they are swapped, never
    added to and subtracted from), so the reference (the adapter switched off) stays exactly the SFT
    model. A model without an adapter, or one whose adapted layers are not plain linears (a 4-bit base),
    is yielded as it is.
    """
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "get_base_layer")] if enabled else []
    if not layers or any(type(m.get_base_layer()) is not torch.nn.Linear for m in layers):
        yield model
        return
    originals = []
    try:
        with torch.no_grad():
            for layer in layers:
                base = layer.get_base_layer()
                delta = sum(layer.get_delta_weight(a).float() for a in layer.active_adapters if a in layer.lora_A)
                originals.append((base, base.weight))
                base.weight = torch.nn.Parameter(
                    (base.weight.float() + delta).to(base.weight.dtype), requires_grad=False
                )
        with model.disable_adapter():
            yield model
    finally:
        for base, weight in originals:
            base.weight = weight


def quantized_reference(model: Any, compute_dtype: Any = None, quant_type: str = "nf4") -> Any:
    """A reference policy for `sepo.ref_4bit`: a copy of `model`'s base whose linear layers are
    bitsandbytes 4-bit, sharing every other tensor (embeddings, norms, the output head: all frozen
    under LoRA) with the policy, so only the quantized linears cost memory.

    A LoRA layer is replaced by its quantized base layer (the reference never has an adapter);
    the output head and the vision/audio towers are left as they are (text never runs the towers).
    Quantization happens when a weight is moved to its device (bitsandbytes' Params4bit).
    """
    try:
        import bitsandbytes as bnb
    except ImportError as err:
        raise ModelLoadError("sepo.ref_4bit=true needs bitsandbytes: pip install -e '.[gpu]'") from err

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # share every tensor: the copy duplicates the module tree only
    memo = {id(t): t for t in list(base.parameters()) + list(base.buffers())}
    ref = copy.deepcopy(base, memo)
    head = ref.get_output_embeddings()

    def quantize(linear: torch.nn.Linear) -> torch.nn.Module:
        device = linear.weight.device
        q = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            compute_dtype=compute_dtype or linear.weight.dtype,
            quant_type=quant_type,
            device="meta",
        )
        q.weight = bnb.nn.Params4bit(
            linear.weight.data, requires_grad=False, quant_type=quant_type, compress_statistics=True, module=q
        ).to(device)
        if linear.bias is not None:
            q.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
        return q

    def convert(module: torch.nn.Module) -> None:
        for child_name, child in list(module.named_children()):
            if any(word in child_name.lower() for word in FORBIDDEN_LORA) or child is head:
                continue
            base_layer = getattr(child, "base_layer", None) if hasattr(child, "lora_A") else None
            if isinstance(base_layer, torch.nn.Linear):
                setattr(module, child_name, quantize(base_layer))
            elif type(child) is torch.nn.Linear:
                setattr(module, child_name, quantize(child))
            else:
                convert(child)

    convert(ref)
    # no requires_grad_(False) here: the copy shares the policy's tensors, and freezing them through
    # it would freeze the policy (the reference runs under no_grad anyway)
    return ref.eval()
