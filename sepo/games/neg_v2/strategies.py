"""Negotiation v2 strategies (docs/spec.md §2): opponents and demonstrators.

All are stateless: they read the pool, their own values, the round and the history of demands
from the observation (`sepo.games.neg_v2.NegotiationV2.observation`). "Top-valued item" means the
item with the highest own value per unit; ties go to the lower index (books, then hats, then balls),
see `top_items`. Choices the spec leaves open:

- ConcedeNeg demands its top item only: the whole pool of it in round 1, one unit less each later
  round, never below floor(pool/2) (the fair half, as Neg v1's Concede stops at 5); 0 of the others.
  The concession follows the round index, whatever the agent did.
- HardballNeg drops its lowest-valued item; with tied values the later item is dropped.
- Adaptive lowers its demand cumulatively: each breakdown so far takes one unit off the then-largest
  demand (ties: the item it values less, then the later-listed one), never below 0.
- Conservative is registered as an alias of FairNeg.
"""

from __future__ import annotations

import math
from typing import Any

from sepo.games.neg_v2.rules import format_demand, top_items
from sepo.games.strategy import Strategy, register


def _fair(pool) -> list[int]:
    return [n // 2 for n in pool]


@register("neg_v2", "FairNeg", "Conservative")
class FairNeg(Strategy):
    """Half of each item, rounded down: never causes a breakdown against another fair player."""

    def act(self, obs, legal, rng):
        return format_demand(_fair(obs["pool"]))


@register("neg_v2", "TFTNeg")
class TFTNeg(Strategy):
    """Fair first, then leaves the agent exactly what it asked for last round (pool - its demand)."""

    def act(self, obs, legal, rng):
        pool = obs["pool"]
        if not obs["history"]:
            return format_demand(_fair(pool))
        last = obs["history"][-1]["opp_demand"]
        return format_demand(min(max(n - d, 0), n) for n, d in zip(pool, last))


@register("neg_v2", "ConcedeNeg")
class ConcedeNeg(Strategy):
    """Top item only: whole pool, then one unit less per round down to floor(pool/2); 0 of others."""

    def act(self, obs, legal, rng):
        pool, top = obs["pool"], top_items(obs["values"])[0]
        demand = [0] * len(pool)
        demand[top] = max(pool[top] // 2, pool[top] - obs["round"])
        return format_demand(demand)


@register("neg_v2", "GreedyNeg")
class GreedyNeg(Strategy):
    """The whole pool of every item: a deal only if the other player asks for nothing."""

    def act(self, obs, legal, rng):
        return format_demand(obs["pool"])


@register("neg_v2", "HardballNeg")
class HardballNeg(Strategy):
    """The whole pool of its two highest-valued items, 0 of the third (tie: the later item is dropped)."""

    def act(self, obs, legal, rng):
        pool = obs["pool"]
        keep = set(top_items(obs["values"])[:2])
        return format_demand(n if i in keep else 0 for i, n in enumerate(pool))


@register("neg_v2", "RandomNeg")
class RandomNeg(Strategy):
    """Uniform over every legal demand (the robust pool)."""

    def probs(self, obs, legal):
        return {a: 1.0 / len(legal) for a in legal}


# ----------------------------------------------------------------------------- demonstrators
def _proportional(obs: dict[str, Any]) -> list[int]:
    """ceil(pool/2) of items it values above value_total / n_items (10/3), floor(pool/2) of the rest."""
    threshold = obs["value_total"] / len(obs["pool"])
    return [math.ceil(n / 2) if v > threshold else n // 2 for n, v in zip(obs["pool"], obs["values"])]


@register("neg_v2", "Proportional")
class Proportional(Strategy):
    """Asks for the larger half of the items it values most, the smaller half of the others."""

    def act(self, obs, legal, rng):
        return format_demand(_proportional(obs))


@register("neg_v2", "Adaptive")
class Adaptive(Strategy):
    """Proportional, conceding one unit after every breakdown so far (cumulative).

    Each breakdown in the history takes one unit off the currently largest demand; among equal
    demands it gives up the item it values less, then the later-listed one. Cumulative concessions
    let it reach a deal with a hard opponent instead of repeating the same breakdown.
    """

    def act(self, obs, legal, rng):
        demand = _proportional(obs)
        values = obs["values"]
        for _ in range(sum(1 for h in obs["history"] if not h["deal"])):
            if max(demand) == 0:
                break
            i = max(range(len(demand)), key=lambda j: (demand[j], -values[j], j))
            demand[i] -= 1
        return format_demand(demand)


@register("neg_v2", "Defensive")
class Defensive(Strategy):
    """ceil(pool/2) of its top-valued item only, 0 of the others: a modest, safe ask."""

    def act(self, obs, legal, rng):
        pool, top = obs["pool"], top_items(obs["values"])[0]
        demand = [0] * len(pool)
        demand[top] = math.ceil(pool[top] / 2)
        return format_demand(demand)
