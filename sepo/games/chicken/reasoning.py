"""Chicken's demonstrator reasoning: which case explains a decision, and the phrasings of each case
(`sepo.training.reasoning` draws one). Templates never quote payoff numbers, so other payoffs keep them true."""

from __future__ import annotations

from typing import Any

from sepo.games.chicken.rules import STRAIGHT, SWERVE
from sepo.games.matrix import explain_reactive
from sepo.games.reasoning import Explained

#: Chicken's names -> the reactive strategies' names in `sepo.games.matrix`, which `explain` knows
ALIASES = {
    "TitForTat": "TFT",
    "GrimTrigger": "Grim",
    "AlwaysStraight": "AlwaysHard",
    "Hawk": "AlwaysHard",
    "AlwaysSwerve": "AlwaysKind",
    "Dove": "AlwaysKind",
}


def explain(name: str, action: str, obs: dict[str, Any]) -> Explained:
    return explain_reactive(name, action, obs, SWERVE, STRAIGHT)


PHRASES: dict[str, tuple[str, ...]] = {
    "open": (
        "It is the first round, so I swerve and will answer whatever the opponent does.",
        "No history yet; I swerve first to show I am not looking for a crash.",
    ),
    "reciprocate": (
        "The opponent swerved last round, so I swerve too and we both stay safe.",
        "They swerved in round {r}, so I return it and swerve.",
    ),
    "retaliate": (
        "The opponent went straight last round, so I go straight to show I will not always yield.",
        "They went straight in round {r}; I answer in kind and go straight.",
    ),
    "forgive": (
        "The opponent went straight last round, but I swerve to give mutual swerving another chance.",
        "Despite their going straight in round {r}, I swerve to avoid a crash.",
    ),
    "trust": (
        "The opponent has swerved every round so far, so I keep swerving.",
        "No aggression from the opponent yet; I keep swerving.",
    ),
    "punish": (
        "The opponent went straight in round {first}, so I go straight for the rest of the game.",
        "They chose aggression in round {first}; I never yield again.",
    ),
    "always_hard": (
        "I always go straight, whatever the opponent does.",
        "I never swerve; I keep going straight.",
    ),
    "always_kind": (
        "I always swerve, whatever the opponent does, to avoid any crash.",
        "I never risk a crash, so I swerve again.",
    ),
}
