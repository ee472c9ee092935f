"""Kuhn poker strategies (docs/spec.md §2): opponents and demonstrators.

Every Kuhn strategy is a behaviour strategy given by one number per information set: the
probability of the aggressive action (BET when not facing a bet, CALL when facing one) for each
card at each of the four public histories ('' first player opens, 'p' second player after PASS,
'b' second player facing a BET, 'pb' first player facing a BET after passing). Writing them as
tables makes `probs` exact, which the exact exploitability computation (sepo/games/kuhn/exact.py) and
the scripted agent's `action_probabilities` rely on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sepo.games.kuhn.exact import Table, best_response_table
from sepo.games.kuhn.rules import ACTION_INDEX, CARDS, node_of
from sepo.games.strategy import Strategy, register

HISTORIES = ("", "p", "b", "pb")
FACING = ("b", "pb")  # histories where the player faces a bet (CALL/FOLD)


def _table(opening: dict[str, float], facing: dict[str, float]) -> dict[tuple[str, str], float]:
    """Aggression table from the probability of betting when not facing a bet and of calling when facing one."""
    out = {}
    for history in HISTORIES:
        source = facing if history in FACING else opening
        for card, p in source.items():
            out[(card, history)] = p
    return out


class KuhnTableStrategy(Strategy):
    """A strategy given by `aggression[(card, history)]` = P(BET or CALL)."""

    aggression: dict[tuple[str, str], float] = {}

    def probs(self, obs: dict[str, Any], legal: list[str]) -> dict[str, float]:
        p = self.aggression[(obs["card"], node_of(obs["betting"]))]
        return {a: (p if ACTION_INDEX[a] == 1 else 1.0 - p) for a in legal}

    def table(self) -> Table:
        """The (pass/fold, bet/call) probabilities at the 12 information sets, in `sepo.games.kuhn.exact`'s layout."""
        return {
            f"{CARDS.index(card)}{history}": np.array([1.0 - p, p]) for (card, history), p in self.aggression.items()
        }


@register("kuhn", "NashApx", "NashApprox")
class NashApx(KuhnTableStrategy):
    """The alpha = 1/3 member of Kuhn's equilibrium family (exploitability 0, first-player value -1/18).

    First player: bet K always (3 alpha), bet J w.p. 1/3 (alpha), never open Q; after PASS-BET call
    with K, with Q w.p. 2/3 (alpha + 1/3), fold J. Second player: after PASS bet K, bet J w.p. 1/3,
    pass Q; facing a BET call K, call Q w.p. 1/3, fold J.
    """

    aggression = {
        ("J", ""): 1 / 3,
        ("Q", ""): 0.0,
        ("K", ""): 1.0,
        ("J", "pb"): 0.0,
        ("Q", "pb"): 2 / 3,
        ("K", "pb"): 1.0,
        ("J", "p"): 1 / 3,
        ("Q", "p"): 0.0,
        ("K", "p"): 1.0,
        ("J", "b"): 0.0,
        ("Q", "b"): 1 / 3,
        ("K", "b"): 1.0,
    }


@register("kuhn", "TightP")
class TightP(KuhnTableStrategy):
    """Bets and calls with K only; passes or folds with J and Q."""

    aggression = _table(opening={"J": 0.0, "Q": 0.0, "K": 1.0}, facing={"J": 0.0, "Q": 0.0, "K": 1.0})


@register("kuhn", "LooseA")
class LooseA(KuhnTableStrategy):
    """Bets with J and K, calls with Q and K. Q passes when not facing a bet (the spec only lists
    bets with J and K), and J folds facing a bet (it only lists calls with Q and K)."""

    aggression = _table(opening={"J": 1.0, "Q": 0.0, "K": 1.0}, facing={"J": 0.0, "Q": 1.0, "K": 1.0})


@register("kuhn", "AlwaysBet")
class AlwaysBet(KuhnTableStrategy):
    """BET when it may, CALL when facing a bet, whatever the card."""

    aggression = _table(opening={c: 1.0 for c in "JQK"}, facing={c: 1.0 for c in "JQK"})


@register("kuhn", "RandomLegal")
class RandomLegal(KuhnTableStrategy):
    """Uniform over the legal actions."""

    aggression = _table(opening={c: 0.5 for c in "JQK"}, facing={c: 0.5 for c in "JQK"})


@register("kuhn", "CallingStation")
class CallingStation(KuhnTableStrategy):
    """Never bets, always calls: the passive loser a learned exploiter is checked against (it is beaten by
    value-betting every card that wins a showdown and never bluffing)."""

    aggression = _table(opening={c: 0.0 for c in "JQK"}, facing={c: 1.0 for c in "JQK"})


@register("kuhn", "TightValue")
class TightValue(KuhnTableStrategy):
    """Demonstrator: bet/call with K, call with Q w.p. 1/3, otherwise pass or fold."""

    aggression = _table(opening={"J": 0.0, "Q": 0.0, "K": 1.0}, facing={"J": 0.0, "Q": 1 / 3, "K": 1.0})


@register("kuhn", "PotControl")
class PotControl(KuhnTableStrategy):
    """Demonstrator: bet K, pass Q and J; facing a bet call with Q and K, fold J."""

    aggression = _table(opening={"J": 0.0, "Q": 0.0, "K": 1.0}, facing={"J": 0.0, "Q": 1.0, "K": 1.0})


@register("kuhn", "AlwaysPassQ")
class AlwaysPassQ(KuhnTableStrategy):
    """Demonstrator: NashApx, except that it always passes or folds with Q."""

    aggression = {key: (0.0 if key[0] == "Q" else p) for key, p in NashApx.aggression.items()}


@register("kuhn", "BestResponse")
class BestResponse(KuhnTableStrategy):
    """The exact best response, in both seats, to the agent's played table (an exploiter).

    It needs the agent: whoever plays it calls `respond_to(table)` with the agent's table at the 12
    information sets first (evaluation: the evaluated policy's played table; SEPO: the current
    policy's, recomputed every `sepo.best_response_every` steps). Its mean payoff per hand over the
    two seats is then that table's exploitability (NashConv/2), so as an exploit opponent it
    carries the gradient of the true exploitability (exploitability descent) instead of reading 0
    against a policy that a fixed pool cannot beat. The response is to the hand-1 table: against a
    policy whose later hands depend on the history it is not exactly a best response there.
    """

    #: evaluation and training call `respond_to` with the agent's table before it plays
    responds_to_agent = True

    def __init__(self) -> None:
        self.aggression: dict[tuple[str, str], float] | None = None  # type: ignore[assignment]
        self.target: Table | None = None

    def respond_to(self, table: Table) -> None:
        """Become the best response to `table` (the agent's pass/fold, bet/call probabilities)."""
        self.target = {k: v.copy() for k, v in table.items()}
        self.aggression = {(CARDS[int(key[0])], key[1:]): float(p[1]) for key, p in best_response_table(table).items()}

    def probs(self, obs: dict[str, Any], legal: list[str]) -> dict[str, float]:
        if self.aggression is None:
            raise RuntimeError(
                "BestResponse has no agent table to respond to: call respond_to(table) first "
                "(evaluation and SEPO do; it cannot be a demonstrator, a datagen opponent or the agent)"
            )
        return super().probs(obs, legal)
