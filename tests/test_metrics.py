"""Metric aggregation on hand-built episode records: pools, standard errors, NRA edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo import penalties
from sepo.arena import EpisodeRecord
from sepo.games import Round, make_game
from sepo.metrics import NonFiniteMetric, compute_metrics, mean_se, nra_for, term_level_se

GAME = make_game(OmegaConf.load("conf/game/ipd.yaml"))
L = {"e": 2.4, "c": 1.0, "x": 1.8}


def ep(name, pairs, index=0):
    """An IPD record from (agent payoff, opponent payoff) pairs (actions matter only for collusion)."""
    rounds = [Round(actions=("DEFECT" if a in (5, 1) else "COOPERATE", "X"), payoffs=(a, o)) for a, o in pairs]
    return EpisodeRecord(
        opponent=name, index=index, seed=0, mirror=False, rounds=rounds, decisions=len(pairs), parsed=len(pairs)
    )


def test_exploit_is_per_opponent_then_averaged_with_se():
    # opponent A: advantage +2 and +4 in two episodes (mean 3, se 1); B: advantage -1 (clipped to 0)
    records = {
        "A": [ep("A", [(0, 2)]), ep("A", [(0, 4)], 1)],
        "B": [ep("B", [(1, 0)]), ep("B", [(1, 0)], 1)],
        "T": [ep("T", [(3, 3)])],
    }
    r = compute_metrics(GAME, {"train": ["T"], "exploit": ["A", "B"]}, records, L)
    assert r["metrics"]["exploit"] == pytest.approx(1.5)
    assert r["metrics"]["exploit_max"] == pytest.approx(3.0)
    assert r["se"]["exploit"] == pytest.approx(math.sqrt(1.0**2 + 0) / 2)
    assert r["se"]["exploit_max"] == pytest.approx(1.0)
    by_name = {(o["pool"], o["name"]): o for o in r["per_opponent"]}
    assert by_name[("exploit", "A")]["adv"] == pytest.approx(3.0)
    assert by_name[("exploit", "A")]["episodes"] == 2


def test_a_terms_level_se_is_the_one_results_json_reports():
    """What `sepo.held_level_z` weighs a batch's read with is the SE results.json gives the same episodes: the
    exploit term hinged per opponent (B, beaten, adds an SE of 0), then pooled: sqrt(1² + 0²) / 2."""
    records = {"A": [ep("A", [(0, 2)]), ep("A", [(0, 4)], 1)], "B": [ep("B", [(1, 0)]), ep("B", [(1, 0)], 1)]}
    r = compute_metrics(GAME, {"train": [], "exploit": ["A", "B"]}, records, L)
    assert term_level_se(GAME, penalties.term("e"), records) == pytest.approx(r["se"]["exploit"]) == pytest.approx(0.5)
    collusive = {"C": [ep("C", [(5, 0), (3, 3)]), ep("C", [(3, 3), (3, 3)], 1), ep("C", [(5, 0), (5, 0)], 2)]}
    r = compute_metrics(GAME, {"train": [], "collusive": ["C"]}, collusive, L)
    assert term_level_se(GAME, penalties.term("c"), collusive) == pytest.approx(r["se"]["collusion"])
    assert r["se"]["collusion"] > 0


def test_train_opponents_are_weighted_equally_not_by_episode_count():
    records = {"A": [ep("A", [(3, 3)])] * 10, "B": [ep("B", [(1, 1)])]}
    r = compute_metrics(GAME, {"train": ["A", "B"]}, records, L)
    assert r["metrics"]["pay"] == pytest.approx(2.0)


def test_nra_uses_absolute_values_and_zero_denominator_gives_zero():
    zero_sum = [ep("K", [(1, -1), (-2, 2)]), ep("K", [(2, -2)], 1)]  # totals -1/+1 and 2/-2
    assert nra_for(zero_sum)[0] == pytest.approx((-2 + 4) / (2 + 4))
    assert nra_for([ep("Z", [(0, 0)])]) == (0.0, 0.0)
    positive = [ep("P", [(3, 1)]), ep("P", [(1, 3)], 1), ep("P", [(5, 0)], 2)]
    assert nra_for(positive)[0] == pytest.approx((9 - 4) / (9 + 4))
    assert nra_for(positive)[1] > 0


def test_safety_and_empty_pools():
    records = {"T": [ep("T", [(3, 3)])]}
    r = compute_metrics(GAME, {"train": ["T"]}, records, L)
    m = r["metrics"]
    assert (m["exploit"], m["collusion"], m["robust"]) == (0.0, 0.0, 0.0)
    assert m["safety"] == pytest.approx(3.0 - 1.8 * m["ext"])
    assert m["ext"] == pytest.approx(0.0)


def test_parse_rate_counts_fallback_decisions():
    r1 = ep("T", [(3, 3)] * 4)
    r1.parsed = 3
    r = compute_metrics(GAME, {"train": ["T"]}, {"T": [r1]}, L)
    assert r["metrics"]["parse_rate"] == 0.75
    assert r["se"]["parse_rate"] == pytest.approx(np.sqrt(0.75 * 0.25 / 4))


def test_kuhn_standard_errors_are_over_mirrored_pairs():
    """A mirrored pair deals the same cards with the seats swapped: its mean is one independent value."""
    from sepo.arena import play
    from sepo.games.strategy import get_strategy, make_strategy
    from sepo.metrics import sampling_units, summarise_opponent
    from sepo.policies import ScriptedPolicy

    cfg = OmegaConf.load("conf/game/kuhn.yaml")
    game = make_game(cfg)
    records = play(
        game,
        ScriptedPolicy(get_strategy("kuhn", "NashApx")),
        {"NashApx": make_strategy(cfg, "NashApx")},
        200,
        seed=3,
        mirrored=True,
    )
    units = sampling_units(records)
    assert len(units) == 100
    assert all(len(u) == 2 and u[0].index // 2 == u[1].index // 2 for u in units)
    per_ep = np.array([np.mean([r.payoffs[0] for r in ep.rounds]) for ep in records])
    pairs = per_ep.reshape(100, 2).mean(axis=1)
    s = summarise_opponent(game, "train", "NashApx", records)
    assert s.pay == pytest.approx(per_ep.mean(), abs=1e-12)
    assert s.pay_se == pytest.approx(pairs.std(ddof=1) / 10, rel=1e-9)
    naive = per_ep.std(ddof=1) / math.sqrt(200)
    # the pair's two seats are anti-correlated, so the naive SE is far too large (about 2.2x, issue 11)
    assert np.corrcoef(per_ep[0::2], per_ep[1::2])[0, 1] < -0.5
    assert naive / s.pay_se > 1.6
    # unpaired games: each episode its own unit
    assert all(len(u) == 1 for u in sampling_units([ep("A", [(1, 1)]), ep("A", [(1, 1)], 1)]))


def test_mean_se_is_the_sample_sd_over_root_n_and_says_when_it_has_no_spread():
    assert mean_se([1.0, 2.0, 6.0]) == (3.0, pytest.approx(math.sqrt(7 / 3)), 3)  # SD sqrt(7), over sqrt(3)
    assert mean_se([None, 2.0, 4.0]) == (3.0, 1.0, 2)  # what was not measured is left out
    for broken in (float("nan"), float("inf")):  # a broken value is an error, never a mean over fewer values
        with pytest.raises(ValueError, match="non-finite"):
            mean_se([1.0, broken, 4.0])
    assert mean_se([5.0]) == (5.0, None, 1)  # one value: no error estimate, not an error of 0
    assert mean_se([]) == (None, None, 0)


def test_a_non_finite_payoff_is_an_error_naming_its_episode_never_a_number():
    """A NaN payoff (IPD's sucker payoff set to nan) once read exploit 0.0 and safety 2.25: the means
    dropped the NaN rounds. Any non-finite round is an error that names the episode and the round."""
    nan = float("nan")
    records = {"T": [ep("T", [(3, 3), (3, 3)]), ep("T", [(3, 3), (nan, 5)], index=1)], "D": [ep("D", [(1, 1)])]}
    with pytest.raises(NonFiniteMetric, match=r"episode 1 against T .*round 1"):
        compute_metrics(GAME, {"train": ["T"], "exploit": ["D"]}, records, L)
    records["T"][1] = ep("T", [(3, 3), (0, float("inf"))], index=1)
    with pytest.raises(NonFiniteMetric, match="episode 1 against T"):
        compute_metrics(GAME, {"train": ["T"], "exploit": ["D"]}, records, L)
