"""Templated one-line reasoning for demonstrator decisions (the assistant turn of SFT examples).

The paper's SFT data pairs each action with a short chain-of-thought line (median about 70-93
characters). Here each line is chosen from the demonstrator's rule (its strategy), the action it
took and what it observed, so the reason always matches the action: a TFT demonstrator that
cooperates after the opponent cooperated says so. Each case has several phrasings drawn with the
episode's seeded rng, which keeps the data deterministic without collapsing every case onto one
string.

An explainer returns `(case, fields, implied)`: the phrasing case, the values its templates use,
and, where the rule determines the action, the action it implies. When `implied` differs from the
action taken (a demonstrator this module does not know, or a rule that changed), the line falls
back to a neutral phrasing rather than give a wrong reason. Templates never quote payoff numbers,
so a config with other payoffs keeps them true.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sepo import games

#: a line for a case no explainer knows, or whose rule implies another action than the one taken
GENERIC = (
    "Weighing the history so far, I go with {action}.",
    "Given everything observed so far, my choice is {action}.",
)
RANDOM_LINES = (
    "I pick at random this round, and it comes out {action}.",
    "No fixed plan this round: a random draw gives {action}.",
    "I mix my play to stay unpredictable; this time it is {action}.",
)

#: strategies that pick uniformly at random: their reason is the draw itself.
RANDOM = {"Random", "RandomLegal", "RandomNeg"}


def reasoning_line(
    game: str,
    strategy: str,
    action: str,
    obs: dict[str, Any],
    rng: np.random.Generator,
    options: Mapping[str, Any] | None = None,
) -> str:
    """One reasoning line for `strategy` taking `action` after observing `obs` (no newline).

    `options`: the game's `reasoning` config block: `phrasings` (k > 0: only each case's first k phrasings; 0: all)
    and the rest for its explainer (Kuhn: `name_the_check`) or for what opens each line (IPD:
    `name_the_last_move`: its package's `OPENERS`).
    """
    phrasings = (options or {}).get("phrasings", 0)
    case, fields = _explain(game, strategy, action, obs, options)
    phrases = games.entry(game).reasoning.phrases.get(case) or (RANDOM_LINES if case == "random" else GENERIC)
    phrases = phrases[:phrasings] if phrasings else phrases
    line = phrases[int(rng.integers(len(phrases)))].format(action=action, **fields)
    return _opening(game, obs, options) + line


def _opening(game: str, obs: dict[str, Any], options: Mapping[str, Any] | None) -> str:
    """What an option puts before every line of a game, whoever the demonstrator (a random one too)."""
    openers = games.entry(game).reasoning.openers
    return "".join(opener(obs) for key, opener in openers.items() if (options or {}).get(key))


def reasoning_case(
    game: str, strategy: str, action: str, obs: dict[str, Any], options: Mapping[str, Any] | None = None
) -> str:
    """The phrasing case `reasoning_line` uses (tests check known demonstrators never go generic)."""
    return _explain(game, strategy, action, obs, options)[0]


def _explain(
    game: str, strategy: str, action: str, obs: dict[str, Any], options: Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """(phrasing case, template fields): the game's explainer, or "generic" where its rule implies another action."""
    reasoning = games.entry(game).reasoning
    name = reasoning.aliases.get(strategy, strategy)
    if name in RANDOM:
        return "random", {}
    handled_around = {"phrasings", *reasoning.openers}  # reasoning_line's own options
    explainer_options = {k: v for k, v in (options or {}).items() if k not in handled_around}
    case, fields, implied = reasoning.explain(name, action, obs, **explainer_options)
    return ("generic", {}) if implied is not None and implied != action else (case, fields)
