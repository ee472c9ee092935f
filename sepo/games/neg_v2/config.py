"""Negotiation v2's config keys (conf/game/neg_v2.yaml): their types, allowed values and the rule between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sepo.config_rules import allowed, distinct_names, integer
from sepo.games.schema import GameSchema


@dataclass
class NegV2Schema(GameSchema):
    item_names: list[str] = allowed(distinct_names())
    pool_min: int = allowed(integer(0))
    pool_max: int = allowed(integer(1))
    value_total: int = allowed(integer(1))


SCHEMA = NegV2Schema


def check(game: Any) -> str | None:
    if game.pool_min > game.pool_max:
        return (
            f"game.pool_min={game.pool_min} and game.pool_max={game.pool_max}: no pool size can be drawn; "
            "allowed: game.pool_min <= game.pool_max"
        )
    return None
