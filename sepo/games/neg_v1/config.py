"""Negotiation v1's config keys (conf/game/neg_v1.yaml): their types, allowed values and the rule between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sepo.config_rules import allowed, integer
from sepo.games.schema import GameSchema


@dataclass
class NegV1Schema(GameSchema):
    pie: int = allowed(integer(1))
    min_demand: int = allowed(integer(0))
    max_demand: int = allowed(integer(1))


SCHEMA = NegV1Schema


def check(game: Any) -> str | None:
    if game.min_demand > game.max_demand:
        return (
            f"game.min_demand={game.min_demand} and game.max_demand={game.max_demand}: no demand is legal; "
            f"allowed: game.min_demand <= game.max_demand"
        )
    return None
