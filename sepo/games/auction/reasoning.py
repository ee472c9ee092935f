"""The auction's demonstrator reasoning: which case explains a decision, and the phrasings of each case
(`sepo.training.reasoning` draws one)."""

from __future__ import annotations

from typing import Any

from sepo.games.reasoning import Explained

#: registered alias -> the name `explain` knows (docs/spec.md §2: a name that equals an opponent is that strategy)
ALIASES = {"Truthful": "ValueBid"}


def _bid_order(obs: dict[str, Any]) -> list[str]:
    return sorted(obs["bid_amounts"], key=lambda b: obs["bid_amounts"][b])


def _truthful(obs: dict[str, Any], order: list[str]) -> str:
    fitting = [b for b in order if obs["bid_amounts"][b] <= obs["value"]]
    return fitting[-1] if fitting else order[0]


def _shift(order: list[str], bid: str, steps: int) -> str:
    return order[min(max(order.index(bid) + steps, 0), len(order) - 1)]


def explain(name: str, action: str, obs: dict[str, Any]) -> Explained:
    order = _bid_order(obs)
    hist = obs["history"]
    fields = {"value": f"{obs['value']:g}"}
    truthful = _truthful(obs, order)
    if name == "ValueBid":
        return "value", fields, truthful
    if name == "AggressiveValue":
        if hist and hist[-1]["winner"] == "opp":
            raised = _shift(order, truthful, +1)
            return ("raise" if raised != truthful else "raise_capped"), fields, raised
        return "value", fields, truthful
    if name == "Adaptive":
        if not hist:
            return "adaptive_open", fields, None
        last = hist[-1]
        fields["opp"] = last["opp"]
        if last["winner"] == "opp":
            implied = _shift(order, last["opp"], +1)
            return ("lost_up" if implied != last["opp"] else "lost_match"), fields, implied
        if last["winner"] == "own":
            implied = _shift(order, last["opp"], -1)
            return ("won_down" if implied != last["opp"] else "won_floor"), fields, implied
        return "tie_match", fields, last["opp"]
    return "generic", fields, None


PHRASES: dict[str, tuple[str, ...]] = {
    "value": (
        "My value is {value}, so I bid {action}, the highest bid that does not exceed it.",
        "With a value of {value} I bid {action} and never pay more than the item is worth to me.",
        "I bid in line with my value of {value}: {action}.",
    ),
    "raise": (
        "I lost last round, so I bid one step above my usual bid for value {value}: {action}.",
        "After losing the last round I push one step higher than my value bid and go {action}.",
    ),
    "raise_capped": ("I lost last round, but {action} is already the top bid, so I keep it with value {value}.",),
    "adaptive_open": (
        "No history yet, so I start with a moderate bid of {action} and adapt from there.",
        "First round: I open at {action} and will adjust to how the opponent bids.",
    ),
    "lost_up": (
        "The opponent won last round with {opp}, so I bid one step above it: {action}.",
        "I was outbid by {opp} last round, so I raise to {action}.",
    ),
    "lost_match": ("The opponent won last round with {opp}, the top bid, so I match it with {action}.",),
    "won_down": (
        "I won last round, so I step down to one bid below the opponent's {opp}: {action}.",
        "Having won against {opp}, I try to save money with {action}.",
    ),
    "won_floor": ("I won last round against {opp}, the lowest bid, so I bid {action} as well.",),
    "tie_match": ("We tied at {opp} last round, so I bid {opp} again.",),
}
