"""Config validation, run before any heavy work.

Errors name the key and the allowed values (`ConfigError`, turned into one line by the task
wrapper); a strategy listed in two pools is only a warning, because the paper's own pool table
reuses Hard, Fair, FairNeg and NashApx.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sepo.errors import ConfigError
from sepo.paths import can_hold_outputs
from sepo.games import GAME_CLASSES
from sepo.metrics import POOLS
from sepo.stages import STAGES
from sepo.strategies import known_strategies, make_strategy, responds_to_agent

log = logging.getLogger(__name__)

MODEL_KINDS = ("scripted", "tiny", "gemma4", "qwen")
#: models built by the code itself; every other language model is loaded from `model.path`
BUILT_MODELS = ("scripted", "tiny")
#: stages that train the model (a scripted agent has nothing to train)
TRAINING_STAGES = ("sft", "sepo", "pipeline")


class PoolOverlapWarning(UserWarning):
    """A strategy sits in more than one opponent pool."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_number(key: str, value: Any, minimum: float | None = None, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    allowed = ("an integer" if integer else "a number") + (f" >= {minimum:g}" if minimum is not None else "")
    _require(isinstance(value, kind) and not isinstance(value, bool) and (minimum is None or value >= minimum),
             f"{key}={value!r} is not allowed; allowed: {allowed}")


# ------------------------------------------------------------------------------ every number a run reads
def _int(low: int, high: int | None = None, optional: bool = False):
    def ok(v: Any) -> bool:
        if v is None:
            return optional
        return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v < high)
    text = f"an integer >= {low}" + (f" and < {high}" if high is not None else "") + (", or null" if optional else "")
    return ok, text


def _real(low: float, strict: bool = False, high: float | None = None):
    def ok(v: Any) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v > low if strict else v >= low) and (high is None or v < high))
    text = f"a number {'>' if strict else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
    return ok, text


def _steps_list():
    return (lambda v: isinstance(v, (list, tuple)) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                                          for s in v),
            "a list of integers >= 1 (e.g. [25,50,75]) or []")


SEED = _int(0, 2**32)  # numpy's seeds
#: (stages the key matters to, key, (check, allowed values)); `all` = every stage. Checked before any work.
RULES = [
    ("all", "seed", SEED),
    ("all", "generation_seed", SEED),
    ("eval sft sepo pipeline", "eval.episodes_per_opponent", _int(1)),
    ("eval sft sepo pipeline", "eval.temperature", _real(0.0)),
    ("eval sft sepo pipeline", "eval.max_new_tokens", _int(1)),
    ("eval sft sepo pipeline", "eval.batch_size", _int(0)),
    ("eval sft sepo pipeline", "eval.action_samples", _int(2)),
    ("sepo pipeline", "eval.validation_seed", SEED),
    ("datagen sft pipeline", "datagen.seed", SEED),
    ("datagen sft pipeline", "datagen.num_opponents", _int(1)),
    ("datagen sft pipeline", "datagen.multi_per_game", _int(1)),
    ("datagen sft pipeline", "datagen.episodes_per_opponent", _int(1, optional=True)),
    ("sft pipeline", "sft.lr", _real(0.0, strict=True)),
    ("sft pipeline", "sft.epochs", _real(0.0, strict=True)),
    ("sft pipeline", "sft.max_steps", _int(1, optional=True)),
    ("sft pipeline", "sft.max_examples", _int(1, optional=True)),
    ("sft pipeline", "sft.max_valid_examples", _int(1, optional=True)),
    ("sft pipeline", "sft.per_device_batch_size", _int(1)),
    ("sft pipeline", "sft.grad_accum", _int(1)),
    ("sft pipeline", "sft.eval_batch_size", _int(1)),
    ("sft pipeline", "sft.agreement_examples", _int(0)),
    ("sft pipeline", "sft.weight_decay", _real(0.0)),
    ("sft pipeline", "sft.max_grad_norm", _real(0.0, strict=True)),
    ("sft pipeline", "sft.lora.r", _int(1)),
    ("sft pipeline", "sft.lora.dropout", _real(0.0, high=1.0)),
    ("sft pipeline", "sft.seed", SEED),
    ("sepo pipeline", "sepo.steps", _int(1)),
    ("sepo pipeline", "sepo.lr", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.lr_final_ratio", (lambda v: _real(0.0)[0](v) and v <= 1.0, "a number in [0, 1]")),
    ("sepo pipeline", "sepo.temperature", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.max_new_tokens", _int(1)),
    ("sepo pipeline", "sepo.aux_episodes", _int(1)),
    ("sepo pipeline", "sepo.beta", _real(0.0)),
    ("sepo pipeline", "sepo.clip_eps", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.grad_clip", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.weight_decay", _real(0.0)),
    ("sepo pipeline", "sepo.reward_scale", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.refresh_steps", _int(1)),
    ("sepo pipeline", "sepo.refresh_kl", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.micro_batch", _int(1)),
    ("sepo pipeline", "sepo.logprob_chunk", _int(1)),
    ("sepo pipeline", "sepo.checkpoint_steps", _steps_list()),
    ("sepo pipeline", "sepo.best_response_every", _int(1)),
    ("sepo pipeline", "sepo.best_response_samples", _int(2)),
    ("sepo pipeline", "sepo.lora.r", _int(1)),
    ("sepo pipeline", "sepo.lora.alpha", _real(0.0, strict=True)),
    ("sepo pipeline", "sepo.lora.dropout", _real(0.0, high=1.0)),
]


def check_rules(cfg: DictConfig) -> None:
    stage = cfg.stage.name
    for stages, key, (ok, allowed) in RULES:
        if stages != "all" and stage not in stages.split():
            continue
        value = OmegaConf.select(cfg, key, default=None)
        value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        _require(ok(value), f"{key}={value!r} is not allowed; allowed: {allowed}")


TORCH_DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
LOGGER_MODES = ("offline", "online", "disabled")


def check_model_and_logger(cfg: DictConfig) -> None:
    dtype = cfg.model.get("dtype")
    if cfg.model.name != "scripted":
        _require(dtype in TORCH_DTYPES, f"model.dtype={dtype} is not allowed; allowed: {', '.join(TORCH_DTYPES)}")
    if cfg.logger.get("name") == "wandb":
        mode = cfg.logger.get("mode")
        _require(mode in LOGGER_MODES, f"logger.mode={mode} is not allowed; allowed: {', '.join(LOGGER_MODES)}")
        for key in ("project", "group"):
            value = cfg.logger.get(key)
            _require(isinstance(value, str) and value.strip() != "",
                     f"logger.{key}={value!r} is not allowed; allowed: a non-empty name")
        entity = cfg.logger.get("entity")
        _require(entity is None or (isinstance(entity, str) and entity.strip() != ""),
                 f"logger.entity={entity!r} is not allowed; allowed: null (your default) or a team or user name")
        tags = OmegaConf.to_container(cfg.logger.tags) if OmegaConf.is_config(cfg.logger.get("tags")) else cfg.logger.get("tags")
        _require(isinstance(tags, list) and all(isinstance(x, str) for x in tags),
                 f"logger.tags={tags!r} is not allowed; allowed: a list of strings, e.g. [ablation]")


def in_hub_cache(repo_id: str, revision: str | None) -> bool:
    """Whether the hub id's config is in the local Hugging Face cache (no network is touched)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return isinstance(found, str)


def hub_download_hint(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (f"model.path={repo_id} is not in the Hugging Face cache and model.download=false; allowed: a local copy "
            f"(`hf download {repo_id}{rev}` where the hub is reachable, then model.path=<its directory> or the same "
            "hub id), or model.download=true to fetch it now")


def check_paths(cfg: DictConfig) -> None:
    """Paths a run will read or write, checked before any work (not deep inside a loader)."""
    root = str(cfg.paths.root_dir)
    _require(can_hold_outputs(root),
             f"paths.root_dir={root} is not allowed; allowed: a writable directory (or one that can be created)")
    path = cfg.model.get("path")
    if path:
        local = Path(str(path)).expanduser()
        looks_like_hub_id = not str(path).startswith((".", "/", "~")) and str(path).count("/") == 1
        _require(local.is_dir() or looks_like_hub_id,
                 f"model.path={path} is not allowed; allowed: an existing checkpoint directory, or a hub id "
                 "(org/name) already in the Hugging Face cache")
        if looks_like_hub_id and not local.is_dir() and not cfg.model.get("download", False):
            _require(in_hub_cache(str(path), cfg.model.get("revision")), hub_download_hint(str(path), cfg.model.get("revision")))


def validate_pools(game: str, pools: Any, key: str = "game.pools") -> list[str]:
    """Check pool names; return one warning line per strategy found in several pools."""
    unknown_pools = set(pools) - set(POOLS)
    _require(not unknown_pools, f"{key}: unknown pool(s) {sorted(unknown_pools)}; allowed: {', '.join(POOLS)}")
    known = known_strategies(game)
    for pool in POOLS:
        names = list(pools.get(pool) or [])
        for name in names:
            _require(name in known, f"{key}.{pool}: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
        _require(len(set(names)) == len(names), f"{key}.{pool} lists a strategy twice: {names}")
    _require(bool(pools.get("train")), f"{key}.train must name at least one strategy")
    seen: dict[str, list[str]] = {}
    for pool in ("train", "exploit", "collusive"):
        for name in pools.get(pool) or []:
            seen.setdefault(name, []).append(pool)
    return [f"{name} is in pools {', '.join(p)} of {game}" for name, p in seen.items() if len(p) > 1]


def validate(cfg: DictConfig) -> None:
    _require(cfg.stage.name in STAGES, f"stage={cfg.stage.name} is not a known stage; allowed: {', '.join(sorted(STAGES))}")
    game = cfg.game.name
    _require(game in GAME_CLASSES, f"game={game} is not a known game; allowed: {', '.join(sorted(GAME_CLASSES))}")

    for phase in ("train", "eval"):
        for term in ("e", "c", "x"):
            key = f"lambdas.{phase}.{term}"
            value = cfg.lambdas.get(phase, {}).get(term) if cfg.lambdas.get(phase) else None
            _require(value is not None, f"{key} is missing; every game needs lambdas.{{train,eval}}.{{e,c,x}}")
            _check_number(key, value, minimum=0.0)

    _check_number("game.rounds", cfg.game.rounds, minimum=1, integer=True)
    _check_number("game.max_payoff", cfg.game.max_payoff)
    _require(cfg.game.max_payoff > 0, f"game.max_payoff={cfg.game.max_payoff} is not allowed; allowed: a number > 0")
    for line in validate_pools(game, cfg.game.pools):
        warnings.warn(f"pool overlap: {line}", PoolOverlapWarning, stacklevel=2)
        log.warning("pool overlap: %s", line)

    known = known_strategies(game)
    for name, weight in cfg.game.demonstrators.items():
        _require(name in known, f"game.demonstrators: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
        _check_number(f"game.demonstrators.{name}", weight, minimum=0.0)
    for name in cfg.game.datagen.get("opponents") or []:
        _require(name in known, f"game.datagen.opponents: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
    scripted = [n for n in known if not responds_to_agent(game, n)]  # a best responder needs an agent's table
    for key, names in (("game.demonstrators", list(cfg.game.demonstrators)),
                       ("game.datagen.opponents", list(cfg.game.datagen.get("opponents") or [])),
                       ("model.strategy", [cfg.model.strategy or cfg.game.reference_strategy]
                        if cfg.model.name == "scripted" else [])):
        for name in names:
            _require(not responds_to_agent(game, name), f"{key}: {name} responds to the agent's own table, so it can "
                     f"only sit in game.pools; allowed: {', '.join(scripted)}")

    configured = {n for pool in POOLS for n in cfg.game.pools.get(pool) or []} | set(cfg.game.demonstrators)

    for name in sorted(configured):  # builds each with its strategy_params: bad params fail here
        make_strategy(cfg.game, name, key="game.pools")

    _require(cfg.model.name in MODEL_KINDS, f"model={cfg.model.name} is not a known model; allowed: {', '.join(MODEL_KINDS)}")
    if cfg.stage.name in TRAINING_STAGES:
        _require(cfg.model.name != "scripted",
                 f"model=scripted is not allowed with stage={cfg.stage.name}: {cfg.stage.name} trains a language "
                 f"model; allowed: model={', '.join(m for m in MODEL_KINDS if m != 'scripted')}")
    if cfg.model.name == "scripted":
        name = cfg.model.strategy or cfg.game.reference_strategy
        _require(name in known, f"model.strategy: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
    elif cfg.model.name not in BUILT_MODELS:
        _require(bool(cfg.model.get("path")), f"model.path is not set for model={cfg.model.name}; set model.path to "
                 "a local checkpoint directory (or a hub id already in the Hugging Face cache)")

    _check_number("eval.episodes_per_opponent", cfg.eval.episodes_per_opponent, minimum=1, integer=True)
    if cfg.game.get("mirrored"):
        _require(cfg.eval.episodes_per_opponent % 2 == 0,
                 f"eval.episodes_per_opponent={cfg.eval.episodes_per_opponent} is not allowed for game={game} (episodes "
                 "are dealt in seat-swapped pairs); allowed: an even integer >= 2")
    _require(cfg.resume in ("auto", "never"), f"resume={cfg.resume} is not allowed; allowed: auto, never")
    _require(0.0 < cfg.datagen.valid_fraction < 1.0,
             f"datagen.valid_fraction={cfg.datagen.valid_fraction} is not allowed; allowed: a number in (0, 1)")
    check_rules(cfg)
    check_model_and_logger(cfg)
    _require(cfg.eval.get("phase") in (None, "sft"), f"eval.phase={cfg.eval.get('phase')} is not allowed; allowed: null, sft")
    if cfg.stage.name in ("sepo", "pipeline"):
        _require(cfg.eval.validation_seed != cfg.seed,
                 f"eval.validation_seed={cfg.eval.validation_seed} is not allowed with seed={cfg.seed}; allowed: any other "
                 "seed (the checkpoint is chosen on validation episodes kept apart from the reported ones)")
    check_paths(cfg)
    # the stages' own checks (enumerations, cross-key rules), run now so they too come before any work
    if cfg.stage.name in ("sft", "pipeline"):
        from sepo.stages.sft import sft_settings

        sft_settings(cfg)
    if cfg.stage.name in ("sepo", "pipeline"):
        from sepo.training.objective import sepo_settings

        sepo_settings(cfg)
