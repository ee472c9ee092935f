"""Peak resident memory of the SEPO stage on every game, as a process, against a bound: the check of a
model's memory target.

    python -m benchmarks.speed.sepo_memory [--model smollm2] [--games ipd,kuhn,...] [--limit-gb 3]
                                     [--model-path-kuhn DIR ...] [--threads 2] [overrides]

Runs the real stage, `python main.py stage=sepo`, once per game in a process of its own, at the model's own
SEPO settings (those the launcher uses: `conf/model/<model>.yaml`) plus any Hydra overrides given, and
stops it right after its first step (`sepo.debug_kill_after_step=1` of a 2-step run, so the step is a
middle one: the KL after the update is measured too). The peak is the kernel's count for that process
(`ru_maxrss` from `wait4`): loading, Kuhn's best-response read, the rollouts, the reference pass and the
update, on top of whatever each phase left behind. Per-section peaks (`python -m benchmarks step`) say
where the memory goes, but each section starts from a trimmed heap, so they understate this figure.
With `model.cpu_workers` > 1 the rollouts and reads run in forked children beside the process, which the
kernel's count for one process leaves out; so the process tree's memory is sampled too, every
`--sample-s` seconds, as the sum of each process's proportional set size (PSS: a page the children share
with the parent counts once in all), and the peak reported is the larger of the two.

Without `--model-path-<game>` a game starts from the untrained build, whose rambling answers run to the
generation budget: the worst case for the rollouts' memory; an SFT'd model answers in ~20 tokens.
Prints, per game, the peak and whether it is within `--limit-gb` (decimal GB, as targets are written:
3 GB = 2.79 GiB). The last line is JSON: {game: {"peak_gib": ..., "within": ..., "seconds_per_step": ...}}.
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
from pathlib import Path

from analysis.collect import GAMES

ROOT = Path(__file__).resolve().parents[2]  # the repository
GIB = 1024**3
STEP_LINE = re.compile(r"step 1 .* ([0-9.]+) s")  # sepo.stages.sepo_loop.log_step's line


def stage_command(model: str, game: str, model_path: str | None, run_dir: str, overrides: list[str]) -> list[str]:
    """`main.py stage=sepo` for two steps that dies after the first, with no checkpoint evaluation."""
    command = [sys.executable, "main.py", "stage=sepo", f"model={model}", f"game={game}", "logger=none"]
    command += ["sepo.steps=2", "sepo.debug_kill_after_step=1", "sepo.checkpoint_steps=[]", f"hydra.run.dir={run_dir}"]
    return command + ([f"model.path='{Path(model_path).resolve()}'"] if model_path else []) + overrides


def first_step(
    model: str, game: str, model_path: str | None, threads: int, overrides: list[str], sample_s: float = 0.2
) -> dict:
    """One game's SEPO process up to the end of its first step: its peak memory and step time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    tree_peak = 0
    with tempfile.TemporaryDirectory(prefix=f"sepo_memory_{game}_") as run_dir:
        command = stage_command(model, game, model_path, run_dir, overrides)
        with open(Path(run_dir) / "stage.log", "w+") as log:
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                tree_peak = max(tree_peak, tree_pss_bytes(proc.pid))
                time.sleep(sample_s)
            proc.returncode = os.waitstatus_to_exitcode(status)
            log.seek(0)
            text = log.read()
    step = STEP_LINE.search(text)
    if step is None:  # it ended before its first step was logged: not the kill the command asks for
        tail = "\n".join(text.splitlines()[-5:])
        raise SystemExit(f"{game}: the SEPO stage ended (rc {proc.returncode}) before its first step:\n{tail}")
    process_gib = usage.ru_maxrss * 1024 / GIB  # ru_maxrss: KiB
    return {
        "peak_gib": max(process_gib, tree_peak / GIB),
        "process_peak_gib": process_gib,
        "tree_pss_peak_gib": tree_peak / GIB,
        "seconds_per_step": float(step.group(1)),
    }


def tree_pss_bytes(root: int) -> int:
    """The summed proportional set size of `root` and every process below it now (Linux; 0 elsewhere)."""
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):  # it ended between two reads
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--games", default=",".join(GAMES))
    parser.add_argument("--limit-gb", type=float, default=3.0, help="the bound, in decimal GB")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the stage (OMP_NUM_THREADS)")
    parser.add_argument("--sample-s", type=float, default=0.2, help="seconds between two samples of the tree's PSS")
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
        r = first_step(args.model, game, getattr(args, f"model_path_{game}"), args.threads, overrides, args.sample_s)
        results[game] = {**r, "peak_gib": round(r["peak_gib"], 3), "within": r["peak_gib"] <= limit_gib}
        print(
            f"{game:<8} peak {r['peak_gib']:.2f} GiB as a process (alone {r['process_peak_gib']:.2f}, with its "
            f"forked workers' PSS {r['tree_pss_peak_gib']:.2f}) "
            f"{'within' if results[game]['within'] else 'OVER'} {args.limit_gb:g} GB ({limit_gib:.2f} GiB); "
            f"{r['seconds_per_step']:.0f} s/step",
            file=sys.stderr,
            flush=True,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
