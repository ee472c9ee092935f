"""Load models and tokenizers from `cfg.model`; build the embedded `tiny` model offline.

One loading path serves every model: `from_pretrained` on a directory or hub id, then the same
tokenizer fixes (left padding for batched generation, a pad token, a chat template). The `tiny`
model is the only one built here: a small Qwen3-style causal LM with random weights and a
byte-level BPE trained on the games' own text (`sepo.tiny_corpus`), so the whole pipeline runs on
a CPU with nothing downloaded. It is built once per configuration and cached as an ordinary
`save_pretrained` directory, then loaded exactly like a real checkpoint.

Real checkpoints (Gemma 4, Qwen 3.5) are never downloaded by the code's tests; they are loaded
from `model.path`, a local directory or a hub id already in the Hugging Face cache.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from omegaconf import OmegaConf

from sepo import distributed
from sepo.errors import ConfigError

log = logging.getLogger(__name__)

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: Special tokens of the tiny tokenizer (ids 0, 1, 2): Qwen's ChatML set.
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
#: Reasoning markers: ordinary added tokens, as in Qwen, so decoding keeps them.
THINK_TOKENS = ("<think>", "</think>")

#: ChatML, as the Qwen models use it. `enable_thinking=true` opens a <think> block in the generation
#: prompt; false (the default) leaves the model to answer directly.
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

BUILD_INFO = "sepo_build.json"


class ModelLoadError(ConfigError):
    """A model or tokenizer cannot be loaded from `cfg.model`; the message says what to set."""


# --------------------------------------------------------------------------- prompts and inputs
def chat_template_kwargs(model_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for `apply_chat_template`: `enable_thinking` from `model.thinking`, then
    `model.chat_template_kwargs` (which win)."""
    extra = model_cfg.get("chat_template_kwargs") or {}
    extra = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else dict(extra)
    return {"enable_thinking": bool(model_cfg.get("thinking", False)), **extra}


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
    if not model_cfg.get("token_type_ids", False):
        return {}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    name = "mm_token_type_ids" if "mm_token_type_ids" in params else "token_type_ids"
    return {name: torch.zeros_like(input_ids)}


# --------------------------------------------------------------------------- the tiny model
def _tiny_parts(model_cfg: Any) -> dict[str, Any]:
    """The config fields that determine the built files (others, e.g. lora or sft, do not)."""
    return {
        key: OmegaConf.to_container(model_cfg[key], resolve=True)
        if OmegaConf.is_config(model_cfg[key])
        else model_cfg[key]
        for key in ("architecture", "tokenizer", "corpus", "seed")
    }


def tiny_key(model_cfg: Any, corpus_digest: str) -> str:
    """Short hash of everything the tiny build depends on: its config, the corpus and the template."""
    payload = json.dumps(
        {
            "cfg": _tiny_parts(model_cfg),
            "corpus": corpus_digest,
            "template": TINY_CHAT_TEMPLATE,
            "special": SPECIAL_TOKENS,
            "think": THINK_TOKENS,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def train_tiny_tokenizer(texts: list[str], tok_cfg: Any):
    """Byte-level BPE on `texts`, wrapped as a fast tokenizer with ChatML and left padding.

    Training stops at `tok_cfg.vocab_size` tokens or earlier, when every word of the corpus is one
    token (the games' text has a small vocabulary).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(tok_cfg.vocab_size) - len(THINK_TOKENS),
        min_frequency=int(tok_cfg.min_frequency),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        padding_side="left",
        chat_template=TINY_CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],
    )


def init_tiny_model(model_cfg: Any, tokenizer: Any):
    """A randomly initialised Qwen3 causal LM; the global torch RNG is left untouched."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    arch = model_cfg.architecture
    pad, eos = tokenizer.convert_tokens_to_ids(PAD), tokenizer.convert_tokens_to_ids(IM_END)
    multiple = int(arch.pad_vocab_to_multiple_of)
    config = Qwen3Config(
        vocab_size=-(-len(tokenizer) // multiple) * multiple,
        hidden_size=int(arch.hidden_size),
        intermediate_size=int(arch.intermediate_size),
        num_hidden_layers=int(arch.num_hidden_layers),
        num_attention_heads=int(arch.num_attention_heads),
        num_key_value_heads=int(arch.num_key_value_heads),
        head_dim=int(arch.head_dim),
        max_position_embeddings=int(arch.max_position_embeddings),
        rope_parameters={"rope_type": "default", "rope_theta": float(arch.rope_theta)},
        initializer_range=float(arch.initializer_range),
        tie_word_embeddings=bool(arch.tie_word_embeddings),
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(model_cfg.seed))
        model = Qwen3ForCausalLM(config)
    # stop at the end of the assistant turn (and at the pad/end-of-text token), like Qwen's instruct models
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=None)
    return model


def build_tiny(model_cfg: Any, cache_dir: str | Path) -> Path:
    """Build the tiny model and tokenizer (deterministic, offline, seconds) and return their
    directory `<cache_dir>/tiny-<hash>/`; an existing complete build is reused.

    The build is written to a temporary directory and renamed into place, so concurrent runs
    never see half a build and the loser of a race simply discards its copy.
    """
    from sepo.paths import CONF_DIR
    from sepo.tiny_corpus import build_corpus, corpus_digest

    texts = build_corpus(model_cfg.corpus, CONF_DIR)
    digest = corpus_digest(texts)
    cache_dir = Path(cache_dir)
    out = cache_dir / f"tiny-{tiny_key(model_cfg, digest)}"
    if distributed.rank() != 0:  # transformers writes weights on rank 0 only: wait for its build
        return _wait_for_build(out)
    if (out / BUILD_INFO).exists():
        damage = build_damage(out)
        if damage is None:
            return out
        log.warning("the cached tiny model in %s is damaged (%s): rebuilding it", out, damage)
        _discard(out)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=cache_dir))
    try:
        tokenizer = train_tiny_tokenizer(texts, model_cfg.tokenizer)
        model = init_tiny_model(model_cfg, tokenizer)
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        info = {
            "config": _tiny_parts(model_cfg),
            "corpus_sha256": digest,
            "corpus_texts": len(texts),
            "tokens": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "files": {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by runs
        try:
            tmp.rename(out)
        except OSError:
            if not (out / BUILD_INFO).exists():
                raise
        log.info("built tiny model in %s (%d parameters, %d tokens)", out, info["parameters"], info["tokens"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_damage(out: Path) -> str | None:
    """What is wrong with a cached tiny build (a file missing, cut or changed since it was built), or
    None. A build of older code that recorded no file hashes counts as damaged: rebuilding is seconds."""
    try:
        files = json.loads((out / BUILD_INFO).read_text()).get("files")
    except (OSError, ValueError) as err:
        return f"unreadable {BUILD_INFO}: {type(err).__name__}"
    if not files:
        return "no file hashes recorded"
    for name, digest in files.items():
        if not (out / name).is_file():
            return f"{name} is missing"
        if _sha256(out / name) != digest:
            return f"{name} differs from the build"
    return None


def _discard(out: Path) -> None:
    """Move a damaged build out of the way (atomically: a run loading it at the same time sees the old
    dir or none), then delete it."""
    aside = out.with_name(f".{out.name}-damaged-{time.time_ns()}")
    try:
        out.rename(aside)
    except OSError:
        return  # another run moved it first
    shutil.rmtree(aside, ignore_errors=True)


def _wait_for_build(out: Path, timeout_s: float = 900.0) -> Path:
    """Under data parallelism every process loads the model at the same point and rank 0 builds it."""
    started = time.time()
    while not (out / BUILD_INFO).exists():
        if time.time() - started > timeout_s:
            raise ModelLoadError(
                f"rank {distributed.rank()}: no tiny model appeared in {out} within {timeout_s:.0f} s "
                "(rank 0 builds it)"
            )
        time.sleep(0.5)
    return out


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


def _resolve(name: str, what: str, module: Any) -> Any:
    value = getattr(module, name, None) if isinstance(name, str) else None
    if value is None:
        raise ModelLoadError(f"{what}={name!r} is not a {module.__name__} name")
    return value


def load_model_and_tokenizer(model_cfg: Any, cache_dir: str | Path, device: str | None = None):
    """The model (eval mode, on `device`, default cuda when available) and its tokenizer.

    `model.path` null builds the tiny model under `cache_dir` (tiny only). The tokenizer comes back
    with left padding, a pad token and a chat template; the model's generation config with a pad id.
    """
    import transformers

    path = model_cfg.get("path")
    if path is None:
        if model_cfg.name != "tiny":
            raise ModelLoadError(
                f"model.path is not set for model={model_cfg.name}; set model.path to a local "
                "checkpoint directory or a hub id"
            )
        path = build_tiny(model_cfg, cache_dir)
    path = str(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_class = _resolve(model_cfg.get("model_class", "AutoModelForCausalLM"), "model.model_class", transformers)
    dtype = model_cfg.get("dtype", "float32")
    dtype = dtype if dtype == "auto" else _resolve(dtype, "model.dtype", torch)  # auto: the checkpoint's own
    common = {
        "trust_remote_code": bool(model_cfg.get("trust_remote_code", False)),
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
    model.eval()
    return model, tokenizer


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
    model: Any, target_regex: str, r: int, alpha: int, dropout: float, key: str = "model.lora.target_modules"
) -> Any:
    """Wrap `model` with LoRA adapters on the modules `target_regex` matches in full (SFT and SEPO).

    Fails with a ConfigError naming `key` when the regex matches nothing usable or reaches a
    vision/audio module: adapters belong on the language model's projections only.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=int(r),
        lora_alpha=int(alpha),
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
