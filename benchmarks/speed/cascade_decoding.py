"""One checkpoint's evaluation decoded with SDPA and with cascade attention, side by side.

    python -m benchmarks.speed.cascade_decoding --model-path <sft run>/merged [--model smollm2] [--game kuhn]
                                                [--threads 2] [--repeats 1] [overrides]

What `model.cascade_attention` buys (sepo/lm/cascade_attention.py): the test evaluation of the model's own
`eval` settings (the played table's read, then the episodes), once with transformers' SDPA and once with the
decoding steps reading the rows' shared prefix once, alternated `--repeats` times on the same episodes and
sampling streams, on one loaded model. Prints each run's seconds, decoding seconds per decoded token, their
ratios, and the metrics: the two attend in different roundings, so a sampled token that flips sends an episode
elsewhere and their metrics differ as two evaluations on nearby streams do. The last line is JSON.
"""

from __future__ import annotations

import json

from benchmarks.speed.checkpoint_evaluation import mean_of, profiled_evaluation, run_arms

METRICS = ("parse_rate", "exploit_exact", "train_payoff", "safety")


def timed_evaluation(cfg, game, model, tokenizer, cascade: bool) -> dict:
    from sepo.lm.cascade_attention import use_cascade_attention
    from sepo.stages.evaluate import evaluation_policy

    use_cascade_attention(model) if cascade else model.set_attn_implementation("sdpa")
    policy = evaluation_policy(cfg, model, tokenizer)
    seconds, sections, metrics = profiled_evaluation(cfg, game, policy, METRICS)
    decoding, tokens = sections.seconds["decoding"], sections.tokens["decoding"]
    return {
        "seconds": round(seconds, 1),
        "decoding_seconds": round(decoding, 1),
        "decoding_ms_per_token": round(1e3 * decoding / max(tokens, 1), 3),
        "metrics": metrics,
    }


def main(argv: list[str] | None = None) -> dict:
    out = run_arms(
        __doc__,
        ("sdpa", "cascade"),
        lambda cfg, game, model, tokenizer, arm: timed_evaluation(cfg, game, model, tokenizer, arm == "cascade"),
        argv,
    )
    per_token = mean_of(out["runs"], "decoding_ms_per_token")
    out["decoding_speedup_per_token"] = round(per_token["sdpa"] / per_token["cascade"], 3)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
