"""Checkpoints of both training stages: written atomically, and read back newest first, falling back past
a damaged one.

A killed run resumes from its newest checkpoint that loads. One cut short by the kill (or damaged on
disk later) is reported in one line and the one before it is used, so a crash loses at most the steps
since the checkpoint before. SFT's checkpoints are the Trainer's own (`checkpoint-N/`, resumed by the
Trainer); SEPO's are this module's (`step_N/`: the adapter, the optimizer, the random streams, the
estimator's running statistics and the best responders, pointed at by `latest`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from sepo.errors import one_line
from sepo.files import directory_written_atomically, write_text_atomically

log = logging.getLogger(__name__)

T = TypeVar("T")


def numbered_newest_first(root: Path, prefix: str) -> list[Path]:
    """The directories `<prefix><N>` under `root`, highest N first."""
    if not root.is_dir():
        return []
    numbered = [p for p in root.glob(f"{prefix}*") if p.is_dir() and p.name.removeprefix(prefix).isdigit()]
    return sorted(numbered, key=lambda p: int(p.name.removeprefix(prefix)), reverse=True)


def newest_that_loads(candidates: list[Path], read: Callable[[Path], T], what: str) -> tuple[Path, T] | None:
    """The first candidate `read` reads without an error, and what it read; None when none does."""
    for ckpt in candidates:
        try:
            return ckpt, read(ckpt)
        except Exception as err:  # noqa: BLE001 (any damage: safetensors, pickle, JSON, a missing file)
            log.warning("%s %s does not load (%s); falling back to the one before it", what, ckpt, one_line(err))
    return None


# ------------------------------------------------------------------------------ SEPO
def save_checkpoint(out: Path, learner: Any, step: int, batch_index: int) -> Path:
    """Everything a resume needs of `learner` (the SEPO stage's `Learner`: its model's adapter, optimizer,
    policy's sampling stream, estimator, held terms' running gradients and best responders), written into a
    temporary dir, synced, then renamed into place, and only then pointed at by `latest`: a crash mid-write
    never leaves `latest` naming a half-written checkpoint."""
    model, optimizer, policy = learner.model, learner.optimizer, learner.policy
    root = out / "checkpoints"
    ckpt = root / f"step_{step}"
    with directory_written_atomically(ckpt, replace=True, durable=True) as tmp:  # a re-run may write a step again
        model.save_pretrained(tmp / "adapter")
        torch.save(
            {
                "step": step,
                "batch_index": batch_index,
                "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "policy_rng": policy.generator.get_state(),
            },
            tmp / "train_state.pt",
        )
        (tmp / "estimator_state.json").write_text(json.dumps(learner.estimator.to_dict()) + "\n")
        torch.save(learner.held.state_dict(), tmp / "held_averages.pt")
        learner.best_response.save(tmp)
    write_text_atomically(root / "latest", f"step_{step}\n")
    return ckpt


def read_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Every file of a checkpoint, read and parsed before anything is applied (so a damaged one changes nothing)."""
    from safetensors.torch import load_file

    return {
        "adapter": load_file(ckpt / "adapter" / "adapter_model.safetensors"),
        "train_state": torch.load(ckpt / "train_state.pt", weights_only=True),
        "estimator": json.loads((ckpt / "estimator_state.json").read_text()),
        "held": torch.load(ckpt / "held_averages.pt", weights_only=True),
    }


def checkpoints_newest_first(out: Path) -> list[Path]:
    """`latest` first, then every other finished checkpoint by step, newest first."""
    root = out / "checkpoints"
    pointer = root / "latest"
    named = [root / pointer.read_text().strip()] if pointer.exists() else []
    return named + [p for p in numbered_newest_first(root, "step_") if p not in named]


def load_checkpoint(out: Path, learner: Any) -> tuple[int, int]:
    """Restore the newest checkpoint that loads; returns (step, next batch index), or (0, 0) when there is none.

    A damaged one (truncated file, missing part) is reported in one line with its path and skipped
    for the one before it."""
    from peft import set_peft_model_state_dict

    def read(ckpt: Path) -> dict[str, Any]:
        saved = read_checkpoint(ckpt)
        learner.best_response.load(ckpt)
        return saved

    found = newest_that_loads(checkpoints_newest_first(out), read, "checkpoint")
    if found is None:
        return 0, 0
    ckpt, saved = found
    set_peft_model_state_dict(learner.model, saved["adapter"])
    state = saved["train_state"]
    learner.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    learner.policy.generator.set_state(state["policy_rng"])
    learner.estimator.load(saved["estimator"])
    learner.held.load_state_dict(saved["held"])
    log.info("resumed from %s (step %d)", ckpt, state["step"])
    return int(state["step"]), int(state["batch_index"])


# ------------------------------------------------------------------------------ SFT (the Trainer's)
def trainer_checkpoint_problem(ckpt: Path) -> str | None:
    """None when every weight file and the trainer state of a Trainer checkpoint can be read, else why not."""
    from safetensors import safe_open

    try:
        json.loads((ckpt / "trainer_state.json").read_text())
        files = sorted(ckpt.glob("*.safetensors"))
        if not files:
            return "no .safetensors weights"
        for file in files:
            with safe_open(str(file), framework="pt") as weights:
                for name in weights.keys():
                    weights.get_slice(name)  # reads each tensor's header: a truncated file fails here
        if (ckpt / "optimizer.pt").exists():
            torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 (safetensors, pickle and JSON raise their own kinds)
        return one_line(err)
    return None


def newest_loadable_trainer_checkpoint(ckpt_dir: Path) -> str | None:
    """The newest Trainer checkpoint that loads; a damaged one is reported in one line and skipped."""

    def read(ckpt: Path) -> None:
        if (problem := trainer_checkpoint_problem(ckpt)) is not None:
            raise ValueError(problem)

    found = newest_that_loads(numbered_newest_first(ckpt_dir, "checkpoint-"), read, "sft: checkpoint")
    return None if found is None else str(found[0])
