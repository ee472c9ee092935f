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

GENERIC = (
    "Weighing the history so far, I go with {action}.",
    "Given everything observed so far, my choice is {action}.",
)
RANDOM_LINES = (
    "I pick at random this round, and it comes out {action}.",
    "No fixed plan this round: a random draw gives {action}.",
    "I mix my play to stay unpredictable; this time it is {action}.",
)


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

PHRASES: dict[str, dict[str, tuple[str, ...]]] = {
    "ipd": {
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
        "dominant": (
            "Defecting pays more than cooperating whatever the opponent does, so I defect.",
            "Whatever the opponent plays this round, defecting earns me more, so I defect.",
            "Defection is the dominant move in every round, so I take it again.",
        ),
        "unconditional": (
            "I cooperate unconditionally, aiming for the mutual cooperation outcome.",
            "I stay cooperative whatever happened before, hoping for mutual cooperation.",
        ),
    },
    "auction": {
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
    },
    "neg_v1": {
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
    },
    "neg_v2": {
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
    },
    "kuhn": {
        "K_open_BET": (
            "I hold the K, the best card, so I open with a bet for value.",
            "With the K nothing can beat me at showdown, so I bet to build the pot.",
        ),
        "K_open_PASS": ("I check with the K and hope the opponent bets into my strong hand.",),
        "K_checked_BET": (
            "The opponent checked and I hold the K, the best card, so I bet for value.",
            "With the K after the opponent's check, I bet to win a bigger pot.",
        ),
        "K_checked_PASS": ("The opponent checked; I check back with the K and take the showdown.",),
        "K_facing_CALL": (
            "I hold the K, which wins every showdown, so I call the bet.",
            "The K beats any card the opponent can hold, so calling is clearly right.",
        ),
        "K_facing_FOLD": ("I fold the K this time instead of calling the bet.",),
        "Q_open_PASS": (
            "With the Q a bet only gets called by a K and folds out a J, so I check.",
            "A middle card like the Q plays best as a check rather than a bet.",
        ),
        "Q_open_BET": ("I bet the middle card Q to try to take the pot right away.",),
        "Q_checked_PASS": (
            "The opponent checked; with the Q I take the free showdown, which beats a J.",
            "With the Q I check back: it beats a J at showdown without risking more.",
        ),
        "Q_checked_BET": ("After the opponent's check I bet the Q to push out a J.",),
        "Q_facing_CALL": (
            "The Q beats a bluffing J, so I call the bet.",
            "I call with the Q to keep the opponent's bluffs with the J from paying off.",
        ),
        "Q_facing_FOLD": (
            "Facing a bet, the Q usually trails a K, so I fold and save the chip.",
            "The Q loses to a value bet with the K, so I give up this hand.",
        ),
        "J_open_PASS": (
            "The J is the weakest card and cannot win a showdown, so I check.",
            "With the J I check rather than put more chips into the pot.",
        ),
        "J_open_BET": (
            "I bluff with the J now and then so that my bets do not always mean a K.",
            "A bet with the J is a bluff that keeps the opponent guessing about my card.",
        ),
        "J_checked_PASS": ("The J rarely wins, so after the check I check behind rather than bluff.",),
        "J_checked_BET": (
            "The opponent checked, showing weakness, so I bluff with the J.",
            "After the opponent's check I bet the J as a bluff to win the pot now.",
        ),
        "J_facing_FOLD": (
            "The J cannot win a showdown, so I fold to the bet.",
            "With the J I lose every showdown, so I fold rather than call.",
        ),
        "J_facing_CALL": ("I call with the J to catch a possible bluff.",),
        # a bet after my own check (game.reasoning.name_the_check): every line opens with "I checked", which
        # no line of the other spots does ("The opponent checked" is the second player's spot)
        "K_checkbet_CALL": (
            "I checked the K and the opponent bet into it, so I call and win the showdown.",
            "I checked the K to trap, and now that the opponent bets I call.",
        ),
        "K_checkbet_FOLD": ("I checked the K, the opponent bet, and I fold this time.",),
        "Q_checkbet_CALL": (
            "I checked the Q and now face the opponent's bet; it can be a J bluff, so I call.",
            "I checked the Q and the opponent bet; the Q beats a bluffing J, so I call.",
        ),
        "Q_checkbet_FOLD": (
            "I checked the Q and the opponent bet, which usually means a K, so I fold.",
            "I checked the Q and now face a bet that is mostly a K, so I fold.",
        ),
        "J_checkbet_FOLD": (
            "I checked the J and the opponent bet; the J cannot win, so I fold.",
            "I checked the J and now face a bet I cannot beat, so I fold.",
        ),
        "J_checkbet_CALL": ("I checked the J and still call the opponent's bet to catch a bluff.",),
    },
}
