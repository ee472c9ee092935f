"""The IPD's config keys (conf/game/ipd.yaml): their types and allowed values."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from sepo.config_rules import boolean, finite
from sepo.games.schema import GameSchema


@dataclass
class IpdPayoffsSchema:
    reward: float = MISSING
    punishment: float = MISSING
    temptation: float = MISSING
    sucker: float = MISSING


@dataclass
class IpdReasoningSchema:
    name_the_last_move: bool = MISSING


@dataclass
class IpdSchema(GameSchema):
    payoffs: IpdPayoffsSchema = field(default_factory=IpdPayoffsSchema)
    state_last_move: bool = MISSING
    reasoning: IpdReasoningSchema = field(default_factory=IpdReasoningSchema)


SCHEMA = IpdSchema
KEY_RULES = {
    **{f"payoffs.{k}": finite() for k in ("reward", "punishment", "temptation", "sucker")},
    "state_last_move": boolean(),
    "reasoning.name_the_last_move": boolean(),
}
