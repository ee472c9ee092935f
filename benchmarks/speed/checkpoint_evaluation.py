"""What the benchmarks that time one checkpoint's evaluation share: their command line and the loaded model.

Each of them (cascade_decoding, cpu_cores, fallback_cache) evaluates one merged checkpoint several ways, alternated on one loaded
model, the test protocol of the model's own `eval` settings.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch

from sepo.run.compose import compose_config as compose


def evaluation_parser(doc: str) -> argparse.ArgumentParser:
    """`--model-path` (required), `--model`, `--game`, `--threads`, `--repeats`, then config overrides."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--game", default="kuhn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    return parser


def load_for_evaluation(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(config, game, model, tokenizer) of the parsed command line, at its thread count."""
    from sepo.builders import load_model_and_tokenizer
    from sepo.games import make_game

    torch.set_num_threads(args.threads)
    cfg = compose(
        [
            f"model={args.model}",
            f"game={args.game}",
            f"model.path={args.model_path}",
            "eval.progress=false",
            *args.overrides,
        ]
    )
    model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    return cfg, make_game(cfg.game), model, tokenizer


def profiled_evaluation(cfg, game, policy, metrics: tuple[str, ...]) -> tuple[float, Any, dict[str, float]]:
    """`policy` evaluated by the test protocol under the section timers: its seconds, the timers (seconds and
    tokens per section), and the results' `metrics`."""
    import time

    from sepo.profiling import profiled
    from sepo.stages.evaluate import evaluate_with_protocol

    with profiled() as sections:
        started = time.perf_counter()
        result = evaluate_with_protocol(cfg, game, policy)
        seconds = time.perf_counter() - started
    return seconds, sections, {k: float(v) for k, v in result["metrics"].items() if k in metrics}


def alternated(arms: tuple[str, ...], repeats: int, evaluate: Callable[[str], dict]) -> dict[str, list[dict]]:
    """`evaluate(arm)` for every arm in turn, `repeats` rounds, each result printed as it comes: the machine
    drifts, so arms are compared round by round, never block against block."""
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm in arms:
            runs[arm].append(evaluate(arm))
            print(arm, json.dumps(runs[arm][-1]), flush=True)
    return runs


def mean_of(runs: dict[str, list[dict]], key: str) -> dict[str, float]:
    """Each arm's mean of `key` over its rounds."""
    return {arm: sum(r[key] for r in rs) / len(rs) for arm, rs in runs.items()}


def run_arms(doc: str, arms: tuple[str, ...], timed: Callable[..., dict], argv: list[str] | None) -> dict[str, Any]:
    """The command line of `doc` parsed, its model loaded once, and `timed(cfg, game, model, tokenizer, arm)`
    run for every arm alternated (`alternated`): {"matmul_gflops_bf16", "seconds" (each arm's mean), "speedup"
    (the first arm's mean over the second's, the old way over the new), "runs"}."""
    from sepo.profiling import matmul_gflops, time_model_forwards

    args = evaluation_parser(doc).parse_args(argv)
    cfg, game, model, tokenizer = load_for_evaluation(args)
    time_model_forwards(model)  # bills generate's forwards to prompt processing or decoding
    runs = alternated(arms, args.repeats, lambda arm: timed(cfg, game, model, tokenizer, arm))
    seconds = mean_of(runs, "seconds")
    return {
        "matmul_gflops_bf16": round(matmul_gflops(torch.bfloat16), 1),
        "seconds": seconds,
        "speedup": round(seconds[arms[0]] / seconds[arms[1]], 3),
        "runs": runs,
    }
