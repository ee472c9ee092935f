"""Negotiation v2's demonstrator reasoning: which case explains a decision, and the phrasings of each case
(`sepo.training.reasoning` draws one)."""

from __future__ import annotations

import math
from typing import Any

from sepo.games.neg_v2.rules import format_demand, top_items
from sepo.games.reasoning import Explained

#: registered alias -> the name `explain` knows (docs/spec.md §2: a name that equals an opponent is that strategy)
ALIASES = {"FairNeg": "Conservative"}


def _count(n: int, word: str) -> str:
    """'one breakdown', '2 breakdowns'."""
    return f"one {word}" if n == 1 else f"{n} {word}s"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def explain(name: str, action: str, obs: dict[str, Any]) -> Explained:
    pool, values, items = obs["pool"], obs["values"], obs["items"]
    threshold = obs["value_total"] / len(pool)
    high = [items[i] for i, v in enumerate(values) if v > threshold]
    proportional = [math.ceil(n / 2) if v > threshold else n // 2 for n, v in zip(pool, values)]
    top = top_items(values)[0]
    fields = {"high": _join(high) if high else items[top], "top": items[top]}
    if name == "Conservative":
        return "floor_half", fields, format_demand(n // 2 for n in pool)
    if name == "Proportional":
        return "proportional", fields, format_demand(proportional)
    if name == "Adaptive":
        breakdowns = sum(1 for h in obs["history"] if not h["deal"])
        if breakdowns == 0:
            return "proportional", fields, format_demand(proportional)
        fields.update(breakdowns=_count(breakdowns, "breakdown"), units=_count(breakdowns, "unit"))
        return "adaptive_concede", fields, None
    if name == "Defensive":
        defensive = [0] * len(pool)
        defensive[top] = math.ceil(pool[top] / 2)
        return "defensive", fields, format_demand(defensive)
    return "generic", fields, None


PHRASES: dict[str, tuple[str, ...]] = {
    "floor_half": (
        "I ask for half of every item, rounded down, so any fair opponent can agree.",
        "A rounded-down half of each item leaves room for a deal whatever the opponent values.",
    ),
    "proportional": (
        "I take the larger half of the {high}, which I value most, and the smaller half of the rest.",
        "My values favour the {high}: I round my half up there and down elsewhere.",
    ),
    "adaptive_concede": (
        "After {breakdowns} so far, I give up {units} from my largest demands to reach a deal.",
        "We had {breakdowns}, so I lower my usual demand by {units}.",
    ),
    "defensive": (
        "I only ask for the larger half of the {top}, my most valuable item, and leave the rest.",
        "To keep the deal safe I claim just half the {top} (rounded up), the item I value most.",
    ),
}
