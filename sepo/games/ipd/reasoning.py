"""The IPD's demonstrator reasoning: which case explains a decision, and the phrasings of each case
(`sepo.training.reasoning` draws one)."""

from __future__ import annotations

from typing import Any

from sepo.games.ipd.rules import COOPERATE, DEFECT
from sepo.games.matrix import explain_reactive
from sepo.games.reasoning import Explained

#: the IPD's names -> the reactive strategies' names in `sepo.games.matrix`, which `explain` knows
ALIASES = {
    "TitForTat": "TFT",
    "GrimTrigger": "Grim",
    "AlwaysD": "AlwaysHard",
    "AlwaysDefect": "AlwaysHard",
    "AlwaysC": "AlwaysKind",
    "AlwaysCooperate": "AlwaysKind",
}


def explain(name: str, action: str, obs: dict[str, Any]) -> Explained:
    return explain_reactive(name, action, obs, COOPERATE, DEFECT)


def last_move_opener(obs: dict[str, Any]) -> str:
    """`name_the_last_move`: every line after the first round opens with the opponent's last move, so that
    the words before the action differ after a cooperation and after a defection, whatever the demonstrator
    (AlwaysD's and AlwaysC's lines and a random draw read no history otherwise)."""
    hist = obs["history"]
    return f"Last round they {'cooperated' if hist[-1]['opp'] == COOPERATE else 'defected'}. " if hist else ""


#: option of `game.reasoning` -> what it, when true, puts before each line
OPENERS = {"name_the_last_move": last_move_opener}

PHRASES: dict[str, tuple[str, ...]] = {
    "open": (
        "It is the first round, so I open by cooperating and will answer whatever the opponent does.",
        "No history yet; I start with cooperation to invite mutual cooperation.",
        "First move: I cooperate in good faith and respond to the opponent from here on.",
    ),
    "reciprocate": (
        "The opponent cooperated last round, so I reciprocate and keep cooperating.",
        "They cooperated in round {r}, so I return the favour and cooperate.",
        "Cooperation was met with cooperation last round; I keep it going.",
    ),
    "retaliate": (
        "The opponent defected last round, so I answer with a defection.",
        "They defected in round {r}; I mirror that and defect this round.",
        "A defection should not go unanswered, so I defect after their defection in round {r}.",
    ),
    "forgive": (
        "The opponent defected last round, but I forgive it to try to restore cooperation.",
        "Despite their defection in round {r}, I cooperate to give mutual cooperation another chance.",
    ),
    "trust": (
        "The opponent has cooperated every round so far, so I keep cooperating.",
        "No defection from the opponent yet; I stay cooperative.",
    ),
    "punish": (
        "The opponent defected in round {first}, so I defect for the rest of the game.",
        "Trust was broken in round {first}; I keep defecting until the end.",
    ),
    "always_hard": (
        "Defecting pays more than cooperating whatever the opponent does, so I defect.",
        "Whatever the opponent plays this round, defecting earns me more, so I defect.",
        "Defection is the dominant move in every round, so I take it again.",
    ),
    "always_kind": (
        "I cooperate unconditionally, aiming for the mutual cooperation outcome.",
        "I stay cooperative whatever happened before, hoping for mutual cooperation.",
    ),
}
