"""What a run asks of its language model and of this machine, checked before any work.

Some values are only wrong for a given model: a LoRA regex that matches none of its modules, an
attention kernel its class does not have, an answer budget past its positions, a decoding batch whose
KV cache cannot fit in this machine's memory. Found inside a stage, they would fail after the run dir
recorded its settings, and the corrected command would then be refused as "an unfinished run with other
settings". So `check_model_fit` reads the model's config (building tiny or smollm2 into the cache first,
as the run would), lays the model out on the meta device (no weights are read), and checks them there,
each error naming the key to change.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sepo import penalties
from sepo.errors import ConfigError
from sepo.metrics import POOLS
from sepo.training.options import rollouts_per_group

#: stages that load a language model (datagen plays scripted demonstrators only)
LOADING_STAGES = ("eval", "sft", "sepo", "pipeline")
#: stages that evaluate the agent (SFT evaluates its model), and those that run SEPO's rollouts
EVALUATING_STAGES, RL_STAGES = ("eval", "sft", "sepo", "pipeline"), ("sepo", "pipeline")
#: module-name fragments LoRA must never touch (sepo.models.FORBIDDEN_LORA: the multimodal towers)
FORBIDDEN_LORA = ("vision", "audio")
#: files one of which holds a checkpoint's weights or its tokenizer
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def loads_language_model(cfg: DictConfig) -> bool:
    return cfg.model.name != "scripted" and cfg.stage.name in LOADING_STAGES


def check_model_fit(cfg: DictConfig) -> None:
    """The model's files, class, attention kernel, LoRA targets, positions and KV cache against the config."""
    if not loads_language_model(cfg):
        return
    directory = built_model_dir(cfg)
    if not Path(directory).expanduser().is_dir() and not in_hub_cache(directory, cfg.model.get("revision")):
        return  # a hub id the run will download (model.download=true): no config here to check it against
    config = model_config(directory, cfg.model)
    skeleton = meta_model(config, cfg.model)
    check_lora_targets(skeleton, cfg)
    check_positions(config, cfg)
    check_memory(config, cfg)


def built_model_dir(cfg: DictConfig) -> str:
    """The model's directory, building tiny or smollm2 into the cache on first use as the run would, quietly:
    a refused value's one line must stay the only line."""
    from transformers.utils import logging as hf_logging

    from sepo.builders import model_dir

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return model_dir(cfg.model, cfg.paths.cache_dir)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def in_hub_cache(repo_id: str, revision: str | None) -> bool:
    """Whether the hub id's config is in the local Hugging Face cache (no network is touched)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return isinstance(found, str)


def model_config(directory: str, model_cfg: Any) -> Any:
    """The checkpoint's transformers config, read without its weights; a local directory must also hold
    weights and a tokenizer."""
    import transformers

    local = Path(directory).expanduser()
    if local.is_dir():
        for what, names in (("weights", WEIGHT_FILES), ("tokenizer", TOKENIZER_FILES)):
            has = any((local / n).exists() for n in names) or (what == "weights" and any(local.glob("*.safetensors")))
            if not has:
                raise ConfigError(
                    f"model.path={directory} holds no {what} ({' or '.join(names)}); allowed: a checkpoint "
                    "directory written by save_pretrained (config.json, weights and tokenizer)"
                )
    try:
        return transformers.AutoConfig.from_pretrained(
            str(local) if local.is_dir() else directory,
            trust_remote_code=model_cfg.get("trust_remote_code", False),
            revision=model_cfg.get("revision"),
            local_files_only=True,  # a hub id is checked only once it is in the cache
        )
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"model.path={directory} holds no readable model config ({_first_line(err)}); allowed: a checkpoint "
            "directory written by save_pretrained, or a hub id in the Hugging Face cache"
        ) from None


def meta_model(config: Any, model_cfg: Any) -> Any:
    """The model class laid out on the meta device: its modules and the attention kernel it accepts."""
    import torch
    import transformers

    name = model_cfg.get("model_class", "AutoModelForCausalLM")
    cls = getattr(transformers, str(name), None)
    # an auto class builds from a config with from_config, a model class with _from_config
    build = getattr(cls, "from_config", None) or getattr(cls, "_from_config", None)
    if build is None:
        raise ConfigError(
            f"model.model_class={name} is not allowed; allowed: a transformers model class, e.g. AutoModelForCausalLM"
        )
    attention = model_cfg.get("attn_implementation")
    try:
        with torch.device("meta"):
            return build(config, **({"attn_implementation": attention} if attention else {}))
    except ImportError as err:  # a kernel transformers knows whose package is not installed
        if not attention:
            raise
        raise ConfigError(
            f"model.attn_implementation={attention} is not allowed here ({_first_line(err)}); allowed: "
            f"null (transformers' default), {', '.join(attention_kernels())}, with the kernel's package installed"
        ) from None
    except ValueError as err:
        if attention and "attn_implementation" in str(err):
            raise ConfigError(
                f"model.attn_implementation={attention} is not allowed; allowed: null (transformers' default), "
                f"{', '.join(attention_kernels())}"
            ) from None
        raise ConfigError(
            f"model.model_class={name} is not allowed for a {type(config).__name__} ({_first_line(err)}); allowed: "
            "AutoModelForCausalLM, or the checkpoint's own class"
        ) from None


def attention_kernels() -> list[str]:
    """The attention implementations transformers knows (its registry, and eager)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]


def lora_keys(cfg: DictConfig) -> list[tuple[str, str]]:
    """(key, regex) of every LoRA the run will attach: SFT's (unless it fine-tunes every weight) and SEPO's."""
    stage = cfg.stage.name
    model_targets = ("model.lora.target_modules", (cfg.model.get("lora") or {}).get("target_modules"))
    keys = []
    if stage in ("sft", "pipeline") and not cfg.sft.full_finetune:
        own = cfg.sft.lora.target_modules
        keys.append(("sft.lora.target_modules", own) if own else model_targets)
    if stage in ("sepo", "pipeline"):
        keys.append(model_targets)
    return [(k, v) for k, v in keys if v]


def check_lora_targets(skeleton: Any, cfg: DictConfig) -> None:
    """Each LoRA regex matches, in full as peft matches it, at least one linear layer and no vision/audio module."""
    import torch

    linears = [n for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)]
    for key, pattern in lora_keys(cfg):
        matched = [n for n in linears if re.fullmatch(pattern, n)]
        if not matched:
            raise ConfigError(
                f"{key}={pattern!r} is not allowed: it matches no linear layer of {type(skeleton).__name__}; allowed: "
                f"a regex matched in full against module names such as {linears[0] if linears else '(none)'}"
            )
        towers = [n for n in matched if any(w in n.lower() for w in FORBIDDEN_LORA)]
        if towers:
            raise ConfigError(
                f"{key}={pattern!r} is not allowed: it reaches vision/audio modules (e.g. {towers[0]}); allowed: a "
                "regex over the language model's projections only"
            )


def positions(config: Any) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def answer_budgets(cfg: DictConfig) -> list[tuple[str, int]]:
    """(key, tokens) of every sequence the run asks the model to hold beyond a prompt."""
    stage = cfg.stage.name
    budgets = []
    if stage in ("eval", "sepo", "pipeline"):
        budgets.append(("eval.max_new_tokens", cfg.eval.max_new_tokens))
    if stage in ("sepo", "pipeline"):
        budgets.append(("sepo.max_new_tokens", cfg.sepo.max_new_tokens))
    if stage in ("sft", "pipeline"):
        budgets += [
            ("sft.max_length", cfg.sft.max_length),
            ("sft.agreement_max_new_tokens", cfg.sft.agreement_max_new_tokens),
        ]
    return budgets


def check_positions(config: Any, cfg: DictConfig) -> None:
    """An answer budget leaves room for at least one prompt token within the model's positions."""
    most = positions(config)
    if most is None:
        return
    for key, tokens in answer_budgets(cfg):
        limit = most if key == "sft.max_length" else most - 1
        if int(tokens) > limit:
            raise ConfigError(
                f"{key}={tokens} is not allowed for model={cfg.model.name}: it holds {most:,} positions, prompt and "
                f"answer together; allowed: an integer in [1, {limit}]"
            )


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes of keys and values one token adds to a decoding's cache (every layer, full attention: an upper bound
    for models whose layers keep less)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", 1) or 1
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or getattr(text, "hidden_size", heads) // heads
    return 2 * int(getattr(text, "num_hidden_layers", 1)) * int(kv_heads) * int(head_dim) * dtype_bytes


def decoding_rows(cfg: DictConfig) -> list[tuple[str, int, int]]:
    """(key, rows decoded at once, answer tokens) of the run's largest decodings: an evaluation's episodes, a Kuhn
    table's sampled answers (one information set's in one call), a SEPO batch's rollouts."""

    def capped(rows: int, cap: int) -> int:
        return min(rows, cap) if cap > 0 else rows

    stage, rows = cfg.stage.name, []
    at_once = episodes_at_once(cfg)
    if "eval.episodes_per_opponent" in at_once:
        rows.append(
            (
                "eval.episodes_per_opponent",
                capped(at_once["eval.episodes_per_opponent"], cfg.eval.batch_size),
                cfg.eval.max_new_tokens,
            )
        )
        if cfg.game.name == "kuhn":
            rows.append(
                ("eval.action_samples", capped(cfg.eval.action_samples, cfg.eval.batch_size), cfg.eval.max_new_tokens)
            )
    if "sepo.rollouts_per_opponent" in at_once:
        rows.append(
            (
                "sepo.rollouts_per_opponent",
                capped(at_once["sepo.rollouts_per_opponent"], cfg.sepo.generate_batch),
                cfg.sepo.max_new_tokens,
            )
        )
        if cfg.game.name == "kuhn" and stage in ("sepo", "pipeline"):
            rows.append(("sepo.best_response_samples", cfg.sepo.best_response_samples, cfg.eval.max_new_tokens))
    return rows


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (MemAvailable), or None where it cannot say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def episodes_at_once(cfg: DictConfig) -> dict[str, int]:
    """key -> the episodes a stage holds at once because of it: an evaluation plays every distinct opponent
    of all pools in lockstep, a SEPO batch n rollouts per opponent of the train, exploit and collusive pools."""
    pools = cfg.game.pools
    out = {}
    if cfg.stage.name in EVALUATING_STAGES:
        distinct = {n for pool in POOLS for n in pools.get(pool) or []}
        out["eval.episodes_per_opponent"] = cfg.eval.episodes_per_opponent * len(distinct)
    if cfg.stage.name in RL_STAGES:
        n = rollouts_per_group(cfg.sepo)
        out["sepo.rollouts_per_opponent"] = sum(
            n[pool] * len(set(pools.get(pool) or [])) for pool in penalties.trained_pools()
        )
    return out


def check_sizes(cfg: DictConfig) -> None:
    """Episode counts whose memory alone (`eval.episode_memory_kb` each, an estimate) exceeds what this
    machine has left are refused before any work, instead of growing until the kernel kills the run."""
    available = available_memory()
    if available is None:
        return
    per_episode = cfg.eval.episode_memory_kb * 1024
    for key, episodes in episodes_at_once(cfg).items():
        need = episodes * per_episode
        if need > available:
            value = OmegaConf.select(cfg, key)
            most = max(1, int(value * available / need))
            raise ConfigError(
                f"{key}={value} is not allowed on this machine: {episodes:,} episodes at once need about "
                f"{need / 2**30:,.1f} GiB ({cfg.eval.episode_memory_kb} KiB each, eval.episode_memory_kb) and "
                f"{available / 2**30:,.1f} GiB are available; allowed: at most about {most:,}"
            )


def device_memory() -> int | None:
    """Bytes the run's decoding can still use: the GPU's free memory, or this machine's available memory."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    return available_memory()


def check_memory(config: Any, cfg: DictConfig) -> None:
    """A decoding's KV cache for its answers alone (prompts add more) fits in the memory the device has left."""
    import torch

    from sepo.models import resolve_dtype

    free = device_memory()
    if free is None:
        return
    dtype = resolve_dtype(cfg.model.get("dtype", "float32"), "cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = getattr(config, "torch_dtype", None) or torch.float32
    per_token = kv_bytes_per_token(config, torch.empty((), dtype=dtype).element_size())
    for key, rows, tokens in decoding_rows(cfg):
        need = int(rows) * int(tokens) * per_token
        if need > free:
            raise ConfigError(
                f"{key}={OmegaConf.select(cfg, key)} is not allowed on this machine: {rows:,} answers of up to {tokens:,} tokens decoded "
                f"at once need {need / 2**30:,.1f} GiB of keys and values, and {free / 2**30:,.1f} GiB are free; allowed: "
                "fewer (or a smaller batch: eval.batch_size, sepo.generate_batch)"
            )


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:200]
