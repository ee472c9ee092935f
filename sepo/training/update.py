"""One SEPO update on a rollout batch (docs/spec.md §4.3): the loss's backward micro-batch by micro-batch,
the KL checks, and TRPO's line search that keeps a step within `sepo.trust_region_kl`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from sepo import distributed
from sepo.errors import Diverged
from sepo.policies.lm import LMPolicy
from sepo.profiling import section
from sepo.training.divergence import first_non_finite, non_finite_inputs
from sepo.training.objective import (
    LOG_RATIO_LIMIT,
    masked,
    old_policy_kl,
    token_loss,
)
from sepo.training.passes import generated_tokens, pad_rows, pass_layout, policy_logprobs, scored_passes, shared_root
from sepo.training.rollouts import RolloutBatch


# ------------------------------------------------------------------------------ the update
def accumulate_gradients(
    model: Any,
    policy: LMPolicy,
    batch: RolloutBatch,
    ref: list[torch.Tensor] | None,
    s: DictConfig,
    before: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """Backward of the batch loss (docs/spec.md §4.3) into `.grad`, micro-batch by micro-batch.

    The policy term is a sum over decisions, so micro-batches simply add up; the KL term is a mean
    over all the batch's tokens, so each micro-batch divides by the batch's token count. `before`, when
    given, receives every decision's token log-probs as this pass scored them (the trust region's anchor).
    """
    model.train()
    tokens = generated_tokens(batch)
    per_answer = answer_divisor(s)
    sums = dict.fromkeys(
        ("loss", "policy_loss", "kl_old", "clip_fraction", *(("kl_ref",) if ref is not None else ())), 0.0
    )
    anomaly = s.debug_detect_anomaly
    with section("update_forward"), torch.autograd.set_detect_anomaly(anomaly):
        root = shared_root(model, policy, batch.decisions)
    passes, diagnosis = pass_layout(policy, batch.decisions, s, root=root), ""
    for k, part in enumerate(passes):
        decisions = [batch.decisions[i] for i in part]
        # anomaly mode in the forward too: its traceback names the layer
        with section("update_forward"), torch.autograd.set_detect_anomaly(anomaly):
            lp, mask = policy_logprobs(model, policy, decisions, s, root)
        if before is not None:
            keep_scored(before, part, lp, mask, len(batch.decisions))
        width = lp.shape[1]
        old, reference, adv = pass_inputs(batch, part, ref, lp)
        loss, stats = token_loss(
            lp, old, reference, adv, mask, s.clip_eps, s.beta, kl_tokens=tokens, answer_tokens=per_answer
        )
        value = loss.item()
        sums["loss"] += value
        if not math.isfinite(value):  # no backward: the step is lost; say what in this pass made it so
            diagnosis = f"the loss of pass {k + 1} of {len(passes)} ({len(part)} decisions) is {value}: "
            diagnosis += non_finite_inputs(lp, old, reference, adv, mask)
            break
        with section("backward"), torch.autograd.set_detect_anomaly(anomaly):
            loss.backward()
        bad = first_non_finite_gradient(model)
        if bad is not None:  # name the first pass that made it so, with what its inputs held
            diagnosis = f"pass {k + 1} of {len(passes)} ({len(part)} decisions, {width} positions) made the gradient of {bad} non-finite, its loss {value:.4g}: "
            diagnosis += non_finite_inputs(lp, old, reference, adv, mask)
            break
        add_pass_stats(sums, stats, float(mask.sum()) / max(tokens, 1))
    if root is not None and not diagnosis:
        diagnosis = root_backward(model, root, anomaly)
    del root
    model.eval()
    # each process held a share of the sums; every process reaches this sum, so a NaN reaches them all
    summed = dict(zip(sums, distributed.sum_floats(*sums.values())))
    if diagnosis:
        raise Diverged(diagnosis)
    return summed


def pass_inputs(
    batch: RolloutBatch, part: list[int], ref: list[torch.Tensor] | None, lp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """A pass's behaviour and reference log-probs, padded to its width, and its decisions' advantages."""
    width = lp.shape[1]
    old = pad_rows([batch.decisions[i].tokens.logprobs.float() for i in part], width).to(lp)
    reference = pad_rows([ref[i] for i in part], width).to(lp) if ref is not None else None
    adv = torch.tensor([float(batch.advantages[i]) for i in part], dtype=lp.dtype, device=lp.device)
    return old, reference, adv


def keep_scored(before: list, part: list[int], lp: torch.Tensor, mask: torch.Tensor, decisions: int) -> None:
    """Record each decision's token log-probs as this pass scored them, in `before` (the trust region's anchor)."""
    before.extend([None] * (decisions - len(before)))
    for i, row, m in zip(part, lp.detach(), mask):
        before[i] = row[m.bool()]


def add_pass_stats(sums: dict[str, float], stats: dict[str, Any], share: float) -> None:
    """Add one pass's statistics: the policy loss is a sum over decisions; the token means (KL, clip fraction)
    are weighted by the pass's `share` of the batch's tokens."""
    sums["policy_loss"] += float(stats["policy_loss"])
    for key in ("kl_ref", "kl_old", "clip_fraction"):
        if key in stats:
            sums[key] += float(stats[key]) * share


def root_backward(model: Any, root: Any, anomaly: bool) -> str:
    """The passes' shares of the shared root's gradient, through its pass once; what made the gradient
    non-finite, or ""."""
    with section("backward"), torch.autograd.set_detect_anomaly(anomaly):
        root.backward()
    bad = first_non_finite_gradient(model)
    return (
        ""
        if bad is None
        else f"the backward through the shared root ({root.length} tokens) made the gradient of {bad} non-finite"
    )


def held_term_backward(model: Any, policy: LMPolicy, part: RolloutBatch, s: DictConfig) -> None:
    """The gradient of a held term's part of the batch (`sepo.training.held_terms`): its policy loss alone,
    no KL, summed over processes."""
    accumulate_gradients(model, policy, part, None, s)
    distributed.sum_gradients([p for p in model.parameters() if p.requires_grad])


def first_non_finite_gradient(model: Any) -> str | None:
    """The first trainable parameter whose gradient holds a NaN or an infinity, checked with one device sync."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.requires_grad and p.grad is not None]
    if not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all()):
        return None
    return first_non_finite(named)


def answer_divisor(s: DictConfig) -> float | None:
    """What each answer's summed token terms are divided by (`sepo.length_norm`): its own length (None) or the budget."""
    return float(s.max_new_tokens) if s.length_norm == "budget" else None


def old_policy_divergence(model: Any, policy: LMPolicy, batch: RolloutBatch, s: DictConfig) -> float:
    """KL(pi_theta || pi_old) over the batch's tokens with the parameters as they are now (no gradient)."""
    total, tokens = 0.0, 0
    with torch.no_grad(), section("kl_after_update"):
        for part, lp, mask in scored_passes(model, policy, batch.decisions, s):
            old = pad_rows([batch.decisions[i].tokens.logprobs.float() for i in part], lp.shape[1]).to(lp)
            total += float(masked(old_policy_kl(lp, old), mask.bool()).sum())
            tokens += int(mask.sum())
    total, tokens = distributed.sum_floats(total, tokens)
    return total / max(tokens, 1)


# ------------------------------------------------------------------------------ the trust region
def policy_change(
    model: Any,
    policy: LMPolicy,
    batch: RolloutBatch,
    s: DictConfig,
    before: list[torch.Tensor],
    advantages: np.ndarray,
    kl_limit: float = math.inf,
) -> tuple[float, float]:
    """(KL(pi_theta || pi_before) per decision, the surrogate's gain) on the batch, the parameters as they are now
    against the log-probs the update scored before its step (`before`, in the update's own passes, so that no
    step reads exactly 0 and no rounding of another pass layout reads as a step).

    The KL is between answer distributions, summed over an answer's tokens (the chain rule) and averaged over
    decisions, TRPO's mean KL over states: a mean over tokens would dilute the one token that says the action
    in the templated reasoning around it. The gain is the importance-weighted estimate of what the step adds
    to the objective whose advantages A are `advantages` (J's, `batch.advantages`, or a recovery step's lowered
    terms'): sum_d A_d * mean_t (ratio_t - 1), as the loss weighs each decision's tokens (`sepo.length_norm`).

    `kl_limit`, the KL per decision past which the caller rejects the step whatever its gain: the passes stop as
    soon as the KL summed so far, over the whole batch's decisions, is past it. Every token's KL term is
    non-negative, so the decisions not yet scored could only add to it: the verdict is the whole batch's, and
    a step the line search halves costs a fraction of a pass (a full pass is a third of a SmolLM2 IPD step's
    line search, docs/speed.md)."""
    divisor = answer_divisor(s)
    decisions = max(distributed.sum_floats(len(batch.decisions))[0], 1)
    kl, gain = 0.0, 0.0
    with torch.no_grad(), section("trust_region"):
        for part, lp, mask in scored_passes(model, policy, batch.decisions, s, like_update=True):
            real = mask.bool()
            old = pad_rows([before[i] for i in part], lp.shape[1]).to(lp)
            kl += float(masked(old_policy_kl(lp, old), real).sum())
            ratio = torch.exp(torch.clamp(lp - old, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
            per_answer = masked(ratio - 1.0, real).sum(dim=1) / (
                real.sum(dim=1).clamp(min=1) if divisor is None else divisor
            )
            adv = torch.tensor([float(advantages[i]) for i in part], dtype=per_answer.dtype)
            gain += float((adv * per_answer.cpu()).sum())
            if kl / decisions > kl_limit:  # this process's share alone is past the limit: so is the batch's
                break
    kl, gain = distributed.sum_floats(kl, gain)
    return kl / decisions, gain


@dataclass
class StepStart:
    """The trainable parameters and the optimizer's state before a step, to shrink the step or undo it."""

    params: list[torch.Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def of(cls, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> StepStart:
        return cls([p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()))


def trust_region(
    model: Any,
    policy: LMPolicy,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    batch: RolloutBatch,
    s: DictConfig,
    start: StepStart,
    before: list[torch.Tensor],
    advantages: np.ndarray,
) -> dict[str, float]:
    """TRPO's line search on the optimizer's step: keep the largest of 1, 1/2, 1/4, ... of it
    (`sepo.line_search_steps` halvings) whose KL(pi_new || pi_old) per decision on the batch is within
    `sepo.trust_region_kl` and whose surrogate gain under `advantages` (J's, or a recovery step's terms')
    is not negative; if none is, undo the step (its
    parameters and the optimizer's moments). With a fresh batch every step the PPO clip never acts (every
    ratio is 1 when the gradient is taken), so without this nothing but the learning rate bounds how far
    one noisy batch moves the policy."""
    full = [p.detach().clone() for p in params]
    fraction = 1.0
    for _ in range(s.line_search_steps + 1):
        kl, gain = policy_change(model, policy, batch, s, before, advantages, kl_limit=s.trust_region_kl)
        if kl <= s.trust_region_kl and gain >= 0.0:
            moved = math.sqrt(sum(float((p.detach() - p0).pow(2).sum()) for p, p0 in zip(params, start.params)))
            return {"step_fraction": fraction, "kl_step": kl, "surrogate_gain": gain, "step_norm": moved}
        fraction /= 2
        with torch.no_grad():
            for p, p0, p1 in zip(params, start.params, full):
                p.copy_(p0 + fraction * (p1 - p0))
    with torch.no_grad():
        for p, p0 in zip(params, start.params):
            p.copy_(p0)
    optimizer.load_state_dict(start.optimizer)
    return {"step_fraction": 0.0, "kl_step": 0.0, "surrogate_gain": 0.0, "step_norm": 0.0}
