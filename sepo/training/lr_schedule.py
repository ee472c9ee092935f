"""The SEPO learning rate as a pure function of the optimizer step.

A constant step size leaves a stochastic-gradient method circling its optimum at a distance set by
the step size and the gradient noise: on the tiny model the policy reaches its best safety early and
then random-walks away from it (README, Kuhn and IPD runs). Decaying the step size toward the end of
the run (Robbins-Monro) lets the noise average out while the signal keeps pulling. The rate depends
on nothing but the step, so a resumed run follows the very same schedule without any saved state.
"""

from __future__ import annotations

import math

import torch


def learning_rate(base: float, schedule: str, step: int, total_steps: int, final_ratio: float) -> float:
    """The rate of the update that takes the policy from `step` to `step + 1` (of `total_steps`).

    `cosine` and `linear` go from `base` at the first update to `final_ratio * base` at the last.
    """
    if schedule == "constant" or total_steps <= 1:
        return base
    progress = min(max(step / (total_steps - 1), 0.0), 1.0)
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return base * (final_ratio + (1.0 - final_ratio) * shape)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
