"""docs/spec.md §4.4's gradient check: the training batch code estimates grad J_SEPO, term by term.

A parametric scripted IPD agent runs through the same batch-building code as training
(`BatchBuilder`); its mean estimated update is compared with central finite differences of the
exact J (dynamic programming). `python -m benchmarks gradcheck` runs the same check with more
batches and prints the table.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.estimator.finite_differences import (
    DEFAULT_POINTS,
    KINK_POINTS,
    estimate_update,
    exact_terms,
    finite_difference,
    make_agent,
    opponent_means,
    term_agrees,
    total_agrees,
)
from sepo.arena import play
from sepo.games import make_game
from sepo.games.strategy import make_strategy
from sepo.training.objective import sepo_settings, term_keys

from .conftest import ROOT

BATCHES = 250  # per point: the SE is then under 5% of every term's gradient norm (measured)


@pytest.fixture
def ipd(compose_cfg):
    def _cfg(*overrides):
        cfg = compose_cfg("game=ipd", *overrides)
        return cfg, sepo_settings(cfg)

    return _cfg


@pytest.mark.parametrize("kind, probs", [("constant", (0.7,)), ("reactive", (0.8, 0.9, 0.3))])
def test_the_exact_objective_matches_play_through_the_arena(ipd, kind, probs):
    """The dynamic programme's opponents are a second implementation of docs/spec.md §2's strategies."""
    cfg, _ = ipd()
    game, agent = make_game(cfg.game), make_agent(kind, probs)
    names = sorted({n for pool in ("train", "exploit", "collusive", "robust") for n in cfg.game.pools[pool]})
    records = play(game, agent, {n: make_strategy(cfg.game, n) for n in names}, episodes=300, seed=3)
    for name in names:
        eps = [r for r in records if r.opponent == name]
        exact = opponent_means(agent, name, cfg.game)
        for key, value in (("pay", lambda e: e.agent_total), ("opp_pay", lambda e: e.opp_total)):
            sample = np.array([value(e) for e in eps]) / game.num_rounds
            se = max(sample.std(ddof=1) / np.sqrt(len(sample)), 1e-9)
            assert abs(sample.mean() - exact[key]) <= 4 * se, (name, key, sample.mean(), exact[key])


def test_the_exact_terms_reproduce_the_spec_numbers(ipd):
    """AlwaysD's advantage is 5p and AltD's 5p - 2.5 for an agent that cooperates with probability p."""
    cfg, s = ipd()
    terms = exact_terms(make_agent("constant", (0.8,)), cfg, s)
    assert terms["adv/AlwaysD"] == pytest.approx(4.0)
    assert terms["adv/AltD"] == pytest.approx(1.5)
    assert terms["e"] == pytest.approx(-2.4 * (4.0 + 1.5) / 2)  # s = 1 on IPD
    assert terms["c"] == pytest.approx(-1.0 * 0.2)  # defects on AlwaysC one round in five


@pytest.mark.parametrize("kind, probs", DEFAULT_POINTS)
def test_the_default_estimator_follows_the_gradient_of_every_term(ipd, kind, probs):
    cfg, s = ipd()
    agent = make_agent(kind, probs)
    advantages = [v for k, v in exact_terms(agent, cfg, s).items() if k.startswith("adv/")]
    assert min(abs(a) for a in advantages) >= 0.6  # every exploit opponent far from the kink of max(0, .)
    fd = finite_difference(agent, cfg, s)
    est = estimate_update(agent, cfg, s, BATCHES, burn_in=20)
    for k in term_keys():
        assert term_agrees(est.mean[k], fd[k]), (k, est.mean[k], est.se[k], fd[k])
        assert term_agrees(est.scaled[k], fd[k]), (k, "after the batch scale", est.scaled[k], fd[k])
    assert total_agrees(est.mean, fd)
    assert total_agrees({"total": est.scaled["total"]}, fd)
    np.testing.assert_allclose(sum(est.mean[k] for k in term_keys()), est.mean["total"], atol=1e-9)


@pytest.mark.parametrize("kind, probs", KINK_POINTS)
def test_the_exploit_term_at_the_kink_of_max_0_adv(ipd, kind, probs):
    """AltD's advantage is +0.3 or -0.3 here: the switch from earlier batches keeps the kink sharp (the
    current batch's noise would smear it over about +-1 payoff unit, docs/spec.md §4.2)."""
    cfg, s = ipd()
    agent = make_agent(kind, probs)
    assert abs(exact_terms(agent, cfg, s)["adv/AltD"]) == pytest.approx(0.3)
    est = estimate_update(agent, cfg, s, BATCHES, burn_in=20)
    fd = finite_difference(agent, cfg, s)
    assert term_agrees(est.mean["e"], fd["e"])
    assert term_agrees(est.scaled["e"], fd["e"])


def test_the_papers_shared_penalty_gives_exactly_zero(ipd):
    cfg, s = ipd("sepo.penalty_mode=shared")
    est = estimate_update(make_agent("reactive", (0.9, 0.9, 0.5)), cfg, s, 10)
    for k in ("e", "c", "x"):
        assert np.abs(est.mean[k]).max() < 1e-12
    assert np.abs(est.mean["u"]).max() > 0.01


@pytest.mark.parametrize("kind, probs", [("constant", (0.8,)), ("reactive", (0.9, 0.9, 0.5))])
def test_the_papers_per_rollout_penalty_has_zero_expected_gradient(ipd, kind, probs):
    cfg, s = ipd("sepo.penalty_mode=per_rollout")
    agent = make_agent(kind, probs)
    est = estimate_update(agent, cfg, s, BATCHES)
    fd = finite_difference(agent, cfg, s)
    for k in ("e", "c"):
        assert np.all(np.abs(est.mean[k]) <= 2 * est.se[k]), (k, est.mean[k], est.se[k])
        assert np.linalg.norm(est.mean[k]) < 0.1 * np.linalg.norm(fd[k])  # where J's gradient is large
    assert term_agrees(est.mean["u"], fd["u"])  # u is estimated as in the default


def test_doubling_lambda_e_doubles_the_exploit_part(ipd):
    agent = make_agent("constant", (0.8,))
    one = estimate_update(agent, *ipd(), 10)
    two = estimate_update(agent, *ipd("lambdas.train.e=4.8"), 10)
    np.testing.assert_allclose(two.mean["e"], 2 * one.mean["e"], rtol=1e-12)
    np.testing.assert_allclose(two.mean["u"], one.mean["u"], rtol=1e-12)
    # the paper's per-group normalisation erases lambda: the same update whatever lambda_e
    flat = [
        estimate_update(agent, *ipd("sepo.adv_norm=group_round", f"lambdas.train.e={e}"), 10).mean["total"]
        for e in (2.4, 4.8)
    ]
    np.testing.assert_allclose(flat[0], flat[1], rtol=1e-6)  # up to the 1e-8 stabiliser of its std


def test_the_papers_per_round_credit_gives_payoff_the_wrong_sign(ipd):
    """Against TFT and Grim more cooperation pays later; crediting each round alone misses it (docs/spec.md §4.1)."""
    cfg, s = ipd("sepo.credit=round")
    agent = make_agent("constant", (0.8,))
    assert finite_difference(agent, cfg, s)["u"][0] > 0.15
    est = estimate_update(agent, cfg, s, 100)
    assert est.mean["u"][0] < -5 * est.se["u"][0] < 0


def test_the_objective_rewards_end_game_defection_below_a_lambda_c_of_about_1_5(ipd):
    """Near TFT, J's gradient on cooperating in the last round (after a cooperation) is negative at IPD's
    lambda_c = 1: defecting on TFT, Grim and Generous TFT when no retaliation can follow gains more pay
    than the collusion it shows on AlwaysC costs. It turns positive between lambda_c 1.4 and 1.6, so SEPO
    trained on IPD's lambda may rightly keep a last-round defection (docs/results.md §1)."""

    def last_round_gradient(lambda_c: float) -> dict[str, float]:
        cfg, s = ipd(f"lambdas.train.c={lambda_c}")
        fd = finite_difference(make_agent("endgame", (0.99, 0.99, 0.01, 0.5)), cfg, s)
        return {k: float(v[3]) for k, v in fd.items()}

    at_ipd = last_round_gradient(1.0)
    assert at_ipd["u"] < -0.05
    assert at_ipd["c"] == pytest.approx(0.25 * 1.0 / 8)
    assert at_ipd["e"] == 0.0
    assert at_ipd["total"] < -0.01
    assert last_round_gradient(1.4)["total"] < 0 < last_round_gradient(1.6)["total"]
    assert last_round_gradient(2.0)["total"] > 0.01


@pytest.mark.parametrize("p0", [0.5, 0.9, 0.99])
def test_the_first_round_trades_exploit_against_collusion(ipd, p0):
    """Round 1 has no history, so an agent plays it alike against AlwaysD and AlwaysC: TFT that opens
    with COOPERATE w.p. p0 has e = 0.3125 * p0 (AlwaysD takes round 1; AltD's advantage is <= 0) and
    c = (1 - p0) / 8 (it defects once on AlwaysC, then copies its cooperation). Exploit below TFT's
    0.3125 costs collusion above 0, whatever the estimator (docs/results.md §1)."""
    cfg, s = ipd()
    sure = 1 - 1e-12
    terms = exact_terms(make_agent("reactive", (p0, sure, 1 - sure)), cfg, s)
    assert -terms["e"] / 2.4 == pytest.approx(0.3125 * p0, abs=1e-9)
    assert -terms["c"] / 1.0 == pytest.approx((1 - p0) / 8, abs=1e-9)


def last_json_line(module: str, *args: str) -> dict:
    """Runs `python -m <module>` (a benchmark) on one thread; its last line of output, a JSON object."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kuhn_with_the_best_responder_the_batch_update_follows_grad_j_and_j_descends_exploitability(tmp_path):
    """benchmarks/kuhn/kuhn_gradient.py at a generic table (seeded, probabilities in [0.15, 0.85]: the best
    response is unique and no exploit opponent sits at its kink): the mean update over 300 batches
    agrees with the exact gradient of J coordinate by coordinate, and that gradient points down the
    exploitability, more so than without the best responder (0.72 against 0.51 here)."""
    import json

    from sepo.games.kuhn import exact as K

    rng = np.random.default_rng(1)
    point = {k: float(rng.uniform(0.15, 0.85)) for k in K.INFOSETS}
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"played_table": {"bet_or_call": point}}))

    def run(*extra):
        return last_json_line(
            "benchmarks.kuhn.kuhn_gradient",
            "--results",
            str(results),
            *extra,
            "--batches",
            "300",
            "--variants",
            "return_to_go:4",
        )

    with_br = run()
    assert with_br["exact"]["best_response_unique"]
    assert with_br["variants"]["return_to_go:4"]["cosine"] > 0.95
    assert with_br["variants"]["return_to_go:4"]["max_abs_z"] < 3.5  # unbiased: all 12 coordinates within noise
    paper = run("game.pools.exploit=[NashApx,AlwaysBet]")
    descent = {
        name: r["exact"]["cosine_grad_J_with_minus_grad_exploitability"]
        for name, r in (("br", with_br), ("paper", paper))
    }
    assert descent["br"] > 0.5, descent
    assert descent["br"] > descent["paper"] + 0.1, descent


#: the Kuhn SFT checkpoint of tiny's played table, P(BET or CALL) (docs/results.md section 2), exploitability 0.10
SFT_LIKE_TABLE = (0.15, 0.06, 0.09, 0.05, 0.05, 0.02, 0.53, 0.59, 0.98, 0.95, 0.92, 0.70)


def test_kuhn_descent_lowers_exploitability_through_the_batch_code(tmp_path):
    """benchmarks/kuhn/kuhn_descent.py: the 12-parameter table agent trained on fresh SEPO batches from an SFT-like
    table. With the best responder as the only exploit opponent, 80 batches at lr 0.1 take every seed below
    half the start (exploitability descent: Danskin, the response re-solved every 5 steps); with Kuhn's whole
    default pool 40 batches raise the exact J of every seed."""
    import json

    from sepo.games.kuhn import exact as K

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"played_table": {"bet_or_call": dict(zip(K.INFOSETS, SFT_LIKE_TABLE))}}))

    def run(steps, *extra):
        return last_json_line(
            "benchmarks.kuhn.kuhn_descent",
            "--results",
            str(results),
            *extra,
            "--steps",
            str(steps),
            "--lrs",
            "0.1",
            "--schedules",
            "constant",
            "--seeds",
            "0",
            "1",
        )

    alone = run(80, "game.pools.exploit=[BestResponse]")
    start = alone["start"]["exploitability"]
    assert 0.08 < start < 0.12
    assert all(r["exploitability"] < start / 2 for r in alone["runs"]), alone["runs"]
    default = run(40)
    assert all(r["delta_J"] > 0 for r in default["runs"]), default["runs"]


def test_pools_of_their_own_size_keep_every_terms_gradient(ipd):
    """`sepo.rollouts_by_pool`: 2 rollouts per exploit opponent and 8 on the cooperator, 4 elsewhere; each pool's
    term is averaged over its own groups, so the expected update is still J's gradient, term by term."""
    cfg, s = ipd("sepo.rollouts_by_pool={exploit:2,collusive:8}")
    agent = make_agent("reactive", (0.9, 0.9, 0.5))
    fd = finite_difference(agent, cfg, s)
    est = estimate_update(agent, cfg, s, BATCHES, burn_in=20)
    for k in term_keys():
        assert term_agrees(est.mean[k], fd[k]), (k, est.mean[k], est.se[k], fd[k])
