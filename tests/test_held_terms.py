"""Held penalty terms (`sepo.held_terms`): the step is the nearest one that raises none of them to first order, and
(`sepo.held_at_start`) a batch that reads one above its starting level takes the recovery step that lowers it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

from sepo.builders import load_model_and_tokenizer
from sepo.games import make_game
from sepo.policies.lm import LMPolicy
from sepo.policies.recording import RecordingPolicy
from sepo.stages.sepo_loop import attach_lora, update
from sepo.training.held_terms import (
    HeldState,
    hold_step,
    project_onto_cone,
    recovery_advantages,
    recovery_step,
    term_gradients,
)
from sepo.training.objective import EstimatorState, sepo_settings
from sepo.training.passes import reference_logprobs
from sepo.training.rollouts import BatchBuilder
from sepo.training.update import held_term_backward

from .conftest import SMALL


def _dot(a, b):
    return sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("terms", [1, 2, 3])
def test_the_projection_is_the_nearest_step_that_raises_no_held_term(seed, terms):
    """Against scipy's non-negative least squares on the explicit vectors: P(d) = d − Hᵀw*, w* = argmin_{w ≥ 0}
    |Hᵀw − d| (Moreau: the cone {d : Hd ≤ 0} is the polar of the rows' cone); the step is split over two tensors."""
    rng = np.random.default_rng(seed)
    d, H = rng.normal(size=7), rng.normal(size=(terms, 7))
    if seed % 3 == 0:
        H[0] = -d + 0.1 * rng.normal(size=7)  # a step that already lowers the first term
    w, _ = nnls(H.T, d)
    expected = d - H.T @ w
    start = [torch.zeros(3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)]
    params = [torch.tensor(d[:3]), torch.tensor(d[3:])]
    gradients = {k: [torch.tensor(H[i, :3]), torch.tensor(H[i, 3:])] for i, k in enumerate("ecx"[:terms])}
    stats = project_onto_cone(params, start, gradients)
    got = torch.cat(params).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-9)
    assert np.all(H @ got <= 1e-9)
    for i, k in enumerate("ecx"[:terms]):
        cosine = H[i] @ d / np.linalg.norm(H[i]) / np.linalg.norm(d)
        assert stats[f"held/{k}/cosine"] == pytest.approx(cosine)
    assert stats["held/step_kept"] == pytest.approx(np.linalg.norm(expected) / np.linalg.norm(d))


def test_a_step_that_raises_no_held_term_is_kept_exactly():
    d, h = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([-1.0, 0.0, 0.5])
    params = [d.clone()]
    stats = project_onto_cone(params, [torch.zeros(3)], {"c": [h]})
    assert torch.equal(params[0], d) and stats["held/c/removed"] == 0.0 and stats["held/step_kept"] == 1.0


def test_one_raised_term_loses_exactly_its_component():
    d, h = torch.tensor([3.0, 1.0]), torch.tensor([1.0, 0.0])
    params = [d.clone()]
    project_onto_cone(params, [torch.zeros(2)], {"c": [h]})
    assert torch.equal(params[0], torch.tensor([0.0, 1.0]))


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_cache")


def test_a_held_step_does_not_raise_collusion_on_its_batch(compose_cfg, tiny_cache):
    """On an IPD batch whose free SGD step raises the collusion term to first order (h_c · Δθ > 0, h_c its
    gradient on the batch: the collusive pool's decisions against AlwaysC, the only ones that carry c's
    advantage), the held step from the same start does not (h_c · Δθ ≤ 0), and differs from the free step
    by a multiple of h_c alone."""
    cfg = compose_cfg(
        *SMALL,
        f"paths.cache_dir={tiny_cache}",
        "game.pools.collusive=[AlwaysC]",
        "sepo.optimizer=sgd",
        "sepo.momentum=0.0",
        "sepo.lr=0.5",
        "sepo.beta=0.0",
        "sepo.grad_clip=1e9",
        "sepo.trust_region_kl=0",
        "lambdas.train.c=0.01",  # the other terms then set the free step's direction, which raises c about half the time
    )
    s = sepo_settings(cfg)
    torch.manual_seed(0)
    base, tok = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    model = attach_lora(base, cfg.model.lora.target_modules, s.lora.r, s.lora.alpha, 0.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
    policy = LMPolicy(model, tok, cfg.model, temperature=float(s.temperature), max_new_tokens=4, seed=0)
    game = make_game(cfg.game)
    params = [p for p in model.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    backward = lambda sub: held_term_backward(model, policy, sub, s)  # noqa: E731

    raised = None
    for seed in range(16):  # a batch whose free step raises c (the descent step -g does when h_c · g < 0)
        batch = BatchBuilder(cfg, s).collect(game, RecordingPolicy(policy), seed, EstimatorState())
        h_c = term_gradients(params, ["c"], batch, backward)["c"]
        g = term_gradients(params, ["total"], batch, backward)["total"]
        if _dot(h_c, g) < 0:
            raised = batch
            break
    assert raised is not None, "no batch of 16 whose free step raises collusion"
    pools = [g.pool for g in raised.groups for record in g.records for _ in record.trace]  # the decisions' order
    assert {pools[i] for i in np.flatnonzero(raised.unscaled["c"])} == {"collusive"}
    ref = reference_logprobs(model, policy, raised, s)

    def step(held):
        with torch.no_grad():
            for p, p0 in zip(params, start):
                p.copy_(p0)
        s.held_terms = held
        stats = update(model, policy, torch.optim.SGD(params, lr=float(s.lr)), raised, ref, s, step=0)
        return [p.detach() - p0 for p, p0 in zip(params, start)], stats

    free, _ = step([])
    held, stats = step(["c"])
    scale = np.sqrt(_dot(h_c, h_c) * _dot(free, free))
    assert _dot(h_c, free) > 0
    assert abs(_dot(h_c, held)) <= 1e-5 * scale  # the raised component is gone, and only it
    assert stats["held/c/removed"] == 1.0 and stats["held/c/cosine"] == pytest.approx(_dot(h_c, free) / scale, rel=1e-3)
    removed = [f - k for f, k in zip(free, held)]
    w = _dot(removed, h_c) / _dot(h_c, h_c)
    residual = np.sqrt(_dot([r - w * h for r, h in zip(removed, h_c)], [r - w * h for r, h in zip(removed, h_c)]))
    assert residual <= 1e-4 * np.sqrt(_dot(removed, removed))

    # held at a level below the batch's: the recovery step, the free step's length along -h_c
    s.held_at_start = ["c"]
    with torch.no_grad():
        for p, p0 in zip(params, start):
            p.copy_(p0)
    state = HeldState(keep=0.0, budgets={"c": raised.stats["collusive/c"] - 0.01})
    stats = update(model, policy, torch.optim.SGD(params, lr=float(s.lr)), raised, ref, s, step=0, held_state=state)
    recovered = [p.detach() - p0 for p, p0 in zip(params, start)]
    assert stats["held/recovery"] == 1.0 and stats["held/c/level"] == raised.stats["collusive/c"]
    assert _dot(recovered, recovered) == pytest.approx(_dot(free, free), rel=1e-4)
    assert _dot(h_c, recovered) == pytest.approx(-np.sqrt(_dot(h_c, h_c) * _dot(free, free)), rel=1e-4)
    s.held_at_start = []


def test_the_running_gradient_is_the_weighted_mean_and_survives_a_checkpoint():
    """h̄ ← keep·h̄ + (1 − keep)·h from the first batch's h; the agreement is this batch's cosine with the mean before
    it; the state round-trips (a resumed run continues the same mean)."""
    h1, h2, h3 = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, -1.0])
    averages = HeldState(keep=0.75)
    mean, stats = averages.update({"c": [h1]})
    assert torch.equal(mean["c"][0], h1) and math.isnan(stats["held/c/agreement"])
    mean, stats = averages.update({"c": [h2]})
    assert torch.allclose(mean["c"][0], torch.tensor([1.0, 0.25]))
    assert stats["held/c/agreement"] == pytest.approx(1 / math.sqrt(2))
    averages.above_budget({"collusive/c": 0.25}, {"c": [h2]}, ["c"])
    resumed = HeldState(keep=0.75)
    resumed.load_state_dict(averages.state_dict())
    assert resumed.budgets == {"c": 0.25}
    for run in (averages, resumed):
        mean, stats = run.update({"c": [h3]})
        assert torch.allclose(mean["c"][0], torch.tensor([0.75, -0.0625]))
        assert stats["held/c/agreement"] == pytest.approx(-0.25 / math.sqrt(1.0625))


def test_a_fresh_batch_alone_is_held_when_nothing_is_kept():
    averages = HeldState(keep=0.0)
    averages.update({"c": [torch.tensor([1.0, 0.0])]})
    mean, _ = averages.update({"c": [torch.tensor([0.0, 2.0])]})
    assert torch.equal(mean["c"][0], torch.tensor([0.0, 2.0]))


def test_the_first_batch_sets_the_level_and_a_batch_above_it_recovers():
    state, h = HeldState(keep=0.0), {"c": [torch.tensor([1.0, 0.0])], "e": [torch.tensor([0.0, 1.0])]}
    above, stats = state.above_budget({"collusive/c": 0.2, "exploit/e": 1.0}, h, ["c", "e"])
    assert above == [] and state.budgets == {"c": 0.2, "e": 1.0} and stats["held/recovery"] == 0.0
    above, stats = state.above_budget({"collusive/c": 0.3, "exploit/e": 1.0}, h, ["c", "e"])
    assert above == ["c"] and stats["held/c/level"] == 0.3 and stats["held/c/budget"] == 0.2
    assert stats["held/recovery"] == 1.0
    above, _ = state.above_budget({"collusive/c": 0.3, "exploit/e": 1.5}, {"c": [torch.zeros(2)], "e": h["e"]}, ["c"])
    assert above == []  # a term with no gradient on the batch cannot be lowered; e is held to first order only


def test_a_rise_within_the_two_reads_noise_is_no_recovery():
    """At `held_level_z` 2 a read counts as above the first batch's level only past 2 SE of the difference of the
    two reads, sqrt(0.03² + 0.04²) = 0.05 here; at 0 any rise does; a resumed run keeps the first read's SE."""
    h = {"c": [torch.tensor([1.0, 0.0])]}
    state = HeldState(keep=0.0, z=2.0)
    state.above_budget({"collusive/c": 0.30, "collusive/c_se": 0.03}, h, ["c"])
    above, stats = state.above_budget({"collusive/c": 0.39, "collusive/c_se": 0.04}, h, ["c"])
    assert above == [] and stats["held/c/margin"] == pytest.approx(0.10) and stats["held/recovery"] == 0.0
    resumed = HeldState(keep=0.0, z=2.0)
    resumed.load_state_dict(state.state_dict())
    for run in (state, resumed):
        above, _ = run.above_budget({"collusive/c": 0.41, "collusive/c_se": 0.04}, h, ["c"])
        assert above == ["c"]
    at_zero = HeldState(keep=0.0)
    at_zero.above_budget({"collusive/c": 0.30, "collusive/c_se": 0.03}, h, ["c"])
    assert at_zero.above_budget({"collusive/c": 0.31, "collusive/c_se": 0.04}, h, ["c"])[0] == ["c"]


@pytest.mark.parametrize("seed", range(6))
def test_the_recovery_step_keeps_the_length_and_lowers_every_term_above_its_level(seed):
    """One term: exactly its steepest descent at the step's length; two: −(u1 + u2) lowers both (u·(u1 + u2) =
    1 + u1·u2 > 0 unless they are opposite)."""
    rng = np.random.default_rng(seed)
    d, H = rng.normal(size=5), rng.normal(size=(2, 5))
    gradients = {k: [torch.tensor(H[i, :2]), torch.tensor(H[i, 2:])] for i, k in enumerate("ce")}
    for terms in (["c"], ["c", "e"]):
        params = [torch.tensor(d[:2]), torch.tensor(d[2:])]
        recovery_step(
            params, [torch.zeros(2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)], gradients, terms
        )
        got = torch.cat(params).numpy()
        assert np.linalg.norm(got) == pytest.approx(np.linalg.norm(d))
        assert all(H["ce".index(k)] @ got < 0 for k in terms)
    params = [torch.tensor(d)]
    recovery_step(params, [torch.zeros(5, dtype=torch.float64)], {"c": [torch.tensor(H[0])]}, ["c"])
    np.testing.assert_allclose(params[0].numpy(), -np.linalg.norm(d) * H[0] / np.linalg.norm(H[0]), atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_a_recovery_raises_no_other_held_term(seed):
    """Collusion above its level, exploit held: the step lowers c and, to first order, does not raise e; with
    nothing above its level the step is the plain projection."""
    rng = np.random.default_rng(seed)
    d, H = rng.normal(size=5), rng.normal(size=(2, 5))
    gradients = {k: [torch.tensor(H[i])] for i, k in enumerate("ce")}
    params = [torch.tensor(d)]
    hold_step(params, [torch.zeros(5, dtype=torch.float64)], gradients, ["c"])
    got = params[0].numpy()
    assert H[0] @ got < 0 and H[1] @ got <= 1e-9
    projected, plain = [torch.tensor(d)], [torch.tensor(d)]
    hold_step(projected, [torch.zeros(5, dtype=torch.float64)], gradients, [])
    project_onto_cone(plain, [torch.zeros(5, dtype=torch.float64)], gradients)
    assert torch.equal(projected[0], plain[0])


def test_a_recovery_step_is_judged_by_the_terms_it_lowers():
    batch = type("Batch", (), {"unscaled": {"c": np.array([0.0, 2.0]), "e": np.array([1.0, 0.0])}, "scale": 2.0})()
    np.testing.assert_allclose(recovery_advantages(batch, ["c"]), [0.0, 1.0])
    np.testing.assert_allclose(recovery_advantages(batch, ["c", "e"]), [0.5, 1.0])
