"""SFT steps with a batch's rows in one pass after the shared prefix, and split into passes of alike lengths.

    python -m benchmarks.speed.sft_passes [--model smollm2] [--game kuhn] [--batches 8] [--costs 0,200000]
                                          [--threads 2] [--repeats 2] [overrides]

What `sft.pass_cost` buys (`length_runs` in sepo/training/sft_batching.py): a batch's rows differ in length,
and one pass pads every row to the longest, in the products and in attention. Sorted by length and cut into
passes where the padding saved outweighs a pass, the same loss and gradient cost less. Each arm (a
`pass_cost`; 0 is one pass per prefix group) runs the forward and backward of the same `--batches` batches of
the stage's training examples (`sft.per_device_batch_size`, a seeded draw), arms alternated `--repeats`
times on one loaded model (LoRA as the stage builds it). Printed per run: seconds, passes, the positions
the passes computed, and the first batch's loss (the arms agree within rounding). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from sepo.run.compose import compose_config


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--game", default="kuhn")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--costs", default="0,200000")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("overrides", nargs="*")
    return parser.parse_args(argv)


def training_batches(args: argparse.Namespace) -> tuple[object, object, list[list[dict]], int]:
    """(model, stage settings, the examples of `--batches` batches, the padding id) as the SFT stage builds them."""
    from sepo.stages.sft import build_model, chat_collator, load_data, sft_settings
    from sepo.training.sft_trainer import training_data

    cfg = compose_config([f"model={args.model}", f"game={args.game}", *args.overrides])
    s = sft_settings(cfg)
    data = load_data(cfg, s)
    built = build_model(cfg, s)
    collator = chat_collator(cfg, s, built)
    _, examples, _, _ = training_data(s, built.model, args.model, collator, data.train, [])
    order = list(range(len(examples)))
    random.Random(int(s.seed)).shuffle(order)
    size = int(s.per_device_batch_size)
    batches = [[examples[i] for i in order[k * size : (k + 1) * size]] for k in range(args.batches)]
    return built.model, s, batches, collator.pad_id


def timed_steps(model, s, batches: list[list[dict]], pad_id: int, pass_cost: float) -> dict:
    """Forward and backward of every batch, its rows in passes as `pass_cost` cuts them (no optimizer step)."""
    from sepo.training.sft_batching import SFTBatchCollator, sft_logits, token_cross_entropy

    collate = SFTBatchCollator(pad_id, bool(s.prefix_sharing), int(s.prefix_min_tokens), pass_cost)
    trained = [p for p in model.parameters() if p.requires_grad]
    passes = positions = 0
    losses = []
    started = time.perf_counter()
    for examples in batches:
        batch = collate(examples)
        passes += len(batch["groups"])
        positions += sum(int(g["input_ids"].numel()) for g in batch["groups"]) + sum(
            int(p.numel()) for p in batch["prefixes"]
        )
        loss = token_cross_entropy(sft_logits(model, batch), batch["labels"])
        loss.backward()
        losses.append(round(float(loss.detach()), 5))
        for p in trained:
            p.grad = None
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "passes": passes,
        "positions": positions,
        "loss": losses[0],
    }


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.speed.checkpoint_evaluation import alternated, mean_of
    from sepo.profiling import matmul_gflops

    args = parse(argv)
    torch.set_num_threads(args.threads)
    model, s, batches, pad_id = training_batches(args)
    model.train()
    costs = [float(c) for c in args.costs.split(",")]
    timed_steps(model, s, batches[:1], pad_id, costs[0])  # warm-up: oneDNN's first products
    runs = alternated(
        tuple(f"{c:g}" for c in costs), args.repeats, lambda arm: timed_steps(model, s, batches, pad_id, float(arm))
    )
    seconds = mean_of(runs, "seconds")
    out = {
        "matmul_gflops_bf16": round(matmul_gflops(torch.bfloat16), 1),
        "seconds": seconds,
        "speedup": {arm: round(seconds[f"{costs[0]:g}"] / t, 3) for arm, t in seconds.items()},
        "runs": runs,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
