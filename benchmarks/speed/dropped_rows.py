"""One checkpoint's evaluation decoded by transformers' `generate` and with stopped rows leaving the batch.

    python -m benchmarks.speed.dropped_rows --model-path <sft run>/merged [--model smollm2] [--game kuhn]
                                            [--threads 2] [--repeats 1] [overrides]

What `model.drop_stopped_rows` buys (sepo/lm/row_dropping.py): the test evaluation of the model's own `eval`
settings (the played table's read, then the episodes), once with `generate`, which carries every stopped row to
the batch's last stop, and once with the model's own `drop_stopped_rows`, alternated `--repeats` times on the
same episodes and sampling streams, on one loaded model. Prints each run's seconds, the row-steps its decoding
ran (where the process decodes itself: `model.cpu_workers=1`), their ratios, and the metrics: the two sum floats
over batches of other sizes, so a sampled token that flips sends an episode elsewhere and their metrics differ as
two evaluations on nearby streams do. The last line is JSON.
"""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from benchmarks.speed.checkpoint_evaluation import mean_of, profiled_evaluation, run_arms

METRICS = ("parse_rate", "exploit_exact", "train_payoff", "safety")


def timed_evaluation(cfg, game, model, tokenizer, dropping: bool) -> dict:
    from sepo.stages.evaluate import evaluation_policy

    model_cfg = OmegaConf.merge(cfg.model, {"drop_stopped_rows": cfg.model.drop_stopped_rows if dropping else 0})
    policy = evaluation_policy(cfg, model, tokenizer, model_cfg=model_cfg)
    seconds, sections, metrics = profiled_evaluation(cfg, game, policy, METRICS)
    return {
        "seconds": round(seconds, 1),
        "decoding_seconds": round(sections.seconds.get("decoding", 0.0), 1),
        "decoded_row_steps": int(sections.tokens.get("decoding", 0)),
        "metrics": metrics,
    }


def main(argv: list[str] | None = None) -> dict:
    out = run_arms(
        __doc__,
        ("generate", "dropping"),
        lambda cfg, game, model, tokenizer, arm: timed_evaluation(cfg, game, model, tokenizer, arm == "dropping"),
        argv,
    )
    steps = mean_of(out["runs"], "decoded_row_steps")
    if steps["dropping"]:
        out["row_steps_ratio"] = round(steps["generate"] / steps["dropping"], 3)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
