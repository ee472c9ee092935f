"""The exact-value batch of Kuhn poker (`sepo.estimator=exact_values`): its expected update is J's gradient.

A table agent (P(bet or call) = sigmoid(theta_I) at each of the 12 information sets, no language model) answers
through `ExactValueBuilder.collect`; each decision carries its score d log pi(a | I) / d theta, so a batch's update
is sum_d A_d * score_d. Its mean over batches is compared with the central finite-difference gradient of J,
computed by `sepo.games.kuhn.exact` (itself checked against OpenSpiel in tests/test_kuhn.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from sepo.errors import ConfigError
from sepo.games import make_game
from sepo.games.kuhn.exact import INFOSETS, best_response_table, exploitability
from sepo.games.kuhn.rules import ACTION_INDEX, CARDS, node_of
from sepo.policies.base import Decision
from sepo.run.compose import compose_config
from sepo.run.config import validate
from sepo.training.exact_values import ExactValueBuilder, leave_one_out
from sepo.training.objective import EstimatorState, sepo_settings

from .conftest import final_adapter, run_dirs


@dataclass
class ScoredDecision(Decision):
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class TableAgent:
    theta: np.ndarray
    name: str = "table"

    def probabilities(self) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.theta))

    def table(self) -> dict[str, np.ndarray]:
        return {k: np.array([1.0 - q, q]) for k, q in zip(INFOSETS, self.probabilities())}

    def act_batch(self, requests):
        out = []
        for r in requests:
            obs = r.observation
            i = INFOSETS.index(f"{CARDS.index(obs['card'])}{node_of(obs['betting'])}")
            q = self.probabilities()[i]
            bet = bool(r.rng.random() < q)
            score = np.zeros(len(INFOSETS))
            score[i] = (1.0 - q) if bet else -q
            out.append(ScoredDecision(next(a for a in r.legal if ACTION_INDEX[a] == int(bet)), score=score))
        return out


def builder(*overrides: str) -> tuple[ExactValueBuilder, object]:
    cfg = compose_config(["game=kuhn", "model=scripted", "sepo.estimator=exact_values", *overrides])
    return ExactValueBuilder(cfg, sepo_settings(cfg)), make_game(cfg.game)


def objective_terms(b: ExactValueBuilder, theta: np.ndarray) -> dict[str, float]:
    m = b.objective.measured(TableAgent(theta).table())
    scale, lam = b.objective.reward_scale, b.objective.lambda_e
    return {"u": scale * m["train/u"], "e": -lam * scale * m["exploit/e"], "total": m["objective"]}


def finite_difference(b: ExactValueBuilder, theta: np.ndarray, h: float = 1e-5) -> dict[str, np.ndarray]:
    up = [objective_terms(b, theta + h * d) for d in np.eye(len(theta))]
    down = [objective_terms(b, theta - h * d) for d in np.eye(len(theta))]
    return {k: np.array([(a[k] - z[k]) / (2 * h) for a, z in zip(up, down)]) for k in ("u", "e", "total")}


def mean_updates(b, game, agent, batches: int, state: EstimatorState) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    updates: dict[str, list[np.ndarray]] = {"u": [], "e": [], "total": []}
    exact = {k: float(p[1]) for k, p in agent.table().items()}
    for i in range(batches):
        state.table = dict(exact)  # the responder and the switches answer the policy itself
        batch = b.collect(game, agent, i, state)
        scores = np.stack([d.score for d in batch.decisions])
        for k in updates:
            updates[k].append(batch.unscaled[k] @ scores)
    return {k: (np.mean(v, axis=0), np.std(v, axis=0, ddof=1) / np.sqrt(batches)) for k, v in updates.items()}


THETA = np.random.default_rng(0).normal(0.0, 1.0, len(INFOSETS))


def test_expected_update_is_the_gradient_of_j_term_by_term():
    b, game = builder("sepo.infoset_samples=8", "sepo.responder_table_decay=1.0")
    agent = TableAgent(THETA)
    fd = finite_difference(b, THETA)
    got = mean_updates(b, game, agent, 300, EstimatorState())
    for term in ("u", "e", "total"):
        mean, se = got[term]
        assert np.all(np.abs(mean - fd[term]) <= 4.0 * se + 1e-9), (term, mean, fd[term], se)
        # and the check can fail: the gradient is not zero, and is resolved by the batches
        assert np.abs(fd[term]).max() > 10 * se.max()


def test_the_advantages_follow_from_the_rules():
    """One batch by hand: A = J_I(a) - mean of J_I over the other answers at I, over K, for each term."""
    b, game = builder("sepo.infoset_samples=4")
    agent = TableAgent(THETA)
    state = EstimatorState(table={k: float(p[1]) for k, p in agent.table().items()})
    held = agent.table()
    batch = b.collect(game, agent, 0, state)
    played = {k: np.array([1.0 - batch.stats[f"bet_or_call/{k}"], batch.stats[f"bet_or_call/{k}"]]) for k in INFOSETS}
    responder = best_response_table(held)
    for i, key in enumerate(INFOSETS):
        rows = range(4 * i, 4 * i + 4)
        values = []
        for d in (batch.decisions[r] for r in rows):
            moved = dict(played)
            moved[key] = np.eye(2)[ACTION_INDEX[d.action]]
            u = np.mean([b.objective.value(moved, t) for t in b.objective.train.values()])
            exploit = {n: responder if t is None else t for n, t in b.objective.exploit.items()}
            on = {n: -2.0 * b.objective.value(held, t) > 0 for n, t in exploit.items()}
            e = np.mean([on[n] * -2.0 * b.objective.value(moved, t) for n, t in exploit.items()])
            values.append(b.objective.reward_scale * u - b.objective.lambda_e * b.objective.reward_scale * e)
        np.testing.assert_allclose(batch.unscaled["total"][list(rows)], leave_one_out(np.array(values)) / 4, atol=1e-12)


def test_batch_reports_the_table_it_read_and_its_exploitability():
    b, game = builder("sepo.infoset_samples=4")
    batch = b.collect(game, TableAgent(THETA), 0, EstimatorState())
    table = {k: np.array([1 - batch.stats[f"bet_or_call/{k}"], batch.stats[f"bet_or_call/{k}"]]) for k in INFOSETS}
    assert batch.stats["exploit_exact"] == pytest.approx(exploitability(table))
    assert len(batch.decisions) == 4 * len(INFOSETS)
    assert batch.stats["collusive/c"] == 0.0 and batch.stats["train/x"] == 0.0


def test_the_running_table_is_kept_for_resume():
    """The responder's table lives in the estimator state, so a resumed run answers what the uninterrupted one did."""
    b, game = builder("sepo.infoset_samples=4", "sepo.responder_table_decay=0.5")
    state = EstimatorState()
    first = b.collect(game, TableAgent(THETA), 0, state)
    read = {k: first.stats[f"bet_or_call/{k}"] for k in INFOSETS}
    assert state.table == pytest.approx(read)  # the first batch's own table starts the running mean
    b.collect(game, TableAgent(THETA), 1, state)
    restored = EstimatorState()
    restored.load(state.to_dict())
    assert restored.table == state.table


def test_exact_values_is_for_kuhn_only():
    with pytest.raises(
        ConfigError, match=r"sepo.estimator=exact_values is not allowed for game=ipd.*allowed: game=kuhn"
    ):
        validate(compose_config(["game=ipd", "model=tiny", "stage=sepo", "sepo.estimator=exact_values"]))


#: SEPO on tiny Kuhn poker with exact values: 3 answers per information set, 4-token answers
KUHN_EXACT = [
    "stage=sepo",
    "model=tiny",
    "game=kuhn",
    "logger=none",
    "sepo.estimator=exact_values",
    "sepo.infoset_samples=3",
    "sepo.steps=3",
    "sepo.checkpoint_steps=[1]",
    "sepo.max_new_tokens=4",
    "eval.max_new_tokens=4",
    "eval.episodes_per_opponent=2",
    "eval.action_samples=2",
    "eval.progress=false",
]


@pytest.mark.slow  # 30 s to 3 min on 2 cores, beside faster tests of the same path
def test_a_run_with_exact_values_resumes_where_it_was_killed(cli, tmp_path):
    """The loop trains on the information sets' answers, logs the table's exploitability each step, and a run
    killed after step 2 resumes (the running table, the advantage scale and the optimizer from the checkpoint
    at step 1) to the very adapter of the uninterrupted run."""
    straight = cli(*KUHN_EXACT, f"paths.root_dir={tmp_path / 'a'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "step 3  loss" in straight.stderr + straight.stdout
    assert "exploit_exact" in (straight.stderr + straight.stdout).split("step 1  loss")[1].splitlines()[0]
    (run_a,) = run_dirs(tmp_path / "a", "DONE")
    state = json.loads((run_a / "checkpoints" / "step_1" / "estimator_state.json").read_text())
    assert set(state["table"]) == set(INFOSETS)

    killed = cli(*KUHN_EXACT, "sepo.debug_kill_after_step=2", f"paths.root_dir={tmp_path / 'b'}")
    assert killed.returncode == -9
    resumed = cli(*KUHN_EXACT, f"paths.root_dir={tmp_path / 'b'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run_b,) = run_dirs(tmp_path / "b", "DONE")
    a, b = final_adapter(run_a), final_adapter(run_b)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
