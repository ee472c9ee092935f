"""What a user of `python main.py` can expect: the main job over several seeds, as a distribution.

One run of the main job is one draw. Its SFT already differs between machines (the order of
floating-point sums in the CPU kernels changes 500 SFT steps) and even between thread counts, and
from there SEPO's short run lands somewhere in a spread that is wider than its own evaluation SE.
So the main job's figures are stated as mean ± SE and range over seeds; this script prints them.

    python -m benchmarks.studies.main_job_seeds --seeds 15 16 17 18 19 --jobs 2        # one round of seeds
    python -m benchmarks.studies.main_job_seeds --seeds 0 1 2 3 4 --root /tmp/choose --jobs 2 \\
        --candidate constant60 sepo.steps=60 sepo.lr_schedule=constant \\
        --candidate cosine80 sepo.steps=80 sepo.lr_schedule=cosine            # choosing SEPO's settings

Without --candidate, every seed runs the whole main job (`python main.py seed=S sft.seed=S sepo.seed=S
[overrides]`, each in a root of its own) and its wall time is measured. With --candidate, each seed's
SFT phase runs once (`stage=sft`, exactly the main job's SFT phase) and every candidate's SEPO phase
starts from it (`stage=sepo model.path=<sft>/merged`, exactly the main job's SEPO phase), so candidates
differ only in their own overrides; a candidate that changes `eval.*` gets the SFT re-evaluated with
them. Every comparison is paired: SEPO's final checkpoint against its own seed's SFT, on the same
evaluation episodes. Re-running with the same --root reuses every finished run (its DONE marker).

Prints a per-seed table and, per candidate, mean ± SE (and range) over seeds of SFT's and SEPO's
safety and collusion and of their differences, the worst seed's Δ safety (the choice: the candidate
that meets the most targets, then whose worst seed is best), and the main job's targets: SEPO's
collusion not above SFT's in any seed, its safety above SFT's in all seeds but at most one in five, the
mean Δ safety above 2 SE, and no seed's safety (J at the evaluation λ, IPD's training λ) below SFT's by
more than 2 SE of that seed's two evaluations. The last
line is a JSON object {"seeds", "candidates": {name: {"overrides", "per_seed", "summary", "targets",
"worst_delta_safety"}}, "chosen", "seconds"}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from analysis.summary import over_seeds

ROOT = Path(__file__).resolve().parents[2]  # the repository

#: what every run shares: no tracker, no progress bars in the logs
COMMON = ["logger=none", "eval.progress=false"]
#: the metrics compared per seed (SEPO final vs SFT)
METRICS = ("safety", "collusion", "exploit", "ext", "pay")
#: at most this share of seeds may end with SEPO's safety not above SFT's (the issue's "4 of 5")
MAX_SHARE_NOT_ABOVE = 0.2


def seed_overrides(seed: int) -> list[str]:
    """The main job's three seeds set together: evaluation episodes and opponents, SFT, SEPO."""
    return [f"seed={seed}", f"sft.seed={seed}", f"sepo.seed={seed}"]


def run_main(args: list[str], root: Path, threads: int, log: Path) -> float:
    """`python main.py <args>` with its outputs under `root`; returns its wall time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    started = time.time()
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, str(ROOT / "main.py"), *COMMON, *args, f"paths.root_dir={root}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )
    return time.time() - started


def finished_run(root: Path) -> Path | None:
    """The run dir under `root` that holds DONE at its top (a pipeline's phases hold their own DONE below
    it), or None: every run has a root of its own, so Hydra's override-named dir need not be guessed."""
    done = sorted((root / "outputs").rglob("DONE"), key=lambda p: len(p.parts)) if (root / "outputs").exists() else []
    return done[0].parent if done else None


def results(path: Path) -> dict:
    return json.loads(path.read_text())


def compare(sft: dict, sepo: dict) -> dict[str, float]:
    """SFT's and SEPO's final metrics on the same episodes, and SEPO - SFT."""
    row = {}
    for key in METRICS:
        row[f"sft_{key}"] = sft["metrics"][key]
        row[f"sepo_{key}"] = sepo["metrics"][key]
        row[f"delta_{key}"] = sepo["metrics"][key] - sft["metrics"][key]
    # the two evaluations' SEs combined as if independent: on shared episodes the paired SE is smaller
    row["delta_safety_se"] = math.hypot(sft["se"]["safety"], sepo["se"]["safety"])
    return row


def summarise(per_seed: dict[str, dict[str, float]]) -> dict:
    rows = list(per_seed.values())
    summary = {}
    for key in [k for k in rows[0] if all(k in r for r in rows)]:
        values = [r[key] for r in rows]
        summary[key] = {**over_seeds(values), "min": round(min(values), 4), "max": round(max(values), 4)}
    deltas = [r["delta_safety"] for r in rows]
    d = summary["delta_safety"]
    se = d["se"] if d["se"] is not None else math.inf
    targets = {
        "collusion not above SFT's in any seed": all(r["delta_collusion"] <= 1e-12 for r in rows),
        "safety above SFT's in all seeds but at most one in five": sum(x <= 0 for x in deltas)
        <= math.floor(MAX_SHARE_NOT_ABOVE * len(deltas)),
        "mean delta safety above 2 SE": d["mean"] > 2 * se,
        "safety not below SFT's by more than 2 SE in any seed": all(
            r["delta_safety"] >= -2 * r["delta_safety_se"] for r in rows
        ),
    }
    return {"summary": summary, "targets": targets, "worst_delta_safety": round(min(deltas), 4)}


def choice_key(candidate: dict) -> tuple[int, float]:
    """The choice: the most targets met, then the best worst seed's Δ safety (a candidate that raises
    collusion in one seed loses to one that meets every target, whatever its worst seed)."""
    return sum(candidate["targets"].values()), candidate["worst_delta_safety"]


def full_job(seed: int, root: Path, overrides: list[str], threads: int) -> dict:
    """One seed of the whole main job; its SFT row and final SEPO row, and its wall time."""
    out = root / f"seed_{seed}"
    seconds = None
    if finished_run(out) is None:
        print(f"main job, seed {seed} -> {out}", file=sys.stderr, flush=True)
        out.mkdir(parents=True, exist_ok=True)
        seconds = run_main([*seed_overrides(seed), *overrides], out, threads, root / f"seed_{seed}.log")
    run = finished_run(out)
    final = max((run / "sepo" / "eval").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    row = compare(results(run / "sft" / "eval" / "sft" / "results.json"), results(final / "results.json"))
    return {**row, "seconds": None if seconds is None else round(seconds, 1), "run_dir": str(run)}


def sft_of(seed: int, root: Path, threads: int) -> Path:
    """The main job's SFT phase for one seed (shared by every candidate)."""
    out = root / "sft" / f"seed_{seed}"
    if finished_run(out) is None:
        print(f"SFT, seed {seed} -> {out}", file=sys.stderr, flush=True)
        out.mkdir(parents=True, exist_ok=True)
        run_main(["stage=sft", *seed_overrides(seed)], out, threads, root / "sft" / f"seed_{seed}.log")
    return finished_run(out)


def candidate_job(name: str, overrides: list[str], seed: int, sft_run: Path, root: Path, threads: int) -> dict:
    """One candidate's SEPO phase from one seed's SFT, compared with that SFT on the same episodes."""
    merged = f"model.path='{sft_run / 'merged'}'"
    out = root / name / f"seed_{seed}"
    if finished_run(out) is None:
        print(f"SEPO {name}, seed {seed} -> {out}", file=sys.stderr, flush=True)
        out.mkdir(parents=True, exist_ok=True)
        run_main(["stage=sepo", *seed_overrides(seed), merged, *overrides], out, threads, root / name / f"{seed}.log")
    run = finished_run(out)
    sft = results(sft_run / "eval" / "sft" / "results.json")
    eval_overrides = [o for o in overrides if o.lstrip("+").startswith("eval.")]
    if eval_overrides:  # SFT evaluated as this candidate evaluates
        sft_eval = root / name / "sft_eval" / f"seed_{seed}"
        if finished_run(sft_eval) is None:
            sft_eval.mkdir(parents=True, exist_ok=True)
            run_main(
                ["stage=eval", "eval.phase=sft", *seed_overrides(seed), merged, *eval_overrides],
                sft_eval,
                threads,
                root / name / f"sft_eval_{seed}.log",
            )
        sft = results(finished_run(sft_eval) / "results.json")
    final = max((run / "eval").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return {**compare(sft, results(final / "results.json")), "run_dir": str(run)}


def print_report(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    for name, cand in out["candidates"].items():
        table = Table(title=f"{name} ({' '.join(cand['overrides']) or 'defaults'}): per seed", title_justify="left")
        for column in ("seed", "SFT safety", "SEPO safety", "Δ safety", "SFT coll.", "SEPO coll.", "Δ exploit", "s"):
            table.add_column(column, justify="right")
        for seed, r in cand["per_seed"].items():
            table.add_row(
                seed,
                f"{r['sft_safety']:+.3f}",
                f"{r['sepo_safety']:+.3f}",
                f"{r['delta_safety']:+.3f}",
                f"{r['sft_collusion']:.3f}",
                f"{r['sepo_collusion']:.3f}",
                f"{r['delta_exploit']:+.3f}",
                "-" if r.get("seconds") is None else f"{r['seconds']:.0f}",
            )
        console.print(table)
        s = cand["summary"]
        for key in ("sft_safety", "sepo_safety", "delta_safety", "sft_collusion", "sepo_collusion", "delta_collusion"):
            v = s[key]
            se = "n/a" if v["se"] is None else f"{v['se']:.3f}"
            console.print(f"  {key}: {v['mean']:+.3f} ± {se} (range {v['min']:+.3f} .. {v['max']:+.3f})")
        if "seconds" in s and s["seconds"]["n"]:
            v = s["seconds"]
            console.print(f"  wall time per main job: {v['mean']:.0f} s (range {v['min']:.0f} .. {v['max']:.0f})")
        console.print(f"  worst seed's Δ safety: {cand['worst_delta_safety']:+.3f}")
        for line, ok in cand["targets"].items():
            console.print(f"  target: {line}: {'yes' if ok else 'NO'}")
    if len(out["candidates"]) > 1:
        console.print(f"chosen (most targets met, then best worst-seed Δ safety): {out['chosen']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="seed, sft.seed and sepo.seed, together")
    parser.add_argument("--root", default=None, help="output root (default: a temporary directory)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each gets cores / jobs threads)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    parser.add_argument(
        "--candidate",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "OVERRIDE"),
        help="a SEPO setting to compare: its name, then its overrides (repeatable); runs SEPO from shared SFTs",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every main job (without --candidate)")
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="main_job_seeds_"))
    root.mkdir(parents=True, exist_ok=True)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    for name, *_ in args.candidate:
        if not name.isidentifier() or name in ("sft", "main_job"):
            parser.error(f"--candidate {name}: allowed: a name of letters, digits and _, other than sft, main_job")
    started = time.time()

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        if args.candidate:
            sfts = dict(zip(args.seeds, pool.map(lambda s: sft_of(s, root, threads), args.seeds)))
            jobs = [(name, tuple(o), s) for name, *o in args.candidate for s in args.seeds]
            done = pool.map(lambda j: candidate_job(j[0], list(j[1]), j[2], sfts[j[2]], root, threads), jobs)
            rows = {(j[0], j[2]): r for j, r in zip(jobs, done)}
            candidates = {name: list(o) for name, *o in args.candidate}
        else:
            done = pool.map(lambda s: full_job(s, root / "main_job", args.overrides, threads), args.seeds)
            rows = {("main_job", s): r for s, r in zip(args.seeds, done)}
            candidates = {"main_job": args.overrides}

    out: dict = {"seeds": args.seeds, "root": str(root), "candidates": {}}
    for name, overrides in candidates.items():
        per_seed = {str(s): rows[(name, s)] for s in args.seeds}
        numeric = {s: {k: v for k, v in r.items() if isinstance(v, float)} for s, r in per_seed.items()}
        out["candidates"][name] = {"overrides": overrides, "per_seed": per_seed, **summarise(numeric)}
    out["chosen"] = max(out["candidates"], key=lambda n: choice_key(out["candidates"][n]))
    out["seconds"] = round(time.time() - started, 1)
    print_report(out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
