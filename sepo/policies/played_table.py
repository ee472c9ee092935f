"""A Kuhn poker policy read at the game's 12 information sets, as it plays (docs/spec.md §6).

The table is what Kuhn's exact exploitability is computed from (`sepo.games.kuhn.exact`): one request per
information set, `samples` answers each (`policy.action_probabilities`, Rao-Blackwellised for a language
model, exact for a scripted one), so the exploitability reported is that of the policy that plays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sepo.games.base import AGENT, Game
from sepo.games.kuhn.exact import INFOSETS, Table, check_table, exploitability, exploitability_se, seat_to_move
from sepo.games.kuhn.rules import ACTION_INDEX, BET, PASS, KuhnPoker
from sepo.policies.base import DecisionRequest


def reads_a_table(game: Game) -> bool:
    """Whether the game's policy table is read (Kuhn poker's 12 information sets)."""
    return isinstance(game, KuhnPoker)


def exact_exploitability(game: KuhnPoker, policy: Any) -> float:
    """NashConv/2 of `policy` playing both seats, read at the 12 information sets."""
    return played_table(game, policy).exploitability


@dataclass
class PlayedTable:
    """A policy read at Kuhn's 12 information sets, as it plays (hand 1: no history yet).

    `table[key]` is (pass-or-fold, bet-or-call), `se[key]` the standard error of that probability
    (0 for a scripted strategy, whose table is known exactly), from `samples` sampled answers per
    information set of which the share `rao_blackwellised` was scored exactly
    (`sepo.policies.played`).
    """

    table: Table
    se: dict[str, float]
    samples: int = 0
    rao_blackwellised: float = 1.0
    ante: float = 1.0
    bet: float = 1.0

    @property
    def exploitability(self) -> float:
        return exploitability(self.table, self.ante, self.bet)

    @property
    def exploitability_se(self) -> float:
        return exploitability_se(self.table, self.se, self.ante, self.bet)

    def to_json(self) -> dict[str, Any]:
        return {
            "bet_or_call": {k: round(float(p[1]), 6) for k, p in self.table.items()},
            "se": {k: round(float(v), 6) for k, v in self.se.items()},
            "samples_per_state": self.samples,
            "rao_blackwellised": round(self.rao_blackwellised, 4),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], ante: float = 1.0, bet: float = 1.0) -> PlayedTable:
        """The table `to_json` wrote (its probabilities to 6 decimals)."""
        table = {k: np.array([1.0 - float(p), float(p)]) for k, p in data["bet_or_call"].items()}
        se = {k: float(v) for k, v in data["se"].items()}
        return cls(table, se, int(data["samples_per_state"]), float(data["rao_blackwellised"]), ante, bet)


def table_from_probs(probs: dict[str, dict[str, float]]) -> Table:
    """Infoset key -> {action string: prob} into the (pass/fold, bet/call) table, renormalised.

    Estimated probabilities need not sum to one exactly (float sums), so each pair is normalised;
    an all-zero pair is an error.
    """
    table = {}
    for key, dist in probs.items():
        p = np.zeros(2)
        for action, prob in dist.items():
            if prob < 0:
                raise ValueError(f"negative probability {prob} for {action} at {key!r}")
            p[ACTION_INDEX[action]] += float(prob)
        if p.sum() <= 0:
            raise ValueError(f"probabilities at {key!r} sum to zero: {dist}")
        table[key] = p / p.sum()
    return check_table(table)


def infoset_requests(game: KuhnPoker) -> list[tuple[str, Any]]:
    """One DecisionRequest per information set, each for a state built by the game.

    The states are in the episode's first hand (no previous hands), so a history-dependent policy
    is measured as it plays when it has seen nothing of the opponent yet.
    """
    letters = {"p": PASS, "b": BET}
    out = []
    for key in INFOSETS:
        card, history = int(key[0]), key[1:]
        state = game.state_at(card, seat_to_move(history), [letters[c] for c in history])
        out.append(
            (key, DecisionRequest(game, state, AGENT, game.legal_actions(state, AGENT), np.random.default_rng(0)))
        )
    return out


def played_table(game: KuhnPoker, policy: Any, samples: int | None = None, seed: int = 0) -> PlayedTable:
    """The whole table in one batched call of `policy.action_probabilities` (K samples per state)."""
    keyed = infoset_requests(game)
    estimates = policy.action_probabilities([r for _, r in keyed], samples=samples, seed=seed)
    table = table_from_probs({key: e.probs for (key, _), e in zip(keyed, estimates)})
    aggressive = {key: next(a for a in r.legal if ACTION_INDEX[a] == 1) for key, r in keyed}
    se = {key: float(e.se[aggressive[key]]) for (key, _), e in zip(keyed, estimates)}
    return PlayedTable(
        table,
        se,
        int(estimates[0].samples.shape[0]),
        float(np.mean([e.rao_blackwellised for e in estimates])),
        game.ante,
        game.bet,
    )


def policy_table(game: KuhnPoker, policy: Any) -> Table:
    """The policy's (estimated) probabilities at the 12 information sets."""
    return played_table(game, policy).table
