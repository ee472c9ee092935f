"""Kuhn poker's SEPO batch with exact action values (`sepo.estimator: exact_values`).

Why. A rollout batch (`sepo.training.rollouts`) estimates J's gradient from the payoffs of sampled episodes. On
Kuhn poker that estimate is mostly card and coin-flip noise: at SmolLM2's SFT policy six batches' gradients were
uncorrelated (pairwise cosine -0.05 +- 0.01, docs/sepo_signal_smollm2_kuhn_seed0.json), so a step was a random
direction. Kuhn's rules are small and every opponent of its pools is a table, so what episodes estimate can be
computed exactly for every action the policy samples.

The batch. K answers of the policy at each of its 12 information sets (the states of hand 1 that
`sepo.policies.played_table.played_table` reads: the same prompt, sampling, stopping rule, parser and fallback as in play),
sampled through the adapter as rollouts are. From them the played table pi (Rao-Blackwellised,
`sepo.policies.played`) and, as a function of any table, J = s*u - lambda_e*s*e (Kuhn has no c or x):
u is the agent's value per hand against the train pool (seats alternate, so half a hand in each seat), e the
mean over the exploit pool of max(0, adv) with adv = opponent minus agent per hand, the best responder
answering pi.

The advantage. With the best response and the max(0, .) switches held, J is linear in each information set's
distribution, since a hand meets an information set at most once. So dJ/dpi(a | I) = J_I(a), the J of pi with
I playing a always, and a sample k at I whose action is a_k gets A_k = J_I(a_k) - mean over the other samples at
I of J_I(a_k'), weight 1/K:

    E[sum_k A_k / K * grad log p(answer_k | I)] = sum_a grad pi(a | I) * J_I(a)  = J's gradient through I.

J_I reads pi only at the other information sets, whose samples are independent of I's, and the leave-one-out
baseline is independent of sample k, so the batch's expected update is J's gradient against the held responder,
with no episode noise at all: what is left is which answers were sampled. The responder and the switches are
held where a running mean of EARLIER batches' tables puts them (`sepo.responder_table_decay`; the first batch:
its own), so they do not depend on the batch's samples. By Danskin's theorem the gradient against the best
response held is the gradient of the exploitability; a table read from few answers sometimes picks another
responder where two actions are nearly worth the same, which smooths the max. `tests/test_exact_values.py`
checks the expected update of a table agent against J's finite-difference gradient, term by term.

What it measures is the hand-1 policy (no previous hands in the prompt), the policy `exploit_exact` reads;
the evaluation's episodes, six hands with their history in the prompt, then show whether the later hands
follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sepo.games.base import Game
from sepo.games.kuhn.exact import INFOSETS, Table, best_response_table, seat_values
from sepo.games.kuhn.rules import ACTION_INDEX
from sepo.games.strategy import make_strategy
from sepo.metrics import pools_of
from sepo.policies.base import Decision
from sepo.policies.played import ActionEstimate, estimates_from_answers, sample_requests
from sepo.policies.played_table import PlayedTable, infoset_requests, table_from_probs
from sepo.training.objective import EstimatorState
from sepo.training.rollouts import RolloutBatch, batch_seed

#: the terms of Kuhn's J (it has no collusive pool and no externality)
EXACT_TERMS = ("u", "e")


@dataclass
class KuhnObjective:
    """J of a table, with the pools' tables, lambda_e and s; the switches and the best response as set."""

    train: dict[str, Table]
    exploit: dict[str, Table | None]  # None: the best responder, answering the table it is held at
    reward_scale: float
    lambda_e: float
    ante: float = 1.0
    bet: float = 1.0

    def value(self, agent: Table, opponent: Table) -> float:
        """The agent's chips per hand against `opponent`, seats alternating (an episode's mix)."""
        return seat_values(agent, opponent, self.ante, self.bet)["mean"]

    def held(self, at: Table) -> tuple[dict[str, Table], dict[str, bool]]:
        """The exploit pool's tables and max(0, .) switches where `at` puts them (what Danskin holds fixed)."""
        tables = {
            name: best_response_table(at, self.ante, self.bet) if table is None else table
            for name, table in self.exploit.items()
        }
        return tables, {name: a > 0.0 for name, a in self.advantages(at, tables).items()}

    def payoff(self, agent: Table) -> float:
        """u: the agent's chips per hand against the train pool."""
        return float(np.mean([self.value(agent, t) for t in self.train.values()])) if self.train else 0.0

    def advantages(self, agent: Table, exploit: dict[str, Table]) -> dict[str, float]:
        """Each exploit opponent's chips minus the agent's, per hand (zero-sum: -2 * the agent's value)."""
        return {n: -2.0 * self.value(agent, t) for n, t in exploit.items()}

    def terms(self, agent: Table, exploit: dict[str, Table], on: dict[str, bool]) -> dict[str, float]:
        """s*u and -lambda_e*s*e of `agent` against the given exploit tables and switches."""
        advantages = self.advantages(agent, exploit)
        e = float(np.mean([on[n] * a for n, a in advantages.items()])) if advantages else 0.0
        return {"u": self.reward_scale * self.payoff(agent), "e": -self.lambda_e * self.reward_scale * e}

    def action_values(self, table: Table, held_at: Table) -> dict[str, dict[str, np.ndarray]]:
        """term -> information set -> [J_I(pass/fold), J_I(bet/call)]: each term of J with the information set
        playing one action always and the rest of `table`; the best response and the switches held where
        `held_at` puts them."""
        exploit, on = self.held(held_at)
        out: dict[str, dict[str, np.ndarray]] = {k: {} for k in EXACT_TERMS}
        for key in INFOSETS:
            per_action = []
            for action in range(2):
                moved = dict(table)
                moved[key] = np.eye(2)[action]
                per_action.append(self.terms(moved, exploit, on))
            for term in EXACT_TERMS:
                out[term][key] = np.array([v[term] for v in per_action])
        return out

    def measured(self, table: Table) -> dict[str, float]:
        """u, e and J of `table` itself: its own best response, and max(0, .) of its own advantages."""
        exploit, _ = self.held(table)
        u, advantages = self.payoff(table), self.advantages(table, exploit)
        e = float(np.mean([max(0.0, a) for a in advantages.values()])) if advantages else 0.0
        return {
            "objective": self.reward_scale * u - self.lambda_e * self.reward_scale * e,
            "train/u": u,
            "exploit/e": e,
            **{f"exploit_on/{n}": float(a > 0.0) for n, a in advantages.items()},
        }


def leave_one_out(values: np.ndarray) -> np.ndarray:
    """Each entry minus the mean of the others (K >= 2)."""
    k = len(values)
    return values - (values.sum() - values) / (k - 1)


class ExactValueBuilder:
    """Builds the exact-value batches of one Kuhn run (`sepo.estimator: exact_values`); the same `collect` as
    `sepo.training.rollouts.BatchBuilder`, so the loop takes either."""

    def __init__(self, cfg: DictConfig, s: DictConfig):
        self.pools = pools_of(cfg.game)
        strategies = {
            n: make_strategy(cfg.game, n, key="game.pools") for p in ("train", "exploit") for n in self.pools[p]
        }
        # an opponent that answers the agent's table (BestResponse) is held at the running table instead
        tables = {n: None if getattr(st, "responds_to_agent", False) else st.table() for n, st in strategies.items()}
        self.objective = KuhnObjective(
            train={n: tables[n] for n in self.pools["train"]},
            exploit={n: tables[n] for n in self.pools["exploit"]},
            reward_scale=s.reward_scale / cfg.game.max_payoff,
            lambda_e=cfg.lambdas.train.e,
            ante=float(cfg.game.ante),
            bet=float(cfg.game.bet),
        )
        self.strategies: dict[str, Any] = {}  # no opponent plays: nothing for the best-response schedule to keep
        self.samples, self.seed = s.infoset_samples, s.seed
        self.adv_norm, self.eps = s.adv_norm, s.adv_eps
        self.table_decay = s.responder_table_decay

    def collect(self, game: Game, policy: Any, batch_index: int, state: EstimatorState) -> RolloutBatch:
        """Sample K answers per information set, read the table from them, and give each its exact advantage."""
        keyed = infoset_requests(game)
        copies = sample_requests([r for _, r in keyed], self.samples, batch_seed(self.seed, batch_index))
        read = getattr(policy, "read_answers", None)
        decisions, estimates = read(copies, self.samples) if read else counted_read(policy, copies, self.samples)
        played = played_table_from(keyed, estimates, self.samples, game)
        held = {k: np.array([1.0 - p, p]) for k, p in state.table.items()} if state.table else played.table
        values = self.objective.action_values(played.table, held)
        self.remember(state, played.table)

        unscaled: dict[str, list[float]] = {"total": [], **{k: [] for k in EXACT_TERMS}}
        for i, (key, _) in enumerate(keyed):
            chosen = np.array([ACTION_INDEX[d.action] for d in decisions[i * self.samples : (i + 1) * self.samples]])
            per_term = {k: leave_one_out(values[k][key][chosen]) / self.samples for k in EXACT_TERMS}
            for k in EXACT_TERMS:
                unscaled[k] += per_term[k].tolist()
            unscaled["total"] += sum(per_term.values()).tolist()
        arrays = {k: np.asarray(v, dtype=float) for k, v in unscaled.items()}

        batch_std = float(arrays["total"].std())
        scale = state.scale_for(batch_std) + self.eps if self.adv_norm == "batch" else 1.0
        state.record_std(batch_std)
        stats = {
            **self.objective.measured(played.table),
            "collusive/c": 0.0,
            "train/x": 0.0,
            "exploit_exact": played.exploitability,
            "exploit_exact_se": played.exploitability_se,
            "parse_rate": float(np.mean([d.parsed for d in decisions])),
            "episodes": 0.0,
            "decisions": float(len(decisions)),
            "adv_std": batch_std,
            "adv_scale": scale,
            "adv_std/infosets": float((arrays["total"] / scale).std()),
            **{f"bet_or_call/{key}": float(p[1]) for key, p in played.table.items()},
        }
        return RolloutBatch([], decisions, arrays["total"] / scale, arrays, scale, stats)

    def remember(self, state: EstimatorState, table: Table) -> None:
        """Fold this batch's table into the running table the next batches' responder and switches answer."""
        d, new = self.table_decay, {k: float(p[1]) for k, p in table.items()}
        state.table = new if state.table is None else {k: d * state.table[k] + (1.0 - d) * new[k] for k in new}


def counted_read(policy: Any, copies: list[Any], samples: int) -> tuple[list[Decision], list[ActionEstimate]]:
    """A policy that writes no text (a scripted or table agent): its decisions, each sample counted."""
    decisions = policy.act_batch(copies)
    return decisions, estimates_from_answers(policy, copies, None, decisions, samples)


def played_table_from(keyed: list[tuple[str, Any]], estimates: list[ActionEstimate], samples: int, game: Any):
    """The `PlayedTable` of one estimate per information set (`infoset_requests` order)."""
    table = table_from_probs({key: e.probs for (key, _), e in zip(keyed, estimates)})
    se = {key: float(next(v for a, v in e.se.items() if ACTION_INDEX[a] == 1)) for (key, _), e in zip(keyed, estimates)}
    mixed = float(np.mean([e.rao_blackwellised for e in estimates]))
    return PlayedTable(table, se, samples, mixed, game.ante, game.bet)
