"""One checkpoint's evaluation with the constrained fallback re-encoding whole prompts and asking after the cache.

    python -m benchmarks.speed.fallback_cache --model-path null [--model smollm2] [--game kuhn] [--threads 2]
                                              [--repeats 1] [model.cpu_workers=1] [overrides]

What `model.prefix_cache` buys the fallback (`LMPolicy._fallback`, `continued_next_token_logits` in
sepo/lm/prompt_cache.py): after an answer that does not parse, the question "State your final action" is
either encoded in padded rows that hold each row's whole prompt and answer again (arm `whole`, what a model
without the cache does), or after the generate call's own cache, which holds both already (arm `cached`).
`--model-path null` is the model before training (Base), whose answers ramble past the budget and nearly all
fall back: the case that costs. The test evaluation of the model's own `eval` settings, both arms alternated
`--repeats` times on one loaded model; `model.cpu_workers=1` keeps every section in this process, so each run
prints its sections' seconds. The two arms play the same answers; their forced actions agree up to near-ties
(the two passes sum in other orders). The last line is JSON.
"""

from __future__ import annotations

import json

from benchmarks.speed.checkpoint_evaluation import profiled_evaluation, run_arms

METRICS = ("parse_rate", "exploit_exact", "safety")


def timed_evaluation(cfg, game, model, tokenizer, cached: bool) -> dict:
    from sepo.stages.evaluate import evaluation_policy

    policy = evaluation_policy(cfg, model, tokenizer)
    if not cached:  # the fallback as without the cache: every question encoded with its whole prompt
        fallback = policy._fallback
        policy._fallback = lambda requests, answers, encoded=None, rows=(): fallback(requests, answers)
    seconds, sections, metrics = profiled_evaluation(cfg, game, policy, METRICS)
    return {
        "seconds": round(seconds, 1),
        "sections": {k: round(v, 1) for k, v in sorted(sections.seconds.items(), key=lambda kv: -kv[1])},
        "fallback_tokens": sections.tokens.get("fallback", 0),
        "metrics": metrics,
    }


def main(argv: list[str] | None = None) -> dict:
    out = run_arms(
        __doc__,
        ("whole", "cached"),
        lambda cfg, game, model, tokenizer, arm: timed_evaluation(cfg, game, model, tokenizer, arm == "cached"),
        argv,
    )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
