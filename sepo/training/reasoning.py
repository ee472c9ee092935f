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

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from sepo.training.reasoning_phrases import GENERIC, PHRASES, RANDOM_LINES

Explained = tuple[str, dict[str, Any], "str | None"]

#: registered alias -> the name the explainers use (docs/spec.md §2: "a name that equals an opponent
#: is the same strategy").
ALIASES = {
    "ipd": {"TitForTat": "TFT", "GrimTrigger": "Grim", "AlwaysDefect": "AlwaysD", "AlwaysCooperate": "AlwaysC"},
    "auction": {"Truthful": "ValueBid"},
    "neg_v1": {"Fair": "FairSplit"},
    "neg_v2": {"FairNeg": "Conservative"},
    "kuhn": {"NashApx": "NashApprox"},
}

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
    `name_the_last_move`, `OPENERS`).
    """
    phrasings = int((options or {}).get("phrasings", 0) or 0)
    case, fields = _explain(game, strategy, action, obs, options)
    phrases = PHRASES.get(game, {}).get(case) or (RANDOM_LINES if case == "random" else GENERIC)
    phrases = phrases[:phrasings] if phrasings else phrases
    line = phrases[int(rng.integers(len(phrases)))].format(action=action, **fields)
    return _opening(game, obs, options) + line


def _opening(game: str, obs: dict[str, Any], options: Mapping[str, Any] | None) -> str:
    """What an option puts before every line of a game, whoever the demonstrator (a random one too)."""
    return "".join(opener(obs) for (g, key), opener in OPENERS.items() if g == game and (options or {}).get(key))


def reasoning_case(
    game: str, strategy: str, action: str, obs: dict[str, Any], options: Mapping[str, Any] | None = None
) -> str:
    """The phrasing case `reasoning_line` uses (tests check known demonstrators never go generic)."""
    return _explain(game, strategy, action, obs, options)[0]


def _explain(
    game: str, strategy: str, action: str, obs: dict[str, Any], options: Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """(phrasing case, template fields): the game's explainer, or "generic" where its rule implies another action."""
    name = ALIASES.get(game, {}).get(strategy, strategy)
    if name in RANDOM:
        return "random", {}
    if game not in EXPLAINERS:
        return "generic", {}
    handled_around = {"phrasings", *(key for g, key in OPENERS if g == game)}  # reasoning_line's own options
    explainer_options = {k: v for k, v in (options or {}).items() if k not in handled_around}
    case, fields, implied = EXPLAINERS[game](name, action, obs, **explainer_options)
    return ("generic", {}) if implied is not None and implied != action else (case, fields)


def _count(n: int, word: str) -> str:
    """'one breakdown', '2 breakdowns'."""
    return f"one {word}" if n == 1 else f"{n} {word}s"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


# --------------------------------------------------------------------------------------- IPD
C, D = "COOPERATE", "DEFECT"


def _ipd(name: str, action: str, obs: dict[str, Any]) -> Explained:
    hist = obs["history"]
    verb = action.lower()
    if name == "AlwaysD":
        return "dominant", {}, D
    if name == "AlwaysC":
        return "unconditional", {}, C
    if not hist and name in ("TFT", "GenerousTFT", "Grim"):
        return "open", {}, C
    last = hist[-1]["opp"] if hist else None
    if name == "Grim":
        first = next((i for i, h in enumerate(hist) if h["opp"] == D), None)
        if first is None:
            return "trust", {}, C
        return "punish", {"first": first + 1}, D
    if name == "TFT":
        return ("reciprocate", {"r": len(hist)}, C) if last == C else ("retaliate", {"r": len(hist)}, D)
    if name == "GenerousTFT":
        if last == C:
            return "reciprocate", {"r": len(hist)}, C
        return ("forgive" if action == C else "retaliate"), {"r": len(hist)}, None
    return "generic", {"verb": verb}, None


def _ipd_last_move(obs: dict[str, Any]) -> str:
    """`name_the_last_move`: every line after the first round opens with the opponent's last move, so that
    the words before the action differ after a cooperation and after a defection, whatever the demonstrator
    (AlwaysD's and AlwaysC's lines and a random draw read no history otherwise)."""
    hist = obs["history"]
    return f"Last round they {'cooperated' if hist[-1]['opp'] == C else 'defected'}. " if hist else ""


# ----------------------------------------------------------------------------------- Auction
def _bid_order(obs: dict[str, Any]) -> list[str]:
    return sorted(obs["bid_amounts"], key=lambda b: obs["bid_amounts"][b])


def _truthful(obs: dict[str, Any], order: list[str]) -> str:
    fitting = [b for b in order if obs["bid_amounts"][b] <= obs["value"]]
    return fitting[-1] if fitting else order[0]


def _shift(order: list[str], bid: str, steps: int) -> str:
    return order[min(max(order.index(bid) + steps, 0), len(order) - 1)]


def _auction(name: str, action: str, obs: dict[str, Any]) -> Explained:
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


# ------------------------------------------------------------------------------ Negotiation v1
def _neg_v1(name: str, action: str, obs: dict[str, Any]) -> Explained:
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


# ------------------------------------------------------------------------------ Negotiation v2
def _neg_v2(name: str, action: str, obs: dict[str, Any]) -> Explained:
    from sepo.games.neg_v2 import format_demand, top_items

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


# ------------------------------------------------------------------------------------- Kuhn
def _kuhn(name: str, action: str, obs: dict[str, Any], name_the_check: bool = False) -> Explained:
    """`name_the_check`: a bet after my own check gets its own lines ("checkbet"); otherwise it shares
    "facing" with an opening bet, and a model trained on those lines treats the two spots as one."""
    betting = obs["betting"]
    spot = "facing" if betting and betting[-1] == "BET" else ("checked" if betting else "open")
    if name_the_check and betting == ["PASS", "BET"]:
        spot = "checkbet"
    return f"{obs['card']}_{spot}_{action}", {}, None


EXPLAINERS: dict[str, Callable[[str, str, dict[str, Any]], Explained]] = {
    "ipd": _ipd,
    "auction": _auction,
    "neg_v1": _neg_v1,
    "neg_v2": _neg_v2,
    "kuhn": _kuhn,
}

#: (game, option) -> what that option, when true, puts before each of the game's lines
OPENERS: dict[tuple[str, str], Callable[[dict[str, Any]], str]] = {("ipd", "name_the_last_move"): _ipd_last_move}
