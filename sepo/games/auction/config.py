"""The auction's config keys (conf/game/auction.yaml): their types and allowed values."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from sepo.config_rules import distinct_amounts, numbers
from sepo.games.schema import GameSchema


@dataclass
class AuctionSchema(GameSchema):
    bids: dict[str, int] = MISSING
    private_values: list[int] = MISSING


SCHEMA = AuctionSchema
KEY_RULES = {"bids": distinct_amounts(0), "private_values": numbers(0.0)}
