"""A run that has diverged stops, instead of training on, checkpointing or evaluating NaN weights.

A learning rate far too large (`sft.lr=1e30`) or an overflow turns the loss, the gradient or the weights
non-finite, and nothing after that point means anything: a NaN model plays every action by fallback,
its checkpoints poison a resume, and a later stage crashes deep inside sampling. So both training
stages check at every optimizer step, before the step is taken (loss and gradient) and after it (the
trained weights), and raise `Diverged` naming the step; the task marks the run FAILED with that line,
and the checkpoints already on disk, all written before the step, stay the last finite ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from sepo.errors import Diverged


def first_non_finite(params: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity, or None."""
    for name, tensor in params:
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def check_step(step: int, loss: float | None, model: torch.nn.Module, when: str) -> None:
    """Raise Diverged at `step` when the loss, a trainable parameter's gradient (`when="before"` the
    update) or a trainable weight (`when="after"`) is not finite."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if loss is not None and not math.isfinite(loss):
        raise Diverged(f"diverged at step {step}: the loss is {loss}; the checkpoints before it are kept")
    bad = first_non_finite((n, p.grad) for n, p in trainable) if when == "before" else first_non_finite(trainable)
    if bad is not None:
        what = "the gradient of" if when == "before" else "the weight"
        raise Diverged(f"diverged at step {step}: {what} {bad} is not finite; the checkpoints before it are kept")


def non_finite_inputs(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor | None,
    advantage: torch.Tensor,
    mask: torch.Tensor,
) -> str:
    """What in one pass's loss inputs is not finite, counted at the answers' real positions and at their
    padding, and the largest log-ratio between the policy and the sampler: the one line a run that
    diverged on a machine nobody can log into leaves behind."""
    real, logp = mask.bool(), logp.detach()

    def count(t: torch.Tensor, where: torch.Tensor) -> int:
        return int((~torch.isfinite(t) & where).sum())

    parts = [
        f"log-probs non-finite at {count(logp, real)} of {int(real.sum())} answer positions and "
        f"{count(logp, ~real)} of {int((~real).sum())} padded ones"
    ]
    parts.append(f"sampler's log-probs {count(logp_old, real)}")
    if logp_ref is not None:
        parts.append(f"reference log-probs {count(logp_ref, real)}")
    parts.append(f"advantages {int((~torch.isfinite(advantage)).sum())} of {advantage.numel()}")
    both = real & torch.isfinite(logp) & torch.isfinite(logp_old)
    if bool(both.any()):
        parts.append(f"largest |log-ratio| {float((logp - logp_old)[both].abs().max()):.3g}")
    return "; ".join(parts)
