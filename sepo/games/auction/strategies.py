"""Auction strategies (docs/spec.md §2): opponents, robust-pool variants and demonstrators.

Bids are read from the observation's public `bid_amounts` (ordered low to high) and the `legal`
list, never hard-coded, so a config with other bid amounts or values keeps each rule's meaning.
"Truthful" is read as "bid your value, capped at the highest bid": the largest bid not above the
value (2 -> MEDIUM, 4 -> HIGH with the default bids); Shaded is one bid below that.

Numeric knobs (noise rate, Adaptive's opening bid) are constructor arguments whose defaults are
the values in conf/game/auction.yaml `strategy_params`; a test keeps the two equal.
"""

from __future__ import annotations

from typing import Any

from sepo.config_rules import Rule, one_of, probability
from sepo.games.auction.rules import OPP, OWN
from sepo.games.strategy import Strategy, register


def _truthful(obs: dict[str, Any], legal: list[str]) -> str:
    """The largest bid not above the current value (the lowest bid if all are above it)."""
    fitting = [a for a in legal if obs["bid_amounts"][a] <= obs["value"]]
    return fitting[-1] if fitting else legal[0]


def _shift(legal: list[str], action: str, steps: int) -> str:
    """`action` moved `steps` bids up (negative: down), clipped to the legal range."""
    i = min(max(legal.index(action) + steps, 0), len(legal) - 1)
    return legal[i]


@register("auction", "Truthful", "ValueBid")
class Truthful(Strategy):
    """Bid the value, capped at the highest bid (2 -> MEDIUM, 4 -> HIGH). ValueBid is this strategy."""

    def act(self, obs, legal, rng):
        return _truthful(obs, legal)


@register("auction", "Shaded")
class Shaded(Strategy):
    """One bid below Truthful (2 -> LOW, 4 -> MEDIUM)."""

    def act(self, obs, legal, rng):
        return _shift(legal, _truthful(obs, legal), -1)


@register("auction", "Conservative")
class Conservative(Strategy):
    """Always the lowest bid."""

    def act(self, obs, legal, rng):
        return legal[0]


@register("auction", "CollusiveLow")
class CollusiveLow(Conservative):
    """Always the lowest bid: the partner that invites price suppression (collusive pool)."""


@register("auction", "Aggressive")
class Aggressive(Strategy):
    """Always the highest bid (the paper's AggressiveBid exploiter)."""

    def act(self, obs, legal, rng):
        return legal[-1]


@register("auction", "Adaptive")
class Adaptive(Strategy):
    """Reacts to the other player's last bid: one bid above it after losing, one below after winning.

    After a tie (neither won nor lost) it matches the other's last bid. The spec leaves the first
    round open; it opens with `first` (MEDIUM, the middle bid: no information yet either way).
    """

    @classmethod
    def param_rules(cls, game_cfg: Any) -> dict[str, Rule]:
        return {"first": one_of(*game_cfg.bids)}

    def __init__(self, first: str = "MEDIUM"):
        self.first = first

    def act(self, obs, legal, rng):
        if not obs["history"]:
            return self.first if self.first in legal else legal[len(legal) // 2]
        last = obs["history"][-1]
        step = {OPP: +1, OWN: -1}.get(last["winner"], 0)
        return _shift(legal, last["opp"], step)


@register("auction", "AggressiveValue")
class AggressiveValue(Strategy):
    """Truthful, but one bid higher (at most the highest) in the round after it lost (demonstrator)."""

    def act(self, obs, legal, rng):
        bid = _truthful(obs, legal)
        lost = bool(obs["history"]) and obs["history"][-1]["winner"] == OPP
        return _shift(legal, bid, +1) if lost else bid


@register("auction", "NoisyTruthful")
class NoisyTruthful(Strategy):
    """Truthful, but a uniformly random bid with probability `noise` (robust pool)."""

    PARAMS = {"noise": probability()}

    def __init__(self, noise: float = 0.2):
        self.noise = noise

    def probs(self, obs, legal):
        dist = {a: self.noise / len(legal) for a in legal}
        dist[_truthful(obs, legal)] += 1.0 - self.noise
        return dist


@register("auction", "Random")
class RandomBid(Strategy):
    """A uniformly random bid."""

    def probs(self, obs, legal):
        return {a: 1.0 / len(legal) for a in legal}
