"""How much of one seed's SEPO - SFT difference is the evaluation's own noise: the same two policies, read again.

    python -m benchmarks.studies.paired_noise --run <sepo run dir> [--checkpoint step_8] [--seeds 42 101 102 103]

A held-out seed's verdict is a difference of two evaluations, SEPO's checkpoint and its SFT model, on the same
episodes (same chance events, opponent streams and sampling streams). Across training seeds those differences
spread; whether that spread is the runs' own (training differs by seed) or the measurement's (a few episodes per
opponent) decides the remedy: more seeds and steps, or more episodes. This script takes one finished SEPO run
(`stage=sepo`, its `model.path` the SFT model), loads the SFT model and the checkpoint's adapter (folded into the
weights, as the loop's own evaluations play it), and evaluates both with the run's protocol (every pool,
`eval.episodes_per_opponent`, the evaluation lambdas) on each of `--seeds` as the test seed: independent sets of
episodes and streams, each shared by the two policies as the run's own evaluations share theirs. The SD over
those seeds of the paired difference is the measurement noise of one seed's verdict; beside it, the SD the two
evaluations' reported SEs would give if they were independent, sqrt(se_sepo^2 + se_sft^2): shared episodes and
streams correlate the two reads, so the first is at most the second. The run's own test seed reproduces its
results.json (printed beside it). The last line is JSON: {"per_seed": {seed: {metric: [sepo, sft]}}, "noise": ...}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

#: the metrics whose paired differences are compared (Kuhn poker adds its exact exploitability where read)
METRICS = ("exploit", "collusion", "safety", "pay")


def evaluations(run: Path, checkpoint: str, seeds: list[int]) -> dict[int, dict[str, dict]]:
    """seed -> {"sepo": result, "sft": result}: both policies evaluated with the run's protocol on that test seed."""
    from omegaconf import OmegaConf
    from peft import PeftModel

    from sepo.builders import load_model_and_tokenizer
    from sepo.games import make_game
    from sepo.models import adapter_folded
    from sepo.stages.evaluate import evaluate_with_protocol, evaluation_policy, played_table_of

    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    cfg.eval.progress = False
    game = make_game(cfg.game)
    sft_model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    out: dict[int, dict[str, dict]] = {seed: {} for seed in seeds}
    for name in ("sft", "sepo"):
        agent = (
            sft_model
            if name == "sft"
            else PeftModel.from_pretrained(sft_model, run / "checkpoints" / checkpoint / "adapter")
        )
        with adapter_folded(agent, name == "sepo"):
            for seed in seeds:
                cfg.seed = seed
                policy = evaluation_policy(cfg, agent, tokenizer)
                out[seed][name] = evaluate_with_protocol(cfg, game, policy, "test", played_table_of(game, policy, seed))
                print(f"seed {seed} {name}: " + metrics_line(out[seed][name]), flush=True)
    return out


def metrics_line(result: dict) -> str:
    m, se = result["metrics"], result["se"]
    return ", ".join(f"{k} {m[k]:.3f} ± {se[k]:.3f}" for k in (*METRICS, "exploit_exact") if k in m)


def noise(per_seed: dict[int, dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Per metric: the paired differences' mean and SD over the evaluation seeds, and the SD that the reads'
    own SEs would give independent reads (the root mean square over seeds of sqrt(se_sepo^2 + se_sft^2))."""
    out = {}
    metrics = [k for k in (*METRICS, "exploit_exact") if all(k in r["sepo"]["metrics"] for r in per_seed.values())]
    for k in metrics:
        diffs = [r["sepo"]["metrics"][k] - r["sft"]["metrics"][k] for r in per_seed.values()]
        independent = [r["sepo"]["se"][k] ** 2 + r["sft"]["se"][k] ** 2 for r in per_seed.values()]
        out[k] = {
            "mean_difference": round(statistics.mean(diffs), 4),
            "sd_over_seeds": round(statistics.stdev(diffs), 4) if len(diffs) > 1 else None,
            "sd_if_independent": round(math.sqrt(sum(independent) / len(independent)), 4),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a finished stage=sepo run dir")
    parser.add_argument("--checkpoint", default=None, help="checkpoints/<name> (default: the newest)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 101, 102, 103], help="test seeds to read on")
    args = parser.parse_args()
    from sepo.training.checkpoints import checkpoints_newest_first

    found = checkpoints_newest_first(args.run)
    if not (args.run / ".hydra" / "config.yaml").is_file() or not found:
        print(f"error: --run={args.run}: not a SEPO run dir with .hydra/ and checkpoints/", file=sys.stderr)
        return 2
    checkpoint = args.checkpoint or found[0].name
    per_seed = evaluations(args.run, checkpoint, args.seeds)
    own = args.run / "eval" / checkpoint / "results.json"
    if own.is_file():
        print(f"the run's own read of {checkpoint} (its test seed): " + metrics_line(json.loads(own.read_text())))
    result = {
        "run": str(args.run),
        "checkpoint": checkpoint,
        "per_seed": {
            str(seed): {k: [r["sepo"]["metrics"][k], r["sft"]["metrics"][k]] for k in METRICS}
            for seed, r in per_seed.items()
        },
        "noise": noise(per_seed),
    }
    for k, v in result["noise"].items():
        print(
            f"{k}: SEPO - SFT {v['mean_difference']:+.3f}, SD over seeds {v['sd_over_seeds']}, if independent {v['sd_if_independent']}"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
