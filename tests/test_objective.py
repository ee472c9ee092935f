"""The SEPO estimator's pure parts on hand-made records: term rewards, credit, baseline, weights, scale,
the exploit switch, and the token loss (docs/spec.md §4.2 and 4.3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sepo.arena import EpisodeRecord
from sepo.games import Round, make_game
from sepo.policies.base import Decision
from sepo.training.objective import (
    EstimatorState,
    credit_returns,
    group_advantages,
    group_round_normalise,
    leave_one_out,
    paper_terms,
    pooled_terms,
    token_loss,
)
from sepo.training.rollouts import BatchBuilder, BatchPlan, GroupPlan

IPD = make_game(OmegaConf.load("conf/game/ipd.yaml"))
C, D = "COOPERATE", "DEFECT"
PAY = {(C, C): (3, 3), (D, D): (1, 1), (D, C): (5, 0), (C, D): (0, 5)}
LAM = {"e": 2.4, "c": 1.0, "x": 1.8}


def episode(name, moves, trace=False):
    record = EpisodeRecord(name, 0, 0, False, rounds=[Round(actions=m, payoffs=PAY[m]) for m in moves])
    if trace:
        record.trace = [(t, None, Decision(m[0])) for t, m in enumerate(moves)]
    return record


def test_return_to_go_sums_the_rest_of_the_episode_and_round_credit_does_not():
    f = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
    np.testing.assert_array_equal(credit_returns(f, "return_to_go"), [[6.0, 5.0, 3.0], [3.0, 3.0, 4.0]])
    np.testing.assert_array_equal(credit_returns(f, "round"), f)
    with pytest.raises(ValueError, match="allowed: return_to_go, round"):
        credit_returns(f, "episode")


def test_leave_one_out_baseline_excludes_the_rollout_itself():
    G = np.array([[1.0, 4.0], [3.0, 0.0], [5.0, 2.0]])
    # rollout 0, round 0: 1 - (3 + 5)/2 = -3; rollout 1: 3 - (1 + 5)/2 = 0; rollout 2: 5 - (1 + 3)/2 = 3
    np.testing.assert_allclose(leave_one_out(G), [[-3.0, 3.0], [0.0, -3.0], [3.0, 0.0]])
    assert (leave_one_out(np.ones((4, 8))) == 0).all()  # a tied group: 0, never NaN
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        leave_one_out(np.ones((1, 3)))


def test_group_round_is_the_papers_normalisation():
    rewards = np.array([[1.0, 3.0, 0.0], [3.0, 3.0, 2.0]])
    s = np.sqrt(2.0)  # sample std of {1, 3}
    np.testing.assert_allclose(
        group_round_normalise(rewards, 1e-8), [[-1 / s, 0, -1 / s], [1 / s, 0, 1 / s]], atol=1e-7
    )
    # it erases lambda: scaling a group's rewards by 1000 changes nothing
    np.testing.assert_allclose(
        group_advantages(1000 * rewards, "round", "group_round", 1e-8),
        group_advantages(rewards, "round", "group_round", 1e-8),
        atol=1e-6,
    )
    # the default keeps it: the advantage scales with the reward
    np.testing.assert_allclose(
        group_advantages(1000 * rewards, "return_to_go", "batch", 1e-8),
        1000 * group_advantages(rewards, "return_to_go", "batch", 1e-8),
    )


def test_pooled_term_rewards_per_pool():
    train = [episode("TFT", [(C, C), (D, D)])]
    terms = pooled_terms(IPD, "train", train, 2.0, LAM)
    np.testing.assert_allclose(terms["u"], [[6.0, 2.0]])
    np.testing.assert_allclose(terms["x"], [[0.0, -1.8 * (1 - 2 / 6)]])
    exploit = [episode("AlwaysD", [(C, D), (D, D)])]
    np.testing.assert_allclose(pooled_terms(IPD, "exploit", exploit, 2.0, LAM)["e"], [[-2.4 * 2 * 5, 0.0]])
    np.testing.assert_allclose(pooled_terms(IPD, "exploit", exploit, 2.0, LAM, hinge_on=False)["e"], [[0.0, 0.0]])
    collusive = [episode("AlwaysC", [(D, C), (C, C)])]
    np.testing.assert_allclose(pooled_terms(IPD, "collusive", collusive, 2.0, LAM)["c"], [[-1.0, 0.0]])


def test_shared_penalty_is_one_number_per_group_and_cancels_per_rollout_does_not():
    rollouts = [episode("TFT", [(C, C), (D, C)]), episode("TFT", [(D, C), (D, D)])]
    bad = {"exploit": {"AlwaysD": [episode("AlwaysD", [(C, D), (C, D)])]}, "collusive": {}}
    ok = {"exploit": {"AlwaysD": [episode("AlwaysD", [(D, D), (D, D)])]}, "collusive": {}}
    shared = paper_terms(IPD, rollouts, 1.0, LAM, "shared", [bad, bad])
    for k in ("e", "c", "x"):
        assert np.ptp(shared[k]) == 0  # the same value in every rollout and round ...
        np.testing.assert_allclose(
            leave_one_out(credit_returns(shared[k], "return_to_go")), 0.0, atol=1e-12
        )  # ... cancels
    assert shared["e"][0, 0] == pytest.approx(-2.4 * 5)
    per_rollout = paper_terms(IPD, rollouts, 1.0, LAM, "per_rollout", [bad, ok])
    # rollout 0's auxiliary episode was exploited (advantage 5 per round), rollout 1's not
    np.testing.assert_allclose(per_rollout["e"], [[-12.0, -12.0], [0.0, 0.0]])
    x = [np.mean([1 - 6 / 6, 1 - 5 / 6]), np.mean([1 - 5 / 6, 1 - 2 / 6])]
    np.testing.assert_allclose(per_rollout["x"], [[-1.8 * x[0]] * 2, [-1.8 * x[1]] * 2])


def test_exploit_switch_waits_for_history_then_follows_the_running_mean():
    state = EstimatorState(switch_episodes=4)
    assert state.exploit_on("AltD")  # no history yet: on
    state.record_exploit("AltD", [-1.0, -1.0, -1.0])
    assert state.exploit_on("AltD")  # 3 < 4 episodes: still on
    state.record_exploit("AltD", [-1.0, 1.0])
    assert state.exploit_adv["AltD"] == [-1.0, -1.0, -1.0, 1.0]  # the last 4 episodes only
    assert not state.exploit_on("AltD")  # mean -0.5: max(0, adv) is flat here
    state.record_exploit("AltD", [3.0, 3.0])
    assert state.exploit_on("AltD")  # window -1, 1, 3, 3: mean 1.5


def test_advantage_scale_comes_from_earlier_batches_and_survives_a_checkpoint():
    state = EstimatorState(scale_decay=0.5)
    assert state.scale_for(2.0) == 2.0  # the first batch: its own std
    state.record_std(2.0)
    assert state.scale_for(100.0) == 2.0  # later batches: earlier batches only
    state.record_std(4.0)
    assert state.adv_scale == pytest.approx(0.5 * 2.0 + 0.5 * 4.0)
    state.record_std(0.0)  # an all-tied batch says nothing about the scale
    assert state.adv_scale == pytest.approx(3.0)
    state.record_exploit("AlwaysD", [1.0, 2.0])
    restored = EstimatorState(scale_decay=0.5)
    restored.load(state.to_dict())
    assert restored.to_dict() == state.to_dict()


@pytest.fixture
def builder(compose_cfg):
    from sepo.training.objective import sepo_settings

    cfg = compose_cfg(
        "game=ipd",
        "game.pools.train=[TFT,Grim]",
        "game.pools.exploit=[AlwaysD]",
        "game.pools.collusive=[AlwaysC]",
        "game.pools.robust=[Random]",
        "sepo.rollouts_per_opponent=2",
    )
    return BatchBuilder(cfg, sepo_settings(cfg))


def test_a_hand_made_batch_gets_the_advantages_of_spec_4_2(builder):
    """Two-round episodes, n = 2, s = 1: every number below is worked out by hand in the comments."""
    records = [
        episode("TFT", [(C, C), (C, C)], True),
        episode("TFT", [(D, C), (C, D)], True),
        episode("Grim", [(C, C), (C, C)], True),
        episode("Grim", [(C, C), (C, C)], True),
        episode("AlwaysD", [(C, D), (D, D)], True),
        episode("AlwaysD", [(D, D), (D, D)], True),
        episode("AlwaysC", [(D, C), (C, C)], True),
        episode("AlwaysC", [(C, C), (C, C)], True),
    ]
    plan = BatchPlan(
        0,
        [],
        [
            GroupPlan("train", "TFT", [0, 1]),
            GroupPlan("train", "Grim", [2, 3]),
            GroupPlan("exploit", "AlwaysD", [4, 5]),
            GroupPlan("collusive", "AlwaysC", [6, 7]),
        ],
    )
    state = EstimatorState(switch_episodes=32)
    batch = builder.assemble(IPD, plan, records, state)
    # TFT: f = u - 1.8 x: r0 [3, 3], r1 [5 - 0.3, 0 - 0.3]; returns-to-go r0 [6, 3], r1 [4.4, -0.3];
    # leave-one-out (n = 2): r0 [1.6, 3.3], r1 [-1.6, -3.3]; weight 1 / (|train| 2 * n 2 * T 2) = 1/8
    # Grim: both rollouts alike: 0. AlwaysD: f = -2.4 * (opp - agent): r0 [-12, 0], r1 [0, 0]; G the same;
    # A r0 [-12, 0], r1 [12, 0]; weight 1/4. AlwaysC: f = -1 * [defected]: A r0 [-1, 0], r1 [1, 0]; weight 1/4.
    expected = np.array([1.6 / 8, 3.3 / 8, -1.6 / 8, -3.3 / 8, 0, 0, 0, 0, -3, 0, 3, 0, -0.25, 0, 0.25, 0])
    np.testing.assert_allclose(batch.unscaled["total"], expected, atol=1e-12)
    np.testing.assert_allclose(batch.unscaled["u"][:4], np.array([1, 3, -1, -3]) / 8, atol=1e-12)
    np.testing.assert_allclose(batch.unscaled["x"][:4], np.array([0.6, 0.3, -0.6, -0.3]) / 8, atol=1e-12)
    np.testing.assert_allclose(
        sum(batch.unscaled[k] for k in ("u", "e", "c", "x")), batch.unscaled["total"], atol=1e-12
    )
    std = np.sqrt((2 * 1.6**2 + 2 * 3.3**2 + 2 * 144 + 2 * 1) / 16)  # of all 16 entries of A (mean 0)
    assert batch.scale == pytest.approx(std)  # the first batch uses its own std ...
    np.testing.assert_allclose(batch.advantages, expected / std, atol=1e-9)
    assert [d.action for d in batch.decisions[:4]] == [C, C, D, C]
    assert state.exploit_adv["AlwaysD"] == [2.5, 0.0]  # per-episode advantage, for later batches' switch
    again = builder.assemble(IPD, plan, records, state)
    assert again.scale == pytest.approx(std)  # ... later ones a running mean of earlier batches


def test_token_loss_sums_decisions_and_averages_kl_over_the_batch_tokens():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = token_loss(logp, old, ref, adv, mask, clip_eps=0.2, beta=0.1, kl_tokens=6)
    r = np.exp([0.2, -1.0])
    surrogate0 = np.mean([-min(r[0], min(r[0], 1.2)), -min(r[1], max(r[1], 0.8))])
    surrogate1 = -min(1.0 * -2, 1.0 * -2)
    kl = (0.5 + 0.0 + 0.0) / 6  # max(0, logp - ref) summed over the 3 real tokens, over the batch's 6 tokens
    assert loss.item() == pytest.approx(surrogate0 + surrogate1 + 0.1 * kl, rel=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)
    loss.backward()
    assert logp.grad[0, 2] == 0
    assert logp.grad[1, 1] == 0  # padding gets no gradient
    # at ratio 1 the policy term's gradient is -A times the token mean of d log pi
    logp2 = old.clone().requires_grad_(True)
    token_loss(logp2, old, old, adv, mask, 0.2, 0.0)[0].backward()
    np.testing.assert_allclose(logp2.grad.numpy(), [[-0.5, -0.5, 0.0], [2.0, 0.0, 0.0]], atol=1e-6)


def test_token_loss_budget_divides_every_answer_by_one_constant():
    old = torch.tensor([[-1.2, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logp = old.clone().requires_grad_(True)
    token_loss(logp, old, None, torch.tensor([1.0, -2.0]), mask, 0.2, 0.0, answer_tokens=4)[0].backward()
    np.testing.assert_allclose(logp.grad.numpy(), [[-0.25, -0.25, 0.0], [0.5, 0.0, 0.0]], atol=1e-6)


def test_token_loss_is_blind_to_whatever_the_padded_positions_hold():
    """Padded positions hold whatever the pass computed there; NaN x 0 is NaN, so a mask that multiplies
    would end the run for a value no term uses. The loss and gradient equal those of clean padding."""
    old = torch.tensor([[-1.2, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    clean = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    dirty = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("inf"), float("-inf")]], requires_grad=True)
    expected, expected_stats = token_loss(clean, old, ref, adv, mask, 0.2, 0.1, kl_tokens=6)
    loss, stats = token_loss(dirty, old, ref, adv, mask, 0.2, 0.1, kl_tokens=6)
    assert loss.item() == expected.item()
    assert all(stats[k].item() == expected_stats[k].item() for k in stats)
    expected.backward()
    loss.backward()
    assert torch.equal(dirty.grad, clean.grad)


def test_an_overflowing_ratio_with_a_zero_advantage_adds_nothing():
    """The sampler's log-prob of a token 100 nats below the policy's: exp overflows float32 above 88.7,
    and inf x 0 is NaN. The log-ratio is held at LOG_RATIO_LIMIT, so the token adds 0 to the loss."""
    from sepo.training.objective import LOG_RATIO_LIMIT

    logp = torch.tensor([[-0.1, -0.2]], requires_grad=True)
    old = torch.tensor([[-100.1, -0.2]])
    loss, stats = token_loss(logp, old, None, torch.tensor([0.0]), torch.ones(1, 2), 0.2, 0.0)
    assert loss.item() == 0.0
    assert stats["clip_fraction"].item() == 0.5
    assert stats["kl_old"].item() == pytest.approx(
        (np.exp(LOG_RATIO_LIMIT) * LOG_RATIO_LIMIT - (np.exp(LOG_RATIO_LIMIT) - 1)) / 2, rel=1e-5
    )
    loss.backward()
    assert bool(torch.isfinite(logp.grad).all())


@pytest.mark.parametrize("length_norm", ["answer", "budget"])
def test_a_value_offset_moves_the_policy_only_under_the_token_mean(length_norm):
    """Two answers, a (2 tokens) and b (5 tokens), chosen at the first token with p = sigmoid(theta); both
    carry the same advantage c (the state's value offset, no action effect), so the exact expected update
    of theta is 0: sum_y pi(y) * c * dlog pi(y)/dtheta = c * (p(1-p) - (1-p)p). The budget keeps it 0;
    the token mean gives c * p(1-p) * (1/2 - 1/5), a drift toward the shorter answer when c > 0."""
    theta = torch.tensor(0.4, requires_grad=True)
    p, c = torch.sigmoid(theta), 1.5
    logp = torch.zeros(2, 5)
    logp[0, 0], logp[1, 0] = torch.log(p), torch.log(1 - p)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    weights = torch.stack([p, 1 - p]).detach() * c  # the expectation over answers, enumerated
    budget = 5.0 if length_norm == "budget" else None
    loss, _ = token_loss(logp, logp.detach(), None, weights, mask, 0.2, 0.0, answer_tokens=budget)
    loss.backward()
    q = float(p)
    drift = 0.0 if length_norm == "budget" else c * q * (1 - q) * (1 / 2 - 1 / 5)
    assert -theta.grad.item() == pytest.approx(drift, abs=1e-7)
