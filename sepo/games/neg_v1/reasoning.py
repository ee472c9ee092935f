"""Negotiation v1's demonstrator reasoning: which case explains a decision, and the phrasings of each case
(`sepo.training.reasoning` draws one)."""

from __future__ import annotations

from typing import Any

from sepo.games.reasoning import Explained

#: registered alias -> the name `explain` knows (docs/spec.md §2: a name that equals an opponent is that strategy)
ALIASES = {"Fair": "FairSplit"}


def explain(name: str, action: str, obs: dict[str, Any]) -> Explained:
    pie, hist = int(obs["pie"]), obs["history"]
    fields = {"pie": pie, "rest": pie - int(action)}
    fair = str(pie // 2)
    if name == "FairSplit":
        broke = bool(hist) and not hist[-1]["deal"]
        return ("fair_after_breakdown" if broke else "fair"), fields, fair
    if name == "Balanced":
        return "balanced", fields, None
    if name == "Concede":
        if not hist:
            return "open_high", fields, None
        prev = int(hist[-1]["own"])
        fields["prev"] = prev
        return ("concede" if int(action) < prev else "hold"), fields, None
    if name == "TFTNeg":
        if not hist:
            return "tft_open", fields, fair
        fields["opp"] = hist[-1]["opp"]
        return "tft_answer", fields, None
    return "generic", fields, None


PHRASES: dict[str, tuple[str, ...]] = {
    "fair": (
        "An even split of the {pie} gives me {action} and leaves {rest} to the opponent.",
        "I ask for half the pie, {action}, so that a deal stays within reach whatever the opponent does.",
        "Demanding {action} of {pie} is a fair split that avoids a breakdown.",
    ),
    "fair_after_breakdown": (
        "Last round broke down, but I keep to the fair demand of {action}.",
        "There was no deal last round; I still ask for an even {action} of {pie}.",
    ),
    "balanced": (
        "I ask for {action}, a little above an even split, leaving {rest} for the opponent.",
        "A demand of {action} is slightly ambitious but still leaves the opponent {rest}.",
    ),
    "open_high": (
        "I open with a high demand of {action} and will concede over the rounds.",
        "First round: I start ambitious at {action} and leave room to concede.",
    ),
    "concede": (
        "I lower my demand from {prev} to {action} to move toward a deal.",
        "I concede a little, from {prev} down to {action}, to make a deal more likely.",
    ),
    "hold": ("I keep my demand at {action}, where my concessions stop.",),
    "tft_open": ("I open with the fair demand of {action} and will mirror the opponent after that.",),
    "tft_answer": (
        "The opponent asked for {opp} last round, so I claim the remaining {action}.",
        "They demanded {opp}, so I ask for what is left of the {pie}: {action}.",
    ),
}
