"""Kuhn poker's demonstrator reasoning: which case explains a decision, and the phrasings of each case
(`sepo.training.reasoning` draws one)."""

from __future__ import annotations

from typing import Any

from sepo.games.reasoning import Explained

#: registered alias -> the name `explain` knows (docs/spec.md §2: a name that equals an opponent is that strategy)
ALIASES = {"NashApx": "NashApprox"}


def explain(name: str, action: str, obs: dict[str, Any], name_the_check: bool = False) -> Explained:
    """`name_the_check`: a bet after my own check gets its own lines ("checkbet"); otherwise it shares
    "facing" with an opening bet, and a model trained on those lines treats the two spots as one."""
    betting = obs["betting"]
    spot = "facing" if betting and betting[-1] == "BET" else ("checked" if betting else "open")
    if name_the_check and betting == ["PASS", "BET"]:
        spot = "checkbet"
    return f"{obs['card']}_{spot}_{action}", {}, None


PHRASES: dict[str, tuple[str, ...]] = {
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
}
