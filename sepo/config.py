"""Config validation, run before any heavy work.

Errors name the key and the allowed values (`ConfigError`, turned into one line by the task
wrapper); a strategy listed in two pools is only a warning, because the paper's own pool table
reuses Hard, Fair, FairNeg and NashApx.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from omegaconf import DictConfig

from sepo.errors import ConfigError
from sepo.games import GAME_CLASSES
from sepo.metrics import POOLS
from sepo.stages import STAGES
from sepo.strategies import known_strategies, make_strategy

log = logging.getLogger(__name__)

MODEL_KINDS = ("scripted", "tiny", "gemma4", "qwen")
#: models built by the code itself; every other language model is loaded from `model.path`
BUILT_MODELS = ("scripted", "tiny")


class PoolOverlapWarning(UserWarning):
    """A strategy sits in more than one opponent pool."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_number(key: str, value: Any, minimum: float | None = None, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    _require(isinstance(value, kind) and not isinstance(value, bool),
             f"{key}={value!r} must be {'an integer' if integer else 'a number'}")
    if minimum is not None:
        _require(value >= minimum, f"{key}={value!r} must be >= {minimum:g}")


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
    _require(cfg.game.max_payoff > 0, f"game.max_payoff={cfg.game.max_payoff} must be > 0")
    for line in validate_pools(game, cfg.game.pools):
        warnings.warn(f"pool overlap: {line}", PoolOverlapWarning, stacklevel=2)
        log.warning("pool overlap: %s", line)

    known = known_strategies(game)
    for name, weight in cfg.game.demonstrators.items():
        _require(name in known, f"game.demonstrators: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
        _check_number(f"game.demonstrators.{name}", weight, minimum=0.0)
    for name in cfg.game.datagen.get("opponents") or []:
        _require(name in known, f"game.datagen.opponents: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")

    configured = {n for pool in POOLS for n in cfg.game.pools.get(pool) or []} | set(cfg.game.demonstrators)
    for name in sorted(configured):  # builds each with its strategy_params: bad params fail here
        make_strategy(cfg.game, name, key="game.pools")

    _require(cfg.model.name in MODEL_KINDS, f"model={cfg.model.name} is not a known model; allowed: {', '.join(MODEL_KINDS)}")
    if cfg.model.name == "scripted":
        name = cfg.model.strategy or cfg.game.reference_strategy
        _require(name in known, f"model.strategy: unknown {game} strategy {name!r}; allowed: {', '.join(known)}")
    elif cfg.model.name not in BUILT_MODELS:
        _require(bool(cfg.model.get("path")), f"model.path is not set for model={cfg.model.name}; set model.path to "
                 "a local checkpoint directory (or a hub id already in the Hugging Face cache)")

    _check_number("eval.episodes_per_opponent", cfg.eval.episodes_per_opponent, minimum=1, integer=True)
    if cfg.game.get("mirrored"):
        _require(cfg.eval.episodes_per_opponent % 2 == 0,
                 f"eval.episodes_per_opponent={cfg.eval.episodes_per_opponent} must be even for {game} "
                 "(episodes are dealt in seat-swapped pairs)")
    _require(cfg.resume in ("auto", "never"), f"resume={cfg.resume} is not allowed; allowed: auto, never")
    _require(0.0 < cfg.datagen.valid_fraction < 1.0, f"datagen.valid_fraction={cfg.datagen.valid_fraction} must be in (0, 1)")
