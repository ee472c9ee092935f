"""Several players on one base model: each a LoRA adapter of the same weights (or the base, adapters off).

A learned exploiter and its victim are two adapters of one base (the victim's SEPO adapter and the exploiter's
fresh one, or the SFT model itself and the exploiter's adapter): the base's weights are held once, and a seat
switches to its own adapter only for its own calls (`sepo.policies.adapter_seat`). The adapter being trained stays the active one between
calls, so every pass of the update (`sepo.training.update`) sees it, and no call of another seat leaves a
frozen adapter trainable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the adapter name peft gives the first adapter (the one `attach_lora` makes): the trained player's
TRAINED = "default"


@contextlib.contextmanager
def adapter_active(model: Any, adapter: str | None) -> Iterator[None]:
    """`model` playing `adapter` (None: the base, every adapter off), frozen; on exit the adapter that was
    active before, with exactly the parameters that were trainable before."""
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    previous = model.active_adapter
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.set_adapter(adapter, inference_mode=True)
    try:
        yield
    finally:
        model.set_adapter(previous)
        for p in model.parameters():
            p.requires_grad_(False)
        for p in trainable:
            p.requires_grad_(True)


def load_trained_weights(model: Any, path: str) -> None:
    """Start the active adapter from the weights saved at `path` (same shape: the same targets and rank)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(Path(path) / "adapter_model.safetensors")))


def load_frozen_adapter(model: Any, path: str, name: str) -> None:
    """Add the adapter saved at `path` to a peft `model` under `name`, frozen, leaving the active one active."""
    model.load_adapter(path, adapter_name=name, is_trainable=False)
