"""Negotiation v1's config keys (conf/game/neg_v1.yaml): their types, allowed values and the rule between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from sepo.config_rules import integer
from sepo.games.schema import GameSchema


@dataclass
class NegV1Schema(GameSchema):
    pie: int = MISSING
    min_demand: int = MISSING
    max_demand: int = MISSING


SCHEMA = NegV1Schema
KEY_RULES = {"pie": integer(1), "min_demand": integer(0), "max_demand": integer(1)}


def check(game: Any) -> str | None:
    if game.min_demand > game.max_demand:
        return (
            f"game.min_demand={game.min_demand} and game.max_demand={game.max_demand}: no demand is legal; "
            f"allowed: game.min_demand <= game.max_demand"
        )
    return None
