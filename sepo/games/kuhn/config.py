"""Kuhn poker's config keys (conf/game/kuhn.yaml): their types and allowed values."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from sepo.config_rules import boolean, integer, real
from sepo.games.schema import GameSchema, GameTrainingSchema


@dataclass
class KuhnReasoningSchema:
    name_the_check: bool = MISSING
    phrasings: int = MISSING


@dataclass
class KuhnSchema(GameSchema):
    ante: int = MISSING
    bet: int = MISSING
    reasoning: KuhnReasoningSchema = field(default_factory=KuhnReasoningSchema)
    training: GameTrainingSchema = field(default_factory=GameTrainingSchema)


SCHEMA = KuhnSchema
KEY_RULES = {
    "ante": integer(1),
    "bet": integer(1),
    "reasoning.name_the_check": boolean(),
    "reasoning.phrasings": integer(0),
    "training.lr": real(0.0, strict=True),
    "training.beta": real(0.0),
}
