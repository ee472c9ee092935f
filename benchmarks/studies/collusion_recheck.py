"""Is a main job's collusion change real? Its SFT and SEPO checkpoints re-played on many collusive-pool episodes.

    python -m benchmarks.studies.collusion_recheck --root <main_job_seeds root>/main_job [--episodes 100] [--seed 777]

The main job measures collusion on 10 episodes against AlwaysC, a per-run SE of 0.07-0.10, so a seed's
SEPO - SFT difference is within noise of 0.1. This script finds every finished main job under `--root`
(`benchmarks/studies/main_job_seeds.py` writes one per seed), loads its merged SFT model and each SEPO checkpoint
(the adapter on that model), and plays each against the game's collusive pool only, `--episodes` episodes
on a game seed of their own (not the test episodes the job reported). Prints per seed SFT's and every
checkpoint's collusion with its SE over episodes, and the final checkpoint's change with the SE of the
difference; on IPD also where it happens: the share of episodes in which the agent defected on its
always-cooperating partner, round by round (`--by-round`). The last line is JSON:
{seed: {checkpoint: [collusion, se, [share by round]]}}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


def seed_of(run: Path) -> int:
    """A main job's seed, from its run dir's name (`seed_<seed>`)."""
    return int(run.name.rsplit("_", 1)[1])


def finished_runs(root: Path) -> list[Path]:
    """The run dirs of finished main jobs (a DONE marker beside a sepo/ phase), by seed."""
    runs = [marker.parent for marker in root.rglob("DONE") if (marker.parent / "sepo" / "checkpoints").is_dir()]
    return sorted(runs, key=seed_of)


def checkpoints(run: Path) -> list[str]:
    """The run's SEPO checkpoints, oldest first (the loop's own listing, which resume uses)."""
    from sepo.training.checkpoints import checkpoints_newest_first

    return [p.name for p in reversed(checkpoints_newest_first(run / "sepo"))]


def defection_by_round(per_episode: list[dict]) -> list[float]:
    """IPD: per round, the share of episodes in which the agent (the first of each action pair) defected."""
    rounds = max((len(e["actions"]) for e in per_episode), default=0)
    return [
        round(sum(e["actions"][t][0] == "DEFECT" for e in per_episode if len(e["actions"]) > t) / len(per_episode), 3)
        for t in range(rounds)
    ]


def recheck(run: Path, episodes: int, seed: int) -> dict[str, tuple[float, float, list[float]]]:
    """Collusion (and its SE) of the run's SFT model and of each SEPO checkpoint, on the collusive pool."""
    from omegaconf import OmegaConf
    from peft import PeftModel

    from sepo.builders import load_model_and_tokenizer
    from sepo.games import make_game
    from sepo.stages.evaluate import evaluate_policy, evaluation_policy

    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    game = make_game(cfg.game)
    pools = {"train": [], "exploit": [], "collusive": list(cfg.game.pools.collusive), "robust": []}
    merged_cfg = OmegaConf.merge(cfg.model, {"path": str(run / "sft" / "merged")})
    model, tokenizer = load_model_and_tokenizer(merged_cfg, cfg.paths.cache_dir)
    out = {}
    for name in ["sft", *checkpoints(run)]:
        agent = (
            model
            if name == "sft"
            else PeftModel.from_pretrained(model, run / "sepo" / "checkpoints" / name / "adapter")
        )
        policy = evaluation_policy(cfg, agent, tokenizer, model_cfg=merged_cfg)
        result = evaluate_policy(game, policy, pools, dict(cfg.lambdas.eval), episodes, seed, progress=False)
        by_round = defection_by_round(result["per_episode"]) if cfg.game.name == "ipd" else []
        out[name] = (result["metrics"]["collusion"], result["se"]["collusion"], by_round)
        if name != "sft":
            model = agent.unload()  # the bare SFT model again, for the next adapter
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="a main_job_seeds.py root (its main_job/ dir)")
    parser.add_argument("--episodes", type=int, default=100, help="episodes per collusive opponent")
    parser.add_argument("--seed", type=int, default=777, help="game seed of these episodes (not the test seed)")
    parser.add_argument("--seeds", type=int, nargs="*", help="only these main-job seeds (default: every one found)")
    parser.add_argument("--by-round", action="store_true", help="IPD: also print the defection share round by round")
    args = parser.parse_args()
    runs = [r for r in finished_runs(args.root) if not args.seeds or seed_of(r) in args.seeds]
    if not runs:
        print(f"error: no finished main job (DONE beside sepo/checkpoints) under {args.root}", file=sys.stderr)
        return 2
    table = {}
    for run in runs:
        seed = seed_of(run)
        table[seed] = rows = recheck(run, args.episodes, args.seed)
        final = rows[checkpoints(run)[-1]]
        delta, se = final[0] - rows["sft"][0], math.hypot(final[1], rows["sft"][1])
        print(
            f"seed {seed}: "
            + ", ".join(f"{name} {c:.3f} ± {s:.3f}" for name, (c, s, _) in rows.items())
            + f"; final - SFT {delta:+.3f} ± {se:.3f}",
            flush=True,
        )
        if args.by_round:
            for name, (_, _, by_round) in rows.items():
                print(f"  {name:>8} defected, by round: " + " ".join(f"{v:.2f}" for v in by_round), flush=True)
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
