"""The SEPO objective's pure parts: rewards per penalty mode, per-round advantages, the token loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sepo.arena import EpisodeRecord
from sepo.games import Round, make_game
from sepo.objective import Group, per_round_advantages, pooled_rewards, token_loss, train_rewards

IPD = make_game(OmegaConf.load("conf/game/ipd.yaml"))
C, D = "COOPERATE", "DEFECT"
PAY = {(C, C): (3, 3), (D, D): (1, 1), (D, C): (5, 0), (C, D): (0, 5)}
LAM = {"e": 2.4, "c": 1.0, "x": 1.8}


def episode(name, moves):
    return EpisodeRecord(name, 0, 0, False, rounds=[Round(actions=m, payoffs=PAY[m]) for m in moves])


def test_advantages_normalise_each_round_across_rollouts():
    rewards = np.array([[1.0, 3.0, 0.0], [3.0, 3.0, 2.0]])
    adv = per_round_advantages(rewards)
    s = np.sqrt(2.0)  # unbiased std of {1, 3}
    np.testing.assert_allclose(adv, [[-1 / s, 0.0, -1 / s], [1 / s, 0.0, 1 / s]], atol=1e-7)
    assert not np.isnan(per_round_advantages(np.ones((4, 8)))).any()
    assert (per_round_advantages(np.ones((4, 8))) == 0).all()
    assert (per_round_advantages(np.array([[1.0, 2.0]])) == 0).all()  # a group of one: no baseline


def test_shared_penalty_cancels_and_per_rollout_does_not():
    rollouts = [episode("TFT", [(C, C), (D, C)]), episode("TFT", [(D, C), (D, D)])]
    group = Group("train", "TFT", rollouts)
    exploit_bad = {"exploit": {"AlwaysD": [episode("AlwaysD", [(C, D), (C, D)])]}, "collusive": {}}
    exploit_ok = {"exploit": {"AlwaysD": [episode("AlwaysD", [(D, D), (D, D)])]}, "collusive": {}}
    none = train_rewards(IPD, group, 1.0, {"e": 0, "c": 0, "x": 0}, "shared", [exploit_bad] * 2)
    shared = train_rewards(IPD, group, 1.0, LAM, "shared", [exploit_bad] * 2)
    assert not np.allclose(none, shared)  # the penalty is there ...
    np.testing.assert_allclose(per_round_advantages(shared), per_round_advantages(none), atol=1e-6)  # ... and cancels
    per_rollout = train_rewards(IPD, group, 1.0, LAM, "per_rollout", [exploit_bad, exploit_ok])
    # rollout 0 was exploited (adv 5 per round), rollout 1 not: e differs by 5, times lambda_e
    x = [np.mean([1 - 6 / 6, 1 - 5 / 6]), np.mean([1 - 5 / 6, 1 - 2 / 6])]
    expected = np.array([[3, 5], [5, 1]]) - np.array([[2.4 * 5 + 1.8 * x[0]], [1.8 * x[1]]])
    np.testing.assert_allclose(per_rollout, expected)
    assert not np.allclose(per_round_advantages(per_rollout), per_round_advantages(none))


def test_pooled_rewards_per_pool():
    exploit = Group("exploit", "AlwaysD", [episode("AlwaysD", [(C, D), (D, D)])])
    np.testing.assert_allclose(pooled_rewards(IPD, exploit, 2.0, LAM), [[-2.4 * 2 * 5, 0.0]])
    collusive = Group("collusive", "AlwaysC", [episode("AlwaysC", [(D, C), (C, C)])])
    np.testing.assert_allclose(pooled_rewards(IPD, collusive, 2.0, LAM), [[-1.0, 0.0]])
    train = Group("train", "TFT", [episode("TFT", [(C, C), (D, D)])])
    np.testing.assert_allclose(train_rewards(IPD, train, 2.0, LAM, "pooled"), [[6.0, 2.0 - 1.8 * (1 - 2 / 6)]])


def test_token_loss_matches_the_ppo_formula_and_averages_per_decision():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = token_loss(logp, old, ref, adv, mask, clip_eps=0.2, beta=0.1)
    r = np.exp([0.2, -1.0])
    tok0 = [-min(r[0] * 1, min(r[0], 1.2) * 1) + 0.1 * 0.5, -min(r[1] * 1, max(r[1], 0.8) * 1) + 0.1 * 0.0]
    tok1 = -min(1.0 * -2, 1.0 * -2) + 0.1 * 0.0
    assert loss.item() == pytest.approx((np.mean(tok0) + tok1) / 2, rel=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)
    loss.backward()
    assert logp.grad[0, 2] == 0 and logp.grad[1, 1] == 0  # padding gets no gradient
