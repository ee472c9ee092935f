"""Negotiation v2's config keys (conf/game/neg_v2.yaml): their types, allowed values and the rule between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from sepo.config_rules import distinct_names, integer
from sepo.games.schema import GameSchema


@dataclass
class NegV2Schema(GameSchema):
    item_names: list[str] = MISSING
    pool_min: int = MISSING
    pool_max: int = MISSING
    value_total: int = MISSING


SCHEMA = NegV2Schema
KEY_RULES = {"item_names": distinct_names(), "pool_min": integer(0), "pool_max": integer(1), "value_total": integer(1)}


def check(game: Any) -> str | None:
    if game.pool_min > game.pool_max:
        return (
            f"game.pool_min={game.pool_min} and game.pool_max={game.pool_max}: no pool size can be drawn; "
            "allowed: game.pool_min <= game.pool_max"
        )
    return None
