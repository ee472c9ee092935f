"""The IPD's config keys (conf/game/ipd.yaml): their types and allowed values (a boolean needs no rule)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from sepo.games.matrix import PayoffsSchema
from sepo.games.schema import GameSchema


@dataclass
class IpdReasoningSchema:
    name_the_last_move: bool = MISSING


@dataclass
class IpdSchema(GameSchema):
    payoffs: PayoffsSchema = field(default_factory=PayoffsSchema)
    state_last_move: bool = MISSING
    reasoning: IpdReasoningSchema = field(default_factory=IpdReasoningSchema)


SCHEMA = IpdSchema
