"""The keys every game's config has (conf/game/<game>.yaml), with their allowed values: each game's own schema
extends `GameSchema` with its rules' keys (`sepo/games/<game>/config.py`), and Hydra composes the game node
onto it. A field's rule is its metadata (`allowed`, sepo/config_rules.py); the config check reads it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from sepo.config_rules import allowed, integer, non_empty_name, real, unchecked

#: the pools and the strategies in them: sepo.run.config.validate_pools and check_strategies check each name
STRATEGY_NAMES = "strategies of the game, checked by sepo.run.config.check_strategies"


@dataclass
class PoolsSchema:
    train: list[str] = unchecked(STRATEGY_NAMES)
    exploit: list[str] = unchecked(STRATEGY_NAMES)
    collusive: list[str] = unchecked(STRATEGY_NAMES)
    robust: list[str] = unchecked(STRATEGY_NAMES)


@dataclass
class GameDatagenSchema:
    episodes_per_opponent: int = allowed(integer(1))
    opponents: list[str] | None = unchecked(STRATEGY_NAMES)
    random_strategy: str = unchecked("a strategy of the game, built when the demonstrators play")


@dataclass
class GameSchema:
    """The keys every game's YAML has; each game adds its rules' own (conf/game/<game>.yaml)."""

    name: str = unchecked("one of the games (sepo/games/), checked by sepo.run.config.check_settings")
    sft_dataset: str = allowed(non_empty_name())
    rounds: int = allowed(integer(1))
    max_payoff: float = allowed(real(0.0, strict=True))
    mirrored: bool = MISSING
    reference_strategy: str = unchecked(STRATEGY_NAMES)
    strategy_params: dict[str, Any] = unchecked(
        "each strategy's own, checked when sepo.run.config.check_strategies builds it", default_factory=dict
    )
    pools: PoolsSchema = field(default_factory=PoolsSchema)
    demonstrators: dict[str, float] = unchecked(STRATEGY_NAMES + " (weights >= 0 with a positive sum)")
    datagen: GameDatagenSchema = field(default_factory=GameDatagenSchema)


@dataclass
class GameTrainingSchema:
    """A game's own SEPO settings, which win over the stage's defaults (conf/sepo/default.yaml)."""

    lr: float = allowed(real(0.0, strict=True))
    beta: float = allowed(real(0.0))
