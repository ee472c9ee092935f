"""Negotiation v1 strategies (docs/spec.md §2): opponents, robust-pool variants and demonstrators.

Demands are action strings ("1".."9"); every rule clips to the `legal` range. The fair demand is
half the pie from the observation (5 of 10). Fixed demands and Concede's schedule are constructor
arguments whose defaults are the values in conf/game/neg_v1.yaml `strategy_params`; a test keeps
the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sepo.config_rules import integer, integers
from sepo.games.strategy import Strategy, register


def _clip(legal: list[str], demand: int) -> str:
    lo, hi = int(legal[0]), int(legal[-1])
    return str(min(max(demand, lo), hi))


def _fair(obs: dict[str, Any]) -> int:
    return obs["pie"] // 2


@register("neg_v1", "Fair", "FairSplit")
class Fair(Strategy):
    """Half the pie every round (5). FairSplit is this strategy."""

    def act(self, obs, legal, rng):
        return _clip(legal, _fair(obs))


class FixedDemand(Strategy):
    """The same demand every round."""

    PARAMS = {"demand": integer(0)}

    def __init__(self, demand: int):
        self.demand = int(demand)

    def act(self, obs, legal, rng):
        return _clip(legal, self.demand)


@register("neg_v1", "Balanced")
class Balanced(FixedDemand):
    """Demands 6: slightly above fair."""

    def __init__(self, demand: int = 6):
        super().__init__(demand)


@register("neg_v1", "Selfish")
class Selfish(FixedDemand):
    """Demands 7 (the paper's SelfishSplit exploiter)."""

    def __init__(self, demand: int = 7):
        super().__init__(demand)


@register("neg_v1", "Hard")
class Hard(FixedDemand):
    """Demands 8 (the paper's HardballSplit exploiter)."""

    def __init__(self, demand: int = 8):
        super().__init__(demand)


@register("neg_v1", "Concede")
class Concede(Strategy):
    """Demands follow `schedule` by round (8, 7, 6, 5); later rounds keep its last entry."""

    PARAMS = {"schedule": integers(0)}

    def __init__(self, schedule: Sequence[int] = (8, 7, 6, 5)):
        self.schedule = [int(d) for d in schedule]

    def act(self, obs, legal, rng):
        return _clip(legal, self.schedule[min(obs["round"], len(self.schedule) - 1)])


@register("neg_v1", "TFTNeg")
class TFTNeg(Strategy):
    """Fair first, then pie minus the other player's last demand, clipped to the legal range."""

    def act(self, obs, legal, rng):
        if not obs["history"]:
            return _clip(legal, _fair(obs))
        return _clip(legal, obs["pie"] - int(obs["history"][-1]["opp"]))


@register("neg_v1", "Random")
class RandomDemand(Strategy):
    """A uniformly random demand."""

    def probs(self, obs, legal):
        return {a: 1.0 / len(legal) for a in legal}
