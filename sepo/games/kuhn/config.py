"""Kuhn poker's config keys (conf/game/kuhn.yaml): their types and allowed values."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from sepo.config_rules import allowed, integer
from sepo.games.schema import GameSchema, GameTrainingSchema


@dataclass
class KuhnReasoningSchema:
    name_the_check: bool = MISSING
    phrasings: int = allowed(integer(0))


@dataclass
class KuhnSchema(GameSchema):
    ante: int = allowed(integer(1))
    bet: int = allowed(integer(1))
    reasoning: KuhnReasoningSchema = field(default_factory=KuhnReasoningSchema)
    training: GameTrainingSchema = field(default_factory=GameTrainingSchema)


SCHEMA = KuhnSchema
