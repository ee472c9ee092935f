"""Decode steps replayed as CUDA graphs inside transformers' `generate` (`model.decode_graphs`).

Why: on a GPU, a decode step of a 4B model at batch 128 launches hundreds to thousands of small kernels
from Python, and the step is bound by launching them, not by reading the weights (docs/speed.md §4: 4.5% of
the bandwidth floor for Gemma 4 E4B). On a static cache every decode step has the same shapes and the same
addresses, so it can be captured once as a CUDA graph and replayed with one launch. transformers' own route
to that is `torch.compile` (minutes of compiling per model and shape); capturing the eager forward needs no
compiler and costs one forward pass per `generate` call.

How, within one `generate` call (`graph_decoding`): transformers builds each step's inputs eagerly (masks,
positions) and calls the model's compiled forward where the cache is static; that call is routed here.
The first step of a given input signature runs eagerly (the warm-up a capture needs); the next one captures
the forward into a graph with its tensor inputs in fixed buffers, and every later step copies its inputs
into those buffers and replays. What a graph cannot see is Python-side state the forward reads or writes:
in transformers' static caches that is the sliding-window layer's column count (`cumulative_length_int`),
which picks its update's branch. So the signature includes whether each sliding window is full (a new
graph when one fills), the count is restored after a capture and advanced after a replay. A full window is
kept as a ring (`ring_sliding_update`): each step overwrites its oldest column instead of copying the window
to shift it (transformers' way, which also builds an index from host data, which a capture cannot hold), and
the sliding mask transformers builds for an ordered window is rolled to the ring's order (`ring_masks`).
Keys sit in another order than transformers' static cache keeps them, so attention sums in another order:
results agree with graphs off to float rounding, and bit for bit with the same steps run without capture.
Any other cache layer kind refuses graphs with an error naming it.

The backend makes the graphs: `CudaGraphs` on a GPU; the tests give one (`tests/conftest.py: Tracing`) that
traces the forward once with `make_fx` and replays the trace, which freezes Python-side
values exactly as a capture does, so the whole path is checked on a CPU against plain `generate`.
"""

from __future__ import annotations

import contextlib
import copy
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from sepo.errors import ConfigError


class CudaGraphs:
    """How a step is made into a graph on a GPU: CUDA's capture, on a stream of its own, where the eager step
    before it also ran (torch's recipe: kernels chosen and workspaces made for that stream before capturing).

    A capture backend has two methods: `eager(run)`, the step that runs before a capture (its output is the
    step's real output), and `capture(forward, cache)`, which records `forward` (a function of no arguments
    running the model on fixed buffers and returning the logits) and returns a function of no arguments that
    reruns it. A CUDA capture runs nothing; a capture that runs the forward to record it must put the cache
    (what the forward writes) back as it found it."""

    def __init__(self):
        self.stream = torch.cuda.Stream()

    def eager(self, run: Callable[[], Any]) -> Any:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = run()
        torch.cuda.current_stream().wait_stream(self.stream)
        out.logits.record_stream(torch.cuda.current_stream())  # made on the side stream, read on this one
        return out

    def capture(self, forward: Callable[[], torch.Tensor], cache: Any) -> Callable[[], torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            logits = forward()

        def replay() -> torch.Tensor:
            graph.replay()
            return logits

        return replay


def ring_sliding_update(self: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
    """`StaticSlidingWindowLayer.update` of a full window, one token at a time, as a ring: the new column
    overwrites the oldest (`ring_slot`, a device tensor the step advances), where transformers' version copies
    the whole window to shift it by one (a third of Gemma 4's graph step at 128 rows, docs/speed.md §4g) and
    builds its index from host data (which a capture cannot hold). Attention does not care where a key sits;
    the mask does, and `GraphedForward` rolls it to match (`ring_masks`)."""
    if not (self.cumulative_length_int >= self.max_cache_len and key_states.shape[-2] == 1):
        return type(self).update(self, key_states, value_states, *args, **kwargs)
    self.cumulative_length_int += 1
    self.ring_writes += 1
    self.keys.index_copy_(2, self.ring_slot, key_states)
    self.values.index_copy_(2, self.ring_slot, value_states)
    self.ring_slot.add_(1).remainder_(self.max_cache_len)
    return self.keys, self.values


def _layer_kinds() -> tuple[tuple[type, ...], type]:
    """(cache layers whose decode update keeps no Python-side state, the sliding-window layer)."""
    from transformers import cache_utils

    stateless = tuple(
        getattr(cache_utils, name)
        for name in ("StaticLayer", "LinearAttentionLayer", "LinearAttentionAndStaticFullAttentionLayer", "DummyLayer")
        if hasattr(cache_utils, name)
    )
    return stateless, cache_utils.StaticSlidingWindowLayer


class GraphedForward:
    """The decode forward of one `generate` call on one static cache, replayed as graphs (module docstring)."""

    def __init__(self, model: Any, backend: Any):
        self.model, self.backend = model, backend
        self.seen: set[tuple] = set()
        self.graphs: dict[tuple, _Graph] = {}
        self.replays = 0

    def __call__(self, **inputs: Any) -> Any:
        cache = _cache_of(inputs)
        sliding = _sliding_layers(cache)
        inputs = ring_masks(inputs, sliding)
        leaves, spec = pytree.tree_flatten(inputs)
        key = _signature(leaves, spec, sliding)
        if key not in self.seen:  # first step of this signature: eager, the capture's warm-up
            self.seen.add(key)
            return self.backend.eager(lambda: self.model(**inputs))
        if key not in self.graphs:
            counts = [(layer.cumulative_length_int, layer.ring_writes) for layer in sliding]
            self.graphs[key] = _Graph(self.model, inputs, self.backend)
            for layer, (count, writes) in zip(sliding, counts):  # the capture ran the Python side; the GPU nothing
                layer.cumulative_length_int, layer.ring_writes = count, writes
        output = self.graphs[key].replay(leaves)
        advance_windows(sliding)
        self.replays += 1
        return output


def advance_windows(sliding: list[Any]) -> None:
    """What a replayed step leaves undone: the sliding-window layers' Python-side column and ring counts."""
    for layer in sliding:
        if layer.cumulative_length_int >= layer.max_cache_len:
            layer.ring_writes += 1
        layer.cumulative_length_int += 1


def ring_masks(inputs: dict[str, Any], sliding: list[Any]) -> dict[str, Any]:
    """The inputs with the sliding layers' mask in ring order. transformers builds it for a window held oldest
    to newest; with the window full, this step writes the ring's slot r = writes mod W, after which slot r
    holds the newest key and slot (r + 1) mod W the oldest: the mask rolled by r + 1."""
    if not sliding or sliding[0].cumulative_length_int < sliding[0].max_cache_len:
        return inputs  # no window full yet: every slot still holds the column of its own index
    layer, masks = sliding[0], inputs.get("attention_mask")
    window = layer.max_cache_len
    if not (isinstance(masks, dict) and masks.get("sliding_attention") is not None):
        raise ConfigError(
            f"model.decode_graphs: {type(masks).__name__} masks for a full sliding window are not known to follow "
            "its ring layout; set model.decode_graphs=false"
        )
    mask = masks["sliding_attention"]
    if mask.shape[-1] != window or any(other.ring_writes != layer.ring_writes for other in sliding):
        raise ConfigError(
            f"model.decode_graphs: a sliding mask of {mask.shape[-1]} columns for a {window}-column window"
        )
    rolled = torch.roll(mask, shifts=(layer.ring_writes + 1) % window, dims=-1)
    return {**inputs, "attention_mask": {**masks, "sliding_attention": rolled}}


def as_rings(layer: Any) -> None:
    """Give a sliding-window cache layer `ring_sliding_update` and its ring's state (once)."""
    if "update" in vars(layer):
        return
    layer.update = types.MethodType(ring_sliding_update, layer)
    layer.ring_slot = torch.zeros(1, dtype=torch.long, device=layer.keys.device)
    layer.ring_writes = 0


class _Graph:
    """One captured forward: its tensor inputs in fixed buffers, and the output to hand back."""

    def __init__(self, model: Any, inputs: dict[str, Any], backend: Any):
        leaves, self.spec = pytree.tree_flatten(inputs)
        self.buffers = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        fixed = pytree.tree_unflatten(self.buffers, self.spec)
        self.output = None

        def forward() -> torch.Tensor:
            out = model(**fixed)
            self.output = out
            return out.logits

        self.run = backend.capture(forward, _cache_of(inputs))

    def replay(self, leaves: list[Any]) -> Any:
        """Run the graph on `leaves`, the step's inputs flattened as at its capture."""
        for buffer, leaf in zip(self.buffers, leaves, strict=True):
            if isinstance(leaf, torch.Tensor):
                buffer.copy_(leaf)
        logits = self.run()
        output = copy.copy(self.output)  # the capture's output (a backend that reruns leaves its latest)
        output["logits"] = logits
        return output


def _cache_of(inputs: dict[str, Any]) -> Any:
    from transformers import StaticCache

    cache = inputs.get("cache", inputs.get("past_key_values"))
    if not isinstance(cache, StaticCache):
        raise ConfigError(
            f"model.decode_graphs needs a static cache (model.static_cache: true); got {type(cache).__name__}"
        )
    return cache


def _sliding_layers(cache: Any) -> list[Any]:
    """The cache's sliding-window layers, each made a ring (`as_rings`); an error for a layer kind whose
    Python-side state is not known."""
    stateless, sliding = _layer_kinds()
    out = []
    for layer in cache.layers:
        if isinstance(layer, sliding):
            as_rings(layer)
            out.append(layer)
        elif not isinstance(layer, stateless):
            raise ConfigError(
                f"model.decode_graphs: the cache layer {type(layer).__name__} is not known to be capturable "
                f"(known: {', '.join(k.__name__ for k in (*stateless, sliding))}); set model.decode_graphs=false"
            )
    return out


def _signature(leaves: list[Any], spec: Any, sliding: list[Any]) -> tuple:
    """What one graph serves: the inputs' structure (`spec`), every tensor's shape and dtype, every other input's
    identity, and which sliding windows are full (the branch their update takes)."""
    described = tuple(_described(leaf) for leaf in leaves)
    full = tuple(layer.cumulative_length_int >= layer.max_cache_len for layer in sliding)
    return str(spec), described, full


def _described(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return tuple(leaf.shape), leaf.dtype, leaf.device
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return leaf
    return type(leaf), id(leaf)  # the cache: the same object at every step of one generate call


@contextlib.contextmanager
def graph_decoding(model: Any, backend: Callable[[], Any] = CudaGraphs) -> Iterator[GraphedForward]:
    """Within the block, `model.generate` on a static cache decodes through `GraphedForward` (module
    docstring), its graphs made by `backend()` (`CudaGraphs`). `model` may be a PEFT wrapper: the transformers
    model under it is the one generate runs."""
    from transformers import StaticCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    graphed = GraphedForward(base, backend())

    def valid(model_kwargs: dict[str, Any], generation_config: Any) -> bool:
        return isinstance(model_kwargs.get("cache", model_kwargs.get("past_key_values")), StaticCache)

    base.get_compiled_call = lambda compile_config: graphed
    base._valid_auto_compile_criteria = valid
    try:
        yield graphed
    finally:
        del base.get_compiled_call, base._valid_auto_compile_criteria
