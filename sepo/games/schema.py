"""The keys every game's config has (conf/game/<game>.yaml): each game's own schema extends `GameSchema`
with its rules' keys (`sepo/games/<game>/config.py`), and Hydra composes the game node onto it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class PoolsSchema:
    train: list[str] = MISSING
    exploit: list[str] = MISSING
    collusive: list[str] = MISSING
    robust: list[str] = MISSING


@dataclass
class GameDatagenSchema:
    episodes_per_opponent: int = MISSING
    opponents: list[str] | None = MISSING
    random_strategy: str = MISSING


@dataclass
class GameSchema:
    """The keys every game's YAML has; each game adds its rules' own (conf/game/<game>.yaml)."""

    name: str = MISSING
    sft_dataset: str = MISSING
    rounds: int = MISSING
    max_payoff: float = MISSING
    mirrored: bool = MISSING
    reference_strategy: str = MISSING
    strategy_params: dict[str, Any] = field(default_factory=dict)  # each strategy checks its own (sepo.games.strategy)
    pools: PoolsSchema = field(default_factory=PoolsSchema)
    demonstrators: dict[str, float] = MISSING
    datagen: GameDatagenSchema = field(default_factory=GameDatagenSchema)


@dataclass
class GameTrainingSchema:
    """A game's own SEPO settings, which win over the stage's defaults (conf/sepo/default.yaml)."""

    lr: float = MISSING
    beta: float = MISSING
