"""One checkpoint's evaluation with its teacher-forced scoring as padded rows and as prefix trees, side by side.

    python -m benchmarks.speed.fallback_trees --model-path null [--model smollm2] [--game kuhn] [--threads 2]
                                              [--repeats 1] [model.cpu_workers=1] [overrides]

What `model.prefix_tree` buys an evaluation (sepo/lm/prefix_tree.py): the constrained fallback's question after
every answer that did not parse, and the read's exact scores, either in padded rows that encode each prompt
whole or in prefix trees that encode the rules, and a read's shared prompt, once. `--model-path null` is the
model before training (Base), whose answers ramble past the budget and nearly all fall back: the case that
costs. The test evaluation of the model's own `eval` settings, both arms alternated `--repeats` times on one
loaded model; `model.cpu_workers=1` keeps every section in this process, so each run prints its sections'
seconds. The forced actions agree up to near-ties (the two sum in other orders). The last line is JSON.
"""

from __future__ import annotations

import json
import time

from omegaconf import OmegaConf

from benchmarks.speed.checkpoint_evaluation import run_arms

METRICS = ("parse_rate", "exploit_exact", "safety")


def timed_evaluation(cfg, game, model, tokenizer, tree: bool) -> dict:
    from sepo.profiling import profiled
    from sepo.stages.evaluate import evaluate_with_protocol, evaluation_policy

    model_cfg = OmegaConf.merge(cfg.model, {"prefix_tree": tree})
    with profiled() as sections:
        started = time.perf_counter()
        result = evaluate_with_protocol(cfg, game, evaluation_policy(cfg, model, tokenizer, model_cfg=model_cfg))
        seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 1),
        "sections": {k: round(v, 1) for k, v in sorted(sections.seconds.items(), key=lambda kv: -kv[1])},
        "fallback_tokens": sections.tokens.get("fallback", 0),
        "metrics": {k: float(v) for k, v in result["metrics"].items() if k in METRICS},
    }


def main(argv: list[str] | None = None) -> dict:
    out = run_arms(
        __doc__,
        ("padded", "tree"),
        lambda cfg, game, model, tokenizer, arm: timed_evaluation(cfg, game, model, tokenizer, arm == "tree"),
        argv,
    )
    out["speedup"] = round(out["seconds"]["padded"] / out["seconds"]["tree"], 3)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
