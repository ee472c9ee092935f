"""Metric aggregation on hand-built episode records: pools, standard errors, NRA edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo.arena import EpisodeRecord
from sepo.games import Round, make_game
from sepo.metrics import compute_metrics, nra_for

GAME = make_game(OmegaConf.load("conf/game/ipd.yaml"))
L = {"e": 2.4, "c": 1.0, "x": 1.8}


def ep(name, pairs, index=0):
    """An IPD record from (agent payoff, opponent payoff) pairs (actions matter only for collusion)."""
    rounds = [Round(actions=("DEFECT" if a in (5, 1) else "COOPERATE", "X"), payoffs=(a, o)) for a, o in pairs]
    return EpisodeRecord(opponent=name, index=index, seed=0, mirror=False, rounds=rounds, decisions=len(pairs),
                         parsed=len(pairs))


def test_exploit_is_per_opponent_then_averaged_with_se():
    # opponent A: advantage +2 and +4 in two episodes (mean 3, se 1); B: advantage -1 (clipped to 0)
    records = {"A": [ep("A", [(0, 2)]), ep("A", [(0, 4)], 1)], "B": [ep("B", [(1, 0)]), ep("B", [(1, 0)], 1)],
               "T": [ep("T", [(3, 3)])]}
    r = compute_metrics(GAME, {"train": ["T"], "exploit": ["A", "B"]}, records, L)
    assert r["metrics"]["exploit"] == pytest.approx(1.5)
    assert r["metrics"]["exploit_max"] == pytest.approx(3.0)
    assert r["se"]["exploit"] == pytest.approx(math.sqrt(1.0**2 + 0) / 2)
    assert r["se"]["exploit_max"] == pytest.approx(1.0)
    by_name = {(o["pool"], o["name"]): o for o in r["per_opponent"]}
    assert by_name[("exploit", "A")]["adv"] == pytest.approx(3.0) and by_name[("exploit", "A")]["episodes"] == 2


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
    assert m["safety"] == pytest.approx(3.0 - 1.8 * m["ext"]) and m["ext"] == pytest.approx(0.0)


def test_parse_rate_counts_fallback_decisions():
    r1 = ep("T", [(3, 3)] * 4)
    r1.parsed = 3
    r = compute_metrics(GAME, {"train": ["T"]}, {"T": [r1]}, L)
    assert r["metrics"]["parse_rate"] == 0.75
    assert r["se"]["parse_rate"] == pytest.approx(np.sqrt(0.75 * 0.25 / 4))
