"""The auction's config keys (conf/game/auction.yaml): their types and allowed values."""

from __future__ import annotations

from dataclasses import dataclass

from sepo.config_rules import allowed, distinct_amounts, numbers
from sepo.games.schema import GameSchema


@dataclass
class AuctionSchema(GameSchema):
    bids: dict[str, int] = allowed(distinct_amounts(0))
    private_values: list[int] = allowed(numbers(0.0))


SCHEMA = AuctionSchema
