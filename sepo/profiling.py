"""Where the seconds of a SEPO step go, for `python -m benchmarks step` (benchmarks/speed/step_profile.py) (issue: profile first).

The training and acting code marks its phases with `section("name")`. Timing is off unless a
benchmark switches it on (`profiled()`), so the marks cost one attribute check in normal runs.
Sections nest and time is exclusive: a second spent in "decoding" inside "generate" counts for
"decoding" only, so the breakdown adds up to the wall time of the measured code. On CUDA the
device is synchronised at every boundary, otherwise asynchronous kernels would be billed to
whichever section happens to wait for them.

With `profiled(memory=True)` each section also records the process's peak resident memory while it
ran (Linux: the kernel's high-water mark, reset at every boundary), so "where did the memory go" has
an answer per phase, not just per process.

`time_model_forwards(model)` splits generate's forward passes into prompt processing (a pass over
more than one new token per row: the prefill) and decoding (one new token per row), and counts the
token positions every forward pass of the model carries, per section (`Sections.tokens`): with the
model's matmul parameters that gives each section's floating-point work, to set beside the rate this
machine multiplies matrices at (`matmul_gflops`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from sepo.heap import trim_heap


def peak_rss_bytes() -> int | None:
    """The process's peak resident memory since the last `reset_peak_rss` (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> None:
    """Start a new peak: hand the memory the allocator holds but no tensor uses back to the system
    (glibc keeps freed blocks, which would count in every later section), then set the kernel's
    high-water mark back to the current resident memory."""
    trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def gpu_peak_gib_since_last_call() -> float | None:
    """The CUDA allocator's peak since the previous call (GiB), then a fresh peak; None without a GPU.
    What a SEPO step needs at most is the figure that decides `sepo.micro_batch` on a given card."""
    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return round(peak, 2)


class Sections:
    """Exclusive wall-clock seconds per named section, with a call count (and, when asked, the peak
    resident memory reached inside each)."""

    def __init__(self) -> None:
        self.enabled = False
        self.memory = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.peak_rss: dict[str, int] = defaultdict(int)
        self.tokens: dict[str, int] = defaultdict(int)  # token positions through the model's forward
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
            if self.memory:
                peak = peak_rss_bytes() or 0
                self.peak_rss[self._stack[-1]] = max(self.peak_rss[self._stack[-1]], peak)
        if self.memory:
            reset_peak_rss()
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
        self.peak_rss.clear()
        self.tokens.clear()
        self._stack.clear()


#: the process-wide sections (one SEPO loop per process)
SECTIONS = Sections()
section = SECTIONS


@contextmanager
def profiled(memory: bool = False) -> Iterator[Sections]:
    """Switch timing (and with `memory`, peak resident memory) on for the duration of the block, with
    fresh counters; yields the sections."""
    SECTIONS.reset()
    SECTIONS.enabled, SECTIONS.memory = True, memory
    try:
        yield SECTIONS
    finally:
        SECTIONS.enabled = SECTIONS.memory = False


def time_model_forwards(model: torch.nn.Module) -> list[Any]:
    """Hooks that bill `model`'s forward passes inside `generate` to prompt processing or decoding.

    Teacher-forced passes run inside their own sections (log-probs, fallback), which keep their time:
    only forwards whose enclosing section is "generate" are reclassified. Returns the hook handles.
    """

    def before(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not (SECTIONS.enabled and SECTIONS._stack):
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None and kwargs.get("inputs_embeds") is not None:
            ids = kwargs["inputs_embeds"][..., 0]
        if SECTIONS._stack[-1] == "generate":
            SECTIONS.enter("prompt_processing" if ids is not None and ids.shape[1] > 1 else "decoding")
        if ids is not None:
            SECTIONS.tokens[SECTIONS._stack[-1]] += int(ids.numel())

    def after(_module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if SECTIONS.enabled and SECTIONS._stack and SECTIONS._stack[-1] in ("prompt_processing", "decoding"):
            SECTIONS.exit()

    # PEFT's generate calls the wrapped model's forward, not the wrapper's
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [
        target.register_forward_pre_hook(before, with_kwargs=True),
        target.register_forward_hook(after, with_kwargs=True),
    ]


def matmul_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(decoder matmul weights, output head weights): the multiply-adds per token position of a forward
    pass, without the attention scores (which grow with the context) and the embedding lookup."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_id = id(head.weight) if head is not None else None
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m.weight) != head_id)
    return body, (head.weight.numel() if head is not None else 0)


@contextmanager
def positions_fed(model: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Token positions fed to `model` while the block runs, in training and in evaluation mode (a hook on
    its input embeddings): with `matmul_parameters`, the floating-point work a loop did, whatever its
    batching, padding or shared prefixes."""
    counts = {"train": 0, "eval": 0}

    def count(module: torch.nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor):
            counts["train" if module.training else "eval"] += int(args[0].numel())

    handle = model.get_input_embeddings().register_forward_pre_hook(count)
    try:
        yield counts
    finally:
        handle.remove()


def backward_passes(full_finetune: bool) -> int:
    """A backward pass's matmul work in forward passes: one for the activations' gradients, and one more
    for the weights' own when all of them train (an adapter's are negligible)."""
    return 2 if full_finetune else 1


def training_gflop(body_parameters: int, positions: dict[str, int], full_finetune: bool) -> float:
    """GFLOP of a training loop's decoder matmuls: 2 per weight and position forward, then the backward
    (`backward_passes`); an evaluation pass is forward only. The output head is left out (a loss on the
    answer positions runs it on a few of them)."""
    per_train_position = 2 * (1 + backward_passes(full_finetune))
    return body_parameters * (per_train_position * positions["train"] + 2 * positions["eval"]) / 1e9


def matmul_gflops(dtype: torch.dtype, size: int = 2048, seconds: float = 1.0) -> float:
    """The rate this machine multiplies two square matrices at, in `dtype`, on the current threads: the
    ceiling a model's forward and backward passes can approach (they are mostly such products).

    The side doubles from 256 up to `size` only while the next product would take under a quarter of
    `seconds`, so the reading costs about `seconds` everywhere: a CPU that emulates bfloat16 (no
    AVX512-BF16) multiplies it at about 0.1 GFLOP/s, where one 2048-square product takes two minutes."""
    side = min(256, size)
    while True:
        a, b = torch.randn(side, side, dtype=dtype), torch.randn(side, side, dtype=dtype)
        a @ b  # the first call pays for thread start-up and kernel choice
        started = time.perf_counter()
        a @ b
        one = time.perf_counter() - started
        if side >= size or 8 * one > seconds / 4:  # doubling the side costs 8 times the work
            break
        side = min(2 * side, size)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        done += 1
    return 2 * side**3 * done / (time.perf_counter() - started) / 1e9
