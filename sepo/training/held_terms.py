"""A step that does not raise the penalty terms it is told to hold (`sepo.held_terms`).

On a pretrained model one LoRA step moves every situation of a game together: on SmolLM2's IPD the
step that teaches the model to defect after a defection also teaches it to defect after a cooperation
(docs/results.md, "Why the steps defect alike"), so the collusion term rises while J climbs, and a
larger λc only tilts the direction the coupled step takes (λc 3 and 8 still raised it). Holding a term
removes the offending component of the step instead, as Constrained Policy Optimization does for a
cost linearised at the current policy (Achiam et al., 2017):

- each held term k's own loss gradient h_k is taken on the batch: the decisions that carry k's
  advantage, with that advantage alone (`term_batch`), so h_k = λk ∇k up to the batch scale;
- the step the optimizer took, d = θ_new − θ_old, changes term k by about h_k · d / λk, so it raises
  k to first order exactly when h_k · d > 0;
- d is replaced by its Euclidean projection onto the cone {d : h_k · d ≤ 0 for every held k}
  (`project_onto_cone`): the nearest step that raises none of them. With one held term it is d minus its
  component along h_k when that component raises k, else d itself.

The constraint holds for the estimate of h_k; how far it holds for the policy is what a run's test
episodes measure. One batch's estimate rests on the few decisions that carry k's advantage, so
`sepo.held_average` can replace it by a running mean over steps, h̄ ← a·h̄ + (1 − a)·h_k
(`HeldState`). The cone is the same for any positive multiple of h̄, so the mean needs no bias
correction. Each step logs `held/<k>/agreement`, the cosine of this batch's h_k with the mean before it:
near 0, the batch estimates point in unrelated directions.

A first-order hold has no feedback: whatever raises the term anyway (an estimate of h_k off the true
gradient, or the term's curvature over a step) accumulates. `sepo.held_at_start` closes the loop as
Constrained Policy Optimization does with its cost limit. Each held term it names is held at its level on
the first batch, the policy training starts from (`HeldState.budgets`), and a batch that reads a term above
that level takes CPO's recovery step instead of the projected one: the optimizer's step length along the
held terms' descent, −Σ h_k/|h_k| over the terms above their level (`recovery_step`), projected onto the
cone of the other held terms so that it raises none of them to first order. The trust region then checks
the step's surrogate gain on the lowered terms' advantages (`recovery_advantages`), not J's. The level and
each batch's read of it are both one batch's estimate, so `sepo.held_level_z` counts a read as above the level
only past that many standard errors of their difference: at 0, a term that has not moved sends about every
other step to the recovery (on SmolLM2's IPD, 17 of 30 steps over three seeds, docs/results.md).

On a model that plays a game's situations as one, lowering collusion alone teaches cooperation everywhere
and hands the exploit pool what the last steps took from it; holding `e` to first order as well
(`held_terms=[c, e]`, `held_at_start=[c]`) keeps the recovery to what lowers collusion without that.
Holding `e` at its level too would make most steps recoveries: a batch's exploit reading is noisier than
the steps' progress.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sepo.training.rollouts import RolloutBatch, term_level_se_stat, term_level_stat

#: a held term counts as raised when h_k · d exceeds this share of the largest |h_j · d|: floating-point
#: slack, so the projection's own rounding never reads as a rise
ROUNDING_SLACK = 1e-9


def term_batch(batch: RolloutBatch, term: str) -> RolloutBatch:
    """The batch's decisions that carry `term`'s advantage, each with that advantage alone (the batch scale
    included): its loss gradient is the term's own. Empty when the term gives this batch (or this process's
    share of it) no signal."""
    values = batch.unscaled.get(term)
    keep = np.flatnonzero(values != 0.0) if values is not None else np.array([], dtype=int)
    return RolloutBatch(
        groups=[],
        decisions=[batch.decisions[i] for i in keep],
        advantages=values[keep] / batch.scale if values is not None else np.zeros(0),
        unscaled={},
        scale=batch.scale,
        stats={},
    )


def term_gradients(
    params: Sequence[torch.Tensor],
    terms: Sequence[str],
    batch: RolloutBatch,
    backward: Callable[[RolloutBatch], None],
) -> dict[str, list[torch.Tensor]]:
    """Each held term's loss gradient on `batch`: `backward(sub_batch)` accumulates a sub-batch's gradient into
    `.grad` (summed over processes), read and cleared here."""
    gradients = {}
    for term in terms:
        for p in params:
            p.grad = None
        backward(term_batch(batch, term))
        gradients[term] = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    for p in params:
        p.grad = None
    return gradients


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return float(sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b)))


def _norm(a: Sequence[torch.Tensor]) -> float:
    return math.sqrt(max(_dot(a, a), 0.0))


def _cosine(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    norms = _dot(a, a) * _dot(b, b)
    return _dot(a, b) / math.sqrt(norms) if norms > 0 else math.nan


@dataclass
class HeldState:
    """Each held term's running gradient over steps, h̄ ← keep·h̄ + (1 − keep)·h (`sepo.held_average`), and
    the level it is held at (`sepo.held_at_start`); a checkpoint saves both, so a resumed run continues the
    same mean and keeps the same levels."""

    keep: float
    means: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    budgets: dict[str, float] = field(default_factory=dict)
    z: float = 0.0  # `sepo.held_level_z`: standard errors a read must rise by before it counts as above its level
    budget_ses: dict[str, float] = field(default_factory=dict)  # the first batch's SE of each level it set

    def update(
        self, gradients: dict[str, list[torch.Tensor]]
    ) -> tuple[dict[str, list[torch.Tensor]], dict[str, float]]:
        """The new means (this batch's h alone when no mean exists yet), and `held/<k>/agreement`: the cosine
        of this batch's h with the mean before it (NaN on the first step)."""
        stats = {}
        for term, h in gradients.items():
            previous = [m.to(x.device) for m, x in zip(self.means[term], h)] if term in self.means else None
            stats[f"held/{term}/agreement"] = _cosine(h, previous) if previous is not None else math.nan
            self.means[term] = (
                [self.keep * m + (1.0 - self.keep) * x for m, x in zip(previous, h)] if previous is not None else h
            )
        return dict(self.means), stats

    def above_budget(
        self, levels: dict[str, float], gradients: dict[str, list[torch.Tensor]], terms: Sequence[str]
    ) -> tuple[list[str], dict[str, float]]:
        """Of `terms` (`sepo.held_at_start`), those whose level on this batch (`levels`: the batch's statistics)
        is above the level they are held at, which the first batch sets, by more than `z` standard errors of
        the difference of the two reads, and that this batch can lower (a term whose decisions all agree has no
        gradient); and `held/<k>/level`, `held/<k>/budget`, `held/<k>/margin` (the rise that counts) for the log.

        Both reads are one batch's, so at z = 0 a term that has not moved reads above its level on about every
        other batch, and each such batch spends its step on the recovery alone. A level the estimator reads
        exactly (Kuhn's exact values) has no SE statistic and counts as exact."""
        above, stats = [], {}
        for term in terms:
            h = gradients[term]
            level = float(levels[term_level_stat(term)])
            se = float(levels.get(term_level_se_stat(term), 0.0))
            budget = self.budgets.setdefault(term, level)
            budget_se = self.budget_ses.setdefault(term, se)
            margin = self.z * math.hypot(se, budget_se)
            stats[f"held/{term}/level"], stats[f"held/{term}/budget"] = level, budget
            stats[f"held/{term}/margin"] = margin
            if level > budget + margin and _dot(h, h) > 0:
                above.append(term)
        stats["held/recovery"] = float(bool(above))
        return above, stats

    def state_dict(self) -> dict[str, Any]:
        return {
            "means": {term: [m.cpu() for m in means] for term, means in self.means.items()},
            "budgets": dict(self.budgets),
            "budget_ses": dict(self.budget_ses),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.means = {term: list(means) for term, means in state["means"].items()}
        self.budgets = dict(state["budgets"])
        self.budget_ses = dict(state.get("budget_ses", {}))  # none in a checkpoint written without `held_level_z`


def cone_weights(gram: np.ndarray, rises: np.ndarray) -> np.ndarray:
    """The multipliers w ≥ 0 of the projection d − Σ_k w_k h_k of a step d onto {d : h_k · d ≤ 0 for all k}.

    `gram[j, k]` = h_j · h_k and `rises[k]` = h_k · d. The multipliers solve the small non-negative least
    squares min_{w ≥ 0} |Σ w_k h_k − d|², whose optimum is the active set S with gram[S, S] w_S = rises[S],
    w_S ≥ 0 and no term outside S still raised (rises − gram w ≤ 0). Three terms make eight sets: every
    one is tried, smallest first, which is exact."""
    k = len(rises)
    slack = ROUNDING_SLACK * float(np.max(np.abs(rises))) if k else 0.0
    for size in range(k + 1):
        for active in map(list, itertools.combinations(range(k), size)):
            w = np.zeros(k)
            if active:
                sub = gram[np.ix_(active, active)]
                if np.linalg.matrix_rank(sub) < size:
                    continue
                w[active] = np.linalg.solve(sub, rises[active])
            if np.all(w >= 0) and np.all(rises - gram @ w <= slack):
                return w
    return np.zeros(k)


def project_onto_cone(
    params: Sequence[torch.Tensor], start: Sequence[torch.Tensor], gradients: dict[str, list[torch.Tensor]]
) -> dict[str, float]:
    """Replace the step just taken (`params` − `start`) by its projection onto the held terms' cone, in place;
    return per term the cosine of the step with its rising direction before, and whether it was removed."""
    terms = list(gradients)
    step = [p.detach() - p0 for p, p0 in zip(params, start)]
    hs = [gradients[t] for t in terms]
    gram = np.array([[_dot(a, b) for b in hs] for a in hs])
    rises = np.array([_dot(h, step) for h in hs])
    norm = _norm(step)
    weights = cone_weights(gram, rises)
    stats = {}
    for t, r, g, w in zip(terms, rises, np.diag(gram), weights):
        stats[f"held/{t}/cosine"] = float(r / math.sqrt(g * norm * norm)) if g > 0 and norm > 0 else 0.0
        stats[f"held/{t}/removed"] = float(w > 0)
    if np.any(weights > 0):
        with torch.no_grad():
            for i, (p, p0) in enumerate(zip(params, start)):
                p.copy_(p0 + step[i] - sum(float(w) * h[i] for w, h in zip(weights, hs)))
        after = [p.detach() - p0 for p, p0 in zip(params, start)]
        stats["held/step_kept"] = _norm(after) / norm if norm > 0 else 1.0
    else:
        stats["held/step_kept"] = 1.0
    return stats


def recovery_step(
    params: Sequence[torch.Tensor],
    start: Sequence[torch.Tensor],
    gradients: dict[str, list[torch.Tensor]],
    terms: Sequence[str],
) -> dict[str, float]:
    """Replace the step just taken by CPO's recovery step, in place: its length along −Σ_k h_k/|h_k| over
    `terms` (the held terms above their level), the direction that lowers each of them to first order as
    fast as any other (for one term, exactly its steepest descent)."""
    step = [p.detach() - p0 for p, p0 in zip(params, start)]
    norm = _norm(step)
    units = [[x / _norm(gradients[t]) for x in gradients[t]] for t in terms]
    assert units, "a recovery step needs a held term with a gradient on the batch"
    descent = [-sum(u[i] for u in units) for i in range(len(step))]
    length = _norm(descent)
    with torch.no_grad():
        for p, p0, d in zip(params, start, descent):
            p.copy_(p0 + (norm / length) * d if length > 0 else p0)
    cosines = {f"held/{t}/cosine": _cosine(gradients[t], step) if norm > 0 else 0.0 for t in terms}
    return {**cosines, "held/step_kept": 1.0}


def hold_step(
    params: Sequence[torch.Tensor],
    start: Sequence[torch.Tensor],
    gradients: dict[str, list[torch.Tensor]],
    above: Sequence[str],
) -> dict[str, float]:
    """The held step, in place: the recovery step when a held term reads above its level (`above`), projected
    onto the other held terms' cone; else the optimizer's step projected onto every held term's cone."""
    if not above:
        return project_onto_cone(params, start, gradients)
    stats = recovery_step(params, start, gradients, above)
    others = {k: h for k, h in gradients.items() if k not in above}
    return {**stats, **(project_onto_cone(params, start, others) if others else {})}


def recovery_advantages(batch: RolloutBatch, terms: Sequence[str]) -> np.ndarray:
    """What a recovery step's surrogate gain is measured with: the advantages of the terms it lowers, under
    the batch's one scale (a rise in a term's reward is a fall in the term)."""
    return sum(batch.unscaled[t] for t in terms) / batch.scale
