"""Where the seconds of a SEPO step go, for `python -m sepo.bench step` (sepo/benchmarks/step_profile.py) (issue: profile first).

The training and acting code marks its phases with `section("name")`. Timing is off unless a
benchmark switches it on (`profiled()`), so the marks cost one attribute check in normal runs.
Sections nest and time is exclusive: a second spent in "decoding" inside "generate" counts for
"decoding" only, so the breakdown adds up to the wall time of the measured code. On CUDA the
device is synchronised at every boundary, otherwise asynchronous kernels would be billed to
whichever section happens to wait for them.

`time_model_forwards(model)` splits generate's forward passes into prompt processing (a pass over
more than one new token per row: the prefill) and decoding (one new token per row).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class Sections:
    """Exclusive wall-clock seconds per named section, with a call count."""

    def __init__(self) -> None:
        self.enabled = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []
        self._since = 0.0

    def _now(self) -> float:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    def _switch(self) -> None:
        """Bill the time since the last boundary to the innermost open section."""
        now = self._now()
        if self._stack:
            self.seconds[self._stack[-1]] += now - self._since
        self._since = now

    def enter(self, name: str) -> None:
        if self.enabled:
            self._switch()
            self._stack.append(name)
            self.calls[name] += 1

    def exit(self) -> None:
        if self.enabled and self._stack:
            self._switch()
            self._stack.pop()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self._stack.clear()


#: the process-wide sections (one SEPO loop per process)
SECTIONS = Sections()
section = SECTIONS


@contextmanager
def profiled() -> Iterator[Sections]:
    """Switch timing on for the duration of the block (fresh counters); yields the sections."""
    SECTIONS.reset()
    SECTIONS.enabled = True
    try:
        yield SECTIONS
    finally:
        SECTIONS.enabled = False


def time_model_forwards(model: torch.nn.Module) -> list[Any]:
    """Hooks that bill `model`'s forward passes inside `generate` to prompt processing or decoding.

    Teacher-forced passes run inside their own sections (log-probs, fallback), which keep their time:
    only forwards whose enclosing section is "generate" are reclassified. Returns the hook handles.
    """

    def before(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if SECTIONS.enabled and SECTIONS._stack and SECTIONS._stack[-1] == "generate":
            ids = kwargs.get("input_ids", args[0] if args else None)
            SECTIONS.enter("prompt_processing" if ids is not None and ids.shape[1] > 1 else "decoding")

    def after(_module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if SECTIONS.enabled and SECTIONS._stack and SECTIONS._stack[-1] in ("prompt_processing", "decoding"):
            SECTIONS.exit()

    # PEFT's generate calls the wrapped model's forward, not the wrapper's
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [
        target.register_forward_pre_hook(before, with_kwargs=True),
        target.register_forward_hook(after, with_kwargs=True),
    ]
