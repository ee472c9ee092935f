"""Does SEPO hold what it reaches? Every game's SEPO arm, run for longer, from tiny_paper's own SFT checkpoints.

    launch/stability.sh --from <root>/tiny_paper --root /tmp/stab [--steps 80] [--seeds 0,1,2]
        [--jobs 2] [overrides ...]          # e.g. sepo.lr_schedule=cosine

`launch/tiny_paper.sh` trains 40 SEPO steps; this runs the SEPO arm (the game's lambdas, no payoff-only)
of every game for `--steps` (default 80, twice that) with checkpoints at a quarter, half and three
quarters of the run, every run evaluated on the same test and validation episodes as tiny_paper's.
The SFT evaluations (results.json only, no weights) are copied from `--from` so that
`analysis.summary` pairs each run with its SFT model. It prints, per game, the `stability` block of
summary.json: safety at the checkpoint chosen on validation episodes and at the final one (mean and
SE over seeds), their per-seed difference, and whether the final checkpoint holds the chosen one's
safety (not below it by more than one SE of the difference). Re-running with the same --root reuses finished runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from analysis.report import cell
from launch.tiny_paper import GAMES, SFT_RUN_OF, preset_of, sft_model

ROOT = Path(__file__).resolve().parents[1]  # the repository
# tiny_paper's games, the SFT run each starts from, and its shared settings: this reruns its SEPO arm


def copy_sft_results(source: Path, root: Path) -> None:
    """The SFT rows of the tables: every results.json under sft/ and sft_eval/, with the run's DONE and .hydra."""
    for phase in ("sft", "sft_eval"):
        for results in (source / phase).rglob("results.json"):
            run = next(p for p in results.parents if (p / "DONE").exists())
            target = root / phase / run.relative_to(source / phase)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run / "DONE", target / "DONE")
            if (run / ".hydra").exists():
                shutil.copytree(run / ".hydra", target / ".hydra", dirs_exist_ok=True)
            destination = target / results.relative_to(run)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(results, destination)


def sweep(game: str, source: Path, root: Path, args: argparse.Namespace) -> list[str]:
    quarter = args.steps // 4
    return [
        sys.executable,
        "main.py",
        "-m",
        preset_of("tiny", game),  # the tiny paper preset (and the game's own where it has one)
        "+launch=local",
        f"hydra.launcher.n_jobs={args.jobs}",
        f"hydra.sweep.dir={root / f'sepo_{game}'}",
        "hydra.sweep.subdir=sepo_seed_${sepo.seed}",
        "stage=sepo",
        f"game={game}",
        f"lambdas={game}",
        f"model.path={sft_model(source, SFT_RUN_OF[game], '${sepo.seed}')}",  # each seed from its own seed's SFT
        f"sepo.seed={args.seeds}",
        f"sepo.steps={args.steps}",
        f"sepo.checkpoint_steps=[{quarter},{2 * quarter},{3 * quarter}]",
        *args.overrides,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, required=True, help="a finished tiny_paper root")
    parser.add_argument("--root", type=Path, required=True, help="where the runs and tables/summary.json go")
    parser.add_argument("--steps", type=int, default=80, help="SEPO steps of every run (tiny_paper: 40)")
    parser.add_argument("--seeds", default="0,1,2", help="sepo.seed values, comma separated")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each gets its share of the cores)")
    parser.add_argument("--games", default=",".join(GAMES))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. sepo.lr_schedule=cosine")
    args = parser.parse_args()
    source, root = args.source.resolve(), args.root.resolve()
    copy_sft_results(source, root)
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    for game in args.games.split(","):
        command = sweep(game, source, root, args)
        print("+ " + shlex.join(command), file=sys.stderr, flush=True)
        if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
            print(f"error: the {game} sweep had a failed job; see {root / f'sepo_{game}'}", file=sys.stderr)
            return 1
    out = root / "tables" / "summary.json"
    summary = subprocess.run([sys.executable, "-m", "analysis.summary", str(root), "--out", str(out)], cwd=ROOT)
    if summary.returncode != 0:
        return summary.returncode
    stability = {game: s["stability"] for game, s in json.loads(out.read_text()).items()}
    for game, s in stability.items():
        c, f, d = (cell(s[k], arrows=False) for k in ("chosen_safety", "final_safety", "final_minus_chosen"))
        print(f"{game:8s} chosen {c}  final {f}  final - chosen {d}  holds: {s['final_holds_chosen']}")
    print(json.dumps({"steps": args.steps, "overrides": args.overrides, "stability": stability}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
