"""Qwen 3.5's Gated DeltaNet decode step: transformers' reference against the five-pass step
(`sepo.lm.gated_delta_decode`), one layer at Qwen3.5-4B's shape, arms alternated (`python -m benchmarks.speed.delta_decode`).

Why: the step reads and writes the layer's fp32 recurrent state (rows x 32 heads x 128 x 128: 64 MiB a layer at 32
rows), so its time is bytes moved; the reference moves the state about fifteen times, the lean step five. This
times both on the same inputs, state written back as the cache does, and prints ms per layer-step, the speedup
and how far the two disagree.

    python -m benchmarks.speed.delta_decode [--batch 32 128] [--steps 10] [--repeats 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from benchmarks.speed.checkpoint_evaluation import alternated, mean_of
from sepo.lm.gated_delta_decode import lean_recurrent_step

#: Qwen3.5-4B's linear-attention layer (benchmarks/gpu/full_size.QWEN35_4B_TEXT)
K_HEADS, V_HEADS, K_DIM, V_DIM = 16, 32, 128, 128


def inputs(batch: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    made = {
        "query": torch.randn(batch, 1, K_HEADS, K_DIM, generator=g),
        "key": torch.randn(batch, 1, K_HEADS, K_DIM, generator=g),
        "value": torch.randn(batch, 1, V_HEADS, V_DIM, generator=g),
        "g": -torch.rand(batch, 1, V_HEADS, generator=g),
        "beta": torch.rand(batch, 1, V_HEADS, generator=g),
        "state": 0.1 * torch.randn(batch, V_HEADS, K_DIM, V_DIM, generator=g),
    }
    low = {"query", "key", "value", "beta"}  # the model hands these over in bfloat16
    return {k: (v.bfloat16() if k in low else v).to(device) for k, v in made.items()}


def steps(step: Any, x: dict[str, torch.Tensor], count: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Seconds per step of `count` steps from the same state, and the last output and state."""
    state = x["state"].clone()
    sync = torch.cuda.synchronize if state.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(count):
            out, new = step(
                x["query"], x["key"], x["value"], g=x["g"], beta=x["beta"], initial_state=state,
                output_final_state=True, use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            state.copy_(new)  # the cache keeps the state in its own buffer
    sync()
    return (time.perf_counter() - start) / count, out, state


def main(argv: list[str] | None = None) -> None:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speed.delta_decode", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    current = qwen.torch_recurrent_gated_delta_rule
    reference = getattr(current, "reference", current)
    arms = {"reference": reference, "lean": lean_recurrent_step(reference)}
    report: dict[str, Any] = {"device": args.device, "threads": torch.get_num_threads(), "batches": []}
    for batch in args.batch:
        x = inputs(batch, args.device)
        for step in arms.values():  # warm-up
            steps(step, x, 1)
        runs = alternated(tuple(arms), args.repeats, lambda arm, x=x: {"seconds": steps(arms[arm], x, args.steps)[0]})
        ms = {arm: round(1e3 * s, 3) for arm, s in mean_of(runs, "seconds").items()}
        _, want_out, want_state = steps(arms["reference"], x, 1)
        _, out, state = steps(arms["lean"], x, 1)
        report["batches"].append(
            {
                "batch": batch,
                "state_mib_per_layer": round(x["state"].numel() * 4 / 2**20, 1),
                "ms_per_layer_step": ms,
                "speedup": round(ms["reference"] / ms["lean"], 2),
                "max_abs_diff_output": float((out.float() - want_out.float()).abs().max()),
                "max_abs_diff_state": float((state - want_state).abs().max()),
            }
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
