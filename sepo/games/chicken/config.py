"""Chicken's config keys (conf/game/chicken.yaml): their types, allowed values and the order of the payoffs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sepo.games.matrix import PayoffsSchema
from sepo.games.schema import GameSchema


@dataclass
class ChickenSchema(GameSchema):
    payoffs: PayoffsSchema = field(default_factory=PayoffsSchema)


SCHEMA = ChickenSchema


def check(game: Any) -> str | None:
    """The payoffs in Chicken's order; in another order the game is another one (the IPD's, a Stag Hunt)."""
    p = game.payoffs
    if not p.temptation > p.reward > p.sucker > p.punishment:
        return (
            f"game.payoffs: temptation={p.temptation:g}, reward={p.reward:g}, sucker={p.sucker:g}, "
            f"punishment={p.punishment:g} is not Chicken; allowed: temptation > reward > sucker > punishment"
        )
    return None
