"""One checkpoint's evaluation three ways on a CPU, side by side: as before, with prepacked weights, and with
prepacked weights split over forked 1-thread workers.

    python -m benchmarks.speed.cpu_cores --model-path <sft run>/merged [--model smollm2] [--game kuhn]
                                         [--threads 2] [--workers 2] [--repeats 1] [overrides]

What `model.packed_linears` (sepo/lm/packed_linear.py) and `model.cpu_workers` (sepo/forked.py) buy: the test
evaluation of the model's own `eval` settings (the played table's read, then the episodes), alternated
`--repeats` times on one loaded model, the same episodes and sampling streams. Prepacked products equal
`F.linear`'s bit for bit, so `plain` and `packed` print the same metrics; the workers multiply on 1 thread
each, in other roundings than 2 threads, so their metrics are another draw of the same policy. Also prints a
`--rows`-row decoding step's products timed alone, plain against prepacked. The last line is JSON.
"""

from __future__ import annotations

import json
import time

import torch

from benchmarks.speed.checkpoint_evaluation import alternated, evaluation_parser, load_for_evaluation, mean_of

METRICS = ("parse_rate", "exploit_exact", "train_payoff", "safety")
ARMS = ("plain", "packed", "packed_workers")


def plain_linears(model) -> None:
    """Undo `use_packed_linears`: every layer back on the class's `F.linear`."""
    for module in model.modules():
        module.__dict__.pop("forward", None)
        module.__dict__.pop("_packed", None)


def timed_evaluation(cfg, game, model, tokenizer, arm: str, workers: int) -> dict:
    from sepo.lm.packed_linear import use_packed_linears
    from sepo.stages.evaluate import evaluate_with_protocol, evaluation_policy

    plain_linears(model) if arm == "plain" else use_packed_linears(model)
    policy = evaluation_policy(cfg, model, tokenizer)
    policy.workers = workers if arm == "packed_workers" else 1
    started = time.perf_counter()
    result = evaluate_with_protocol(cfg, game, policy)
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "metrics": {k: float(v) for k, v in result["metrics"].items() if k in METRICS},
    }


def decoding_products(model, rows: int, repeats: int = 10) -> dict:
    """Milliseconds of one decoding step's matrix products (every linear layer once, `rows` rows)."""
    from sepo.lm.packed_linear import drop_packed_weights, packed_forward

    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    inputs = {n: torch.randn(rows, n, dtype=torch.bfloat16) for n in {m.in_features for m in layers}}
    out = {}
    for arm, forward in (("plain", torch.nn.Linear.forward), ("packed", packed_forward)):
        with torch.no_grad():
            for _ in range(2):
                [forward(m, inputs[m.in_features]) for m in layers]
            started = time.perf_counter()
            for _ in range(repeats):
                [forward(m, inputs[m.in_features]) for m in layers]
        out[arm] = round(1e3 * (time.perf_counter() - started) / repeats, 1)
    drop_packed_weights(model)
    return out


def main(argv: list[str] | None = None) -> dict:
    from sepo.profiling import matmul_gflops

    parser = evaluation_parser(__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args(argv)
    cfg, game, model, tokenizer = load_for_evaluation(args)
    products = decoding_products(model, args.rows)
    print("decoding step products, ms:", json.dumps(products), flush=True)
    runs = alternated(ARMS, args.repeats, lambda arm: timed_evaluation(cfg, game, model, tokenizer, arm, args.workers))
    mean = {arm: round(seconds, 1) for arm, seconds in mean_of(runs, "seconds").items()}
    out = {
        "matmul_gflops_bf16": round(matmul_gflops(torch.bfloat16), 1),
        "threads": args.threads,
        "workers": args.workers,
        "decoding_step_products_ms": products,
        "seconds": mean,
        "speedup_packed": round(mean["plain"] / mean["packed"], 3),
        "speedup_packed_workers": round(mean["plain"] / mean["packed_workers"], 3),
        "runs": runs,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
