"""Speed of this checkout against an older commit, measured alternately on one machine (issue 10).

    python -m benchmarks.speed.side_by_side --old /tmp/base --sft-run <SFT run dir of tiny on IPD> \
        [--what step main] [--rounds 2] [--steps 5] [--threads 0]

The machine this project is developed on is shared and noisy, so absolute seconds mean little:
each round runs the old checkout, then this one (the order alternates between rounds), and the
figure reported is the ratio new / old per round and its mean.

- `step`: SEPO seconds per step on `tiny` from one SFT checkpoint, with the setting both commits
  have (`sepo.penalty_mode=per_rollout sepo.rollouts_per_opponent=2 sepo.refresh_steps=1`, so every
  step draws fresh rollouts), read from the timestamps of the "step N" log lines (steps 2..N: the
  first step pays for the model load and warm-up).
- `main`: wall time of the main job (`python main.py`, the whole pipeline) from an empty root
  directory, so both build the tiny model and the data the same way.

Both checkouts run with this interpreter (the same venv). Last line: a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from sepo.metrics import mean_se

ROOT = Path(__file__).resolve().parents[2]  # the repository
STEP_SETTING = ["sepo.penalty_mode=per_rollout", "sepo.rollouts_per_opponent=2", "sepo.refresh_steps=1"]
STEP_LINE = re.compile(r"^\[([\d\- :,]+)\]\[sepo\.(?:sepo|stages\.sepo_loop)\]\[INFO\] - step (\d+) ")


def run(checkout: Path, args: list[str], root: Path, threads: int) -> float:
    env = {**os.environ, "WANDB_MODE": "offline"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "main.py", *args, f"paths.root_dir={root}"],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def step_seconds(checkout: Path, sft_run: Path, steps: int, threads: int) -> float:
    with tempfile.TemporaryDirectory(prefix="sbs_step_") as tmp:
        run(
            checkout,
            [
                "stage=sepo",
                "model=tiny",
                "game=ipd",
                "logger=none",
                f"model.path='{sft_run / 'merged'}'",
                *STEP_SETTING,
                f"sepo.steps={steps}",
                "sepo.checkpoint_steps=[]",
                "eval.episodes_per_opponent=1",
                "eval.progress=false",
            ],
            Path(tmp),
            threads,
        )
        log = next(Path(tmp).rglob("cli.log")).read_text().splitlines()
    stamps = {
        int(m.group(2)): datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f") for m in map(STEP_LINE.match, log) if m
    }
    return (stamps[steps] - stamps[1]).total_seconds() / (steps - 1)


def main_job_seconds(checkout: Path, threads: int) -> float:
    with tempfile.TemporaryDirectory(prefix="sbs_main_") as tmp:
        return run(checkout, ["logger=none"], Path(tmp), threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--old", required=True, help="a checkout of the older commit (e.g. git worktree add /tmp/base 0fe4f23)"
    )
    parser.add_argument("--sft-run", help="an SFT run dir of tiny on IPD (with merged/): needed by `step`")
    parser.add_argument("--what", nargs="+", default=["step", "main"], choices=("step", "main"))
    parser.add_argument("--rounds", type=int, default=2, help="old/new pairs, order alternating")
    parser.add_argument("--steps", type=int, default=5, help="SEPO steps per `step` run (>= 2)")
    parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for both (0: torch's default)")
    args = parser.parse_args()
    old, new = Path(args.old).resolve(), ROOT
    result: dict = {"old": str(old), "new": str(new), "threads": args.threads}
    for what in args.what:
        if what == "step" and not args.sft_run:
            parser.error("--what step needs --sft-run")
        measure = (
            (lambda c: step_seconds(c, Path(args.sft_run), args.steps, args.threads))
            if what == "step"
            else (lambda c: main_job_seconds(c, args.threads))
        )
        pairs = []
        for k in range(args.rounds):
            order = [("old", old), ("new", new)] if k % 2 == 0 else [("new", new), ("old", old)]
            seconds = {}
            for name, checkout in order:
                seconds[name] = measure(checkout)
                print(f"{what} round {k + 1} {name}: {seconds[name]:.2f} s", file=sys.stderr, flush=True)
            pairs.append(seconds)
        ratios = [p["new"] / p["old"] for p in pairs]
        m, se, _ = mean_se(ratios)
        shown = "n/a" if se is None else f"{se:.3f}"
        print(f"{what}: new/old = {m:.3f} +- {shown} over {len(ratios)} rounds", file=sys.stderr)
        result[what] = {
            "pairs": pairs,
            "ratios": [round(r, 3) for r in ratios],
            "ratio_mean": round(m, 3),
            "ratio_se": None if se is None else round(se, 3),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
