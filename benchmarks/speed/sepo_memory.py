"""Peak resident memory of a SEPO step on every game, against a bound: the check of a model's memory target.

    python -m benchmarks.speed.sepo_memory [--model smollm2] [--games ipd,kuhn,...] [--limit-gb 3]
                                     [--model-path-kuhn DIR ...] [--threads 2] [overrides]

Runs `python -m benchmarks step --steps 1` once per game, each in its own process (a peak is a process's),
at the model's own SEPO settings (those the launcher uses: `conf/model/<model>.yaml`) plus any Hydra
overrides given. The warm-up step of the bench is the heaviest: it adds Kuhn's best-response read. Without
`--model-path-<game>` a game starts from the untrained build, whose rambling answers run to the
generation budget: the worst case for the rollouts' memory; an SFT'd model answers in ~20 tokens.
Prints, per game, the highest section's peak and which section it was, and whether it is within
`--limit-gb` (decimal GB, as targets are written: 3 GB = 2.79 GiB). The last line is JSON:
{game: {"peak_gib": ..., "section": ..., "within": ..., "seconds_per_step": ...}}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from analysis.collect import GAMES

ROOT = Path(__file__).resolve().parents[2]  # the repository


GIB = 1024**3


def step_profile(model: str, game: str, model_path: str | None, threads: int, overrides: list[str]) -> dict:
    """One game's step profile (`python -m benchmarks step`'s JSON), from a process of its own."""
    command = [sys.executable, "-m", "benchmarks", "step", "--model", model, "--game", game, "--steps", "1"]
    command += ["--threads", str(threads)] + (["--model-path", model_path] if model_path else []) + overrides
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"python -m benchmarks step failed on {game} (rc {done.returncode}): {' '.join(command)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def verdict(profile: dict, limit_gib: float) -> dict:
    peaks = profile["peak_rss_gib"]
    section = max(peaks, key=peaks.get)
    return {
        "peak_gib": round(peaks[section], 3),
        "section": section,
        "within": peaks[section] <= limit_gib,
        "seconds_per_step": profile["seconds_per_step"],
        "decisions": profile["decisions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--games", default=",".join(GAMES))
    parser.add_argument("--limit-gb", type=float, default=3.0, help="the bound, in decimal GB")
    parser.add_argument("--threads", type=int, default=2)
    for game in GAMES:
        parser.add_argument(f"--model-path-{game}", default=None, help=f"a merged SFT model to start {game} from")
    args, overrides = parser.parse_known_args()
    games = [g.strip() for g in args.games.split(",") if g.strip()]
    unknown = sorted(set(games) - set(GAMES))
    if unknown:
        parser.error(f"--games: unknown {unknown}; allowed: {', '.join(GAMES)}")
    limit_gib = args.limit_gb * 1e9 / GIB
    results = {}
    for game in games:
        path = getattr(args, f"model_path_{game}")
        results[game] = verdict(step_profile(args.model, game, path, args.threads, overrides), limit_gib)
        r = results[game]
        print(
            f"{game:<8} peak {r['peak_gib']:.2f} GiB in {r['section']:<20} "
            f"{'within' if r['within'] else 'OVER'} {args.limit_gb:g} GB ({limit_gib:.2f} GiB); "
            f"{r['decisions']} decisions, {r['seconds_per_step']:.0f} s/step",
            file=sys.stderr,
            flush=True,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
