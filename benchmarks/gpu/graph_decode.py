"""A decode step replayed as one CUDA graph (`python -m benchmarks.gpu.graph_decode --model gemma4|qwen`).

Why: at full size a decode step of transformers' `generate` is bound by launching kernels, not by reading
weights: Gemma 4 E4B's step took ~49 ms at every batch from 32 to 256 (4.5% of its bandwidth floor), and
the static cache under generate's `torch.compile` reached only 7% (docs/speed.md §4), after minutes of
compiling. A step on a static cache has fixed shapes and fixed addresses, so it can be captured once as a
CUDA graph (one launch per step) with no compiler at all: the capture costs one forward pass. This measures,
per model at one batch, on the same prompt and the same cache:

- the step run eagerly on the static cache (what the graph replaces);
- the same step replayed as a captured graph, and whether its logits equal the eager step's;
- one eager step under torch's profiler: kernels launched and their summed GPU time, so the share of a
  step that is launch overhead, and what a graph can at best give, are numbers;
- the bandwidth floor (weight bytes / measured copy bandwidth, as `python -m benchmarks gpu` computes it).

What makes a step capturable, and is done here: positions come from a device tensor advanced in place (the
models would otherwise read the cache's Python-side length, frozen at capture); Gemma 4's masks are passed
in (its sliding layers compute theirs from a Python int), which needs every sliding window already full
after the prompt, as at the benchmark's 600-token prompt; and a full sliding window is kept as a ring, as the
runs' graphs keep it (`sepo.lm.graph_decoding.ring_sliding_update`: one column written, no host data; with
no padding every key of a full window is visible, so its mask is all ones in any order).
`tests/test_graph_decoding.py` checks on the CPU that the eager step equals `generate`'s greedy tokens and
that a step copies nothing from the host.

    python -m benchmarks.gpu.graph_decode --model gemma4 [--batch 128] [--prompt-tokens 600] [--steps 32]
    python -m benchmarks.gpu.graph_decode --model qwen --tiny --device cpu    # the flow on a CPU, no graph
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu import full_size

#: agreement of the graph's logits with the eager step's, in the model's dtype: replaying the very kernels
#: gives equal logits; a graph that froze a Python-side value (a position, a mask size) drifts far past this
LOGIT_TOLERANCE = 1e-2


# ------------------------------------------------------------------------------------- the step
class StaticStep:
    """One greedy decode step of `batch` rows on a static cache, with every input in a fixed buffer:
    `token` (the rows' last tokens), `position` (their position, advanced in place by `advance`)."""

    def __init__(self, model: Any, arch: str, prompt: torch.Tensor, max_new_tokens: int):
        from transformers import StaticCache
        from transformers.cache_utils import StaticSlidingWindowLayer

        from sepo.lm.graph_decoding import as_rings

        self.model, self.arch = model, arch
        batch, length = prompt.shape
        self.text_config = model.config.get_text_config(decoder=True)
        self.check_windows_full(length)
        self.cache = StaticCache(config=model.config, max_cache_len=length + max_new_tokens)
        self.max_len = length + max_new_tokens
        device = prompt.device
        self.extras = self._extras(torch.zeros((batch, 1), dtype=torch.long, device=device))
        self.token = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.position = torch.full((batch, 1), length, dtype=torch.long, device=device)
        self.columns = torch.arange(self.max_len, device=device)
        self.logits = self.prefill(prompt)
        for layer in self.cache.layers:  # full windows kept as rings, as the runs' graphs keep them
            if isinstance(layer, StaticSlidingWindowLayer):
                as_rings(layer)

    def check_windows_full(self, prompt_tokens: int) -> None:
        window = getattr(self.text_config, "sliding_window", None)
        if "sliding_attention" in (getattr(self.text_config, "layer_types", None) or []) and prompt_tokens <= window:
            raise ValueError(
                f"--prompt-tokens {prompt_tokens}: {self.arch}'s sliding windows ({window} tokens) must be full after "
                f"the prompt for its step to be captured; give more than {window}"
            )

    def _extras(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        from omegaconf import OmegaConf

        from sepo.models import forward_extras

        return forward_extras(self.model, OmegaConf.create({"token_type_ids": self.arch == "gemma4"}), ids)

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(prompt.shape[1], device=prompt.device).expand(prompt.shape[0], -1)
        with torch.no_grad():
            out = self.model(
                input_ids=prompt,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
                **self._extras(prompt),
            )
        self.token.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
        return out.logits[:, -1]

    def masks(self) -> dict[str, torch.Tensor] | None:
        """Gemma 4's two masks for one query, made on the device from `position`: a full layer's static
        cache holds position j in column j; a full sliding window holds only keys the query may see."""
        if self.arch != "gemma4":
            return None
        batch = self.token.shape[0]
        full = (self.columns[None, :] <= self.position)[:, None, None, :]
        window = self.text_config.sliding_window
        sliding = torch.ones((batch, 1, 1, window), dtype=torch.bool, device=self.token.device)
        return {"full_attention": full, "sliding_attention": sliding}

    def __call__(self) -> torch.Tensor:
        with torch.no_grad():
            out = self.model(
                input_ids=self.token,
                position_ids=self.position,
                attention_mask=self.masks(),
                past_key_values=self.cache,
                use_cache=True,
                **self.extras,
            )
        return out.logits[:, -1]

    def advance(self, logits: torch.Tensor) -> None:
        self.token.copy_(logits.argmax(-1, keepdim=True))
        self.position.add_(1)


class CacheSnapshot:
    """Everything a static cache holds, tensors and Python-side lengths, to put the cache back in place:
    every arm of the benchmark decodes from the same state."""

    def __init__(self, step: StaticStep):
        self.step = step
        self.layers = [self._copy(vars(layer)) for layer in step.cache.layers]
        self.token, self.position = step.token.clone(), step.position.clone()

    @staticmethod
    def _copy(state: dict[str, Any]) -> dict[str, Any]:
        return {
            key: value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for key, value in state.items()
            if not callable(value)  # the ring's update method, bound to the layer: not state
        }

    def restore(self) -> None:
        for layer, saved in zip(self.step.cache.layers, self.layers, strict=True):
            for key, value in saved.items():
                current = getattr(layer, key)
                if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
                    current.copy_(value)
                elif isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values()):
                    for k, v in value.items():
                        current[k].copy_(v) if isinstance(v, torch.Tensor) else current.__setitem__(k, v)
                else:
                    setattr(layer, key, copy.deepcopy(value))
        self.step.token.copy_(self.token)
        self.step.position.copy_(self.position)


# ------------------------------------------------------------------------------------- decoding
def decode(run_step: Callable[[], torch.Tensor], step: StaticStep, steps: int, keep_logits: int) -> dict[str, Any]:
    """`steps` greedy steps; their seconds, every row's tokens, and the first `keep_logits` steps' logits."""
    tokens, kept = [], []
    device = step.token.device
    full_size._sync(device)
    start = time.perf_counter()
    for i in range(steps):
        logits = run_step()
        if i < keep_logits:
            kept.append(logits.float().clone())
        step.advance(logits)
        tokens.append(step.token.clone())
    full_size._sync(device)
    return {"seconds": time.perf_counter() - start, "tokens": torch.cat(tokens, dim=1), "logits": kept}


class GraphStep:
    """`step` captured once as a CUDA graph; calling it replays the graph and returns its static logits."""

    def __init__(self, step: StaticStep, warmup: int = 2):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # kernels chosen and workspaces allocated before the capture
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = step()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


def kernel_profile(step: StaticStep, top: int = 8) -> dict[str, Any]:
    """One eager step under torch's profiler: the kernels it launched and their summed GPU time (the device's
    own events only: torch's operator rows carry their kernels' time too, and summing both counts it twice)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    full_size._sync(step.token.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        full_size._sync(step.token.device)
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name[:80], []).append(event.device_time_total)
    heaviest = sorted(by_name.items(), key=lambda item: sum(item[1]), reverse=True)[:top]
    return {
        "kernels_launched": len(kernels),
        "kernel_ms": round(sum(e.device_time_total for e in kernels) / 1e3, 3),
        "top": [{"name": name, "count": len(times), "ms": round(sum(times) / 1e3, 3)} for name, times in heaviest],
    }


# ------------------------------------------------------------------------------------- the benchmark
def measure(model: Any, arch: str, batch: int, prompt_tokens: int, steps: int, bandwidth: float, seed: int = 0):
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (batch, prompt_tokens), generator=generator).to(device)
    weight_bytes = full_size.decode_weight_bytes(model)
    out: dict[str, Any] = {"batch": batch, "prompt_tokens": prompt_tokens, "steps": steps}
    step = StaticStep(model, arch, prompt, max_new_tokens=steps + 1)
    out["cache_mib"] = round(full_size.cache_bytes(step.cache) / full_size.MIB, 1)
    snapshot = CacheSnapshot(step)
    decode(step, step, 2, 0)  # warm-up: kernel choice and allocator growth are not decode time
    snapshot.restore()
    eager = decode(step, step, steps, keep_logits=4)
    out["eager"] = _figures(eager["seconds"] / steps, batch, weight_bytes, bandwidth, out["cache_mib"])
    if device.type == "cuda":
        snapshot.restore()
        out["profile_one_eager_step"] = _or_error(kernel_profile, step)
        snapshot.restore()
        out.update(
            _or_error(_graph_arm, step, snapshot, eager, steps, batch, weight_bytes, bandwidth, out["cache_mib"])
        )
    return out


def _graph_arm(step, snapshot, eager, steps, batch, weight_bytes, bandwidth, cache_mib) -> dict[str, Any]:
    graph = GraphStep(step)
    snapshot.restore()  # the warm-up advanced the cache; the capture ran nothing
    replayed = decode(graph, step, steps, keep_logits=4)
    figures = _figures(replayed["seconds"] / steps, batch, weight_bytes, bandwidth, cache_mib)
    figures["speedup_over_eager"] = round(eager["seconds"] / replayed["seconds"], 2)
    return {"graph": figures, "graph_vs_eager": _agreement(eager, replayed)}


def _or_error(measure_part: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """A part that fails is a figure too: what broke, in one line, and the other parts still measured."""
    try:
        return measure_part(*args)
    except Exception as err:  # noqa: BLE001
        return {"error_" + measure_part.__name__.strip("_"): f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}


def _figures(seconds: float, batch: int, weight_bytes: int, bandwidth: float, cache_mib: float) -> dict[str, Any]:
    cache_bytes = cache_mib * full_size.MIB
    return {
        "ms_per_step": round(1e3 * seconds, 3),
        "tokens_per_s": round(batch / seconds, 1),
        "floor_fraction": round(full_size.bandwidth_floor_fraction(weight_bytes, bandwidth, seconds), 4),
        "floor_fraction_with_cache": round(
            full_size.bandwidth_floor_fraction(weight_bytes + cache_bytes, bandwidth, seconds), 4
        ),
    }


def _agreement(eager: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    worst = max(float((a - b).abs().max()) for a, b in zip(eager["logits"], replayed["logits"], strict=True))
    same_rows = (eager["tokens"] == replayed["tokens"]).all(dim=1).float().mean()
    return {
        "max_abs_logit_diff_first_steps": round(worst, 5),
        "logits_agree": worst <= LOGIT_TOLERANCE,
        "rows_with_equal_tokens": round(float(same_rows), 4),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=full_size.ARCHS, required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[128])
    parser.add_argument("--prompt-tokens", type=int, default=600, help="more than Gemma 4's 512-token window")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model of the architecture (tests)")
    parser.add_argument(
        "--reference-delta-rule",
        action="store_true",
        help="Qwen 3.5: decode with transformers' own Gated DeltaNet step, not the five-pass one the runs use",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    if args.tiny:
        config = full_size.tiny_config(args.model, vocab=512)
    else:
        config = full_size.gemma4_config("e4b") if args.model == "gemma4" else full_size.qwen35_config()
    lean = False
    if args.model == "qwen" and not args.reference_delta_rule:
        from sepo.lm.gated_delta_decode import use_lean_delta_decode

        lean = use_lean_delta_decode()
    start = time.perf_counter()
    model = full_size.build_model(args.model, config, args.device, dtype)
    built = round(time.perf_counter() - start, 1)
    bandwidth = full_size.measure_bandwidth(args.device, 1024 if not args.tiny else 16, 50 if not args.tiny else 5)
    result: dict[str, Any] = {
        "model": args.model,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "lean_delta_decode": lean,
        "build_s": built,
        "bandwidth_gb_per_s": bandwidth["gb_per_s"],
        "weight_mib": round(full_size.decode_weight_bytes(model) / full_size.MIB, 1),
        "batches": [],
    }
    for batch in args.batch:
        try:
            row = measure(model, args.model, batch, args.prompt_tokens, args.steps, bandwidth["bytes_per_s"])
        except Exception as err:  # noqa: BLE001 - a failed capture is a figure too: say what broke and go on
            row = {"batch": batch, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        print(json.dumps(row), flush=True)
        result["batches"].append(row)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.graph_decode", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    print(json.dumps(run(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
