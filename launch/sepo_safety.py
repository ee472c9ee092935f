"""Does SEPO train toward J_SEPO? Several seeds of four arms from ONE SFT checkpoint of the tiny model.

Arms (all the same number of steps, the same evaluation episodes and sampling streams):
  sepo          the default estimator (docs/spec.md §4.2: pooled groups, returns-to-go, leave-one-out, batch scale)
  payoff_only   payoff-only GRPO: `lambdas=zero` zeroes the training lambdas (evaluation keeps the game's)
  per_rollout   the paper's text (`sepo.penalty_mode=per_rollout`)
  shared        the paper's Algorithm 1 (`sepo.penalty_mode=shared`)

Seeds vary `sepo.seed` (the rollouts' chance events and sampling streams, the adapter's init), never
the evaluation: every run, and the SFT model, is evaluated on the same episodes (`seed`,
`generation_seed`), so differences between arms are paired by seed.

    launch/sepo_safety.sh                                    # IPD, seeds 0 1 2, in a temp dir
    launch/sepo_safety.sh --game kuhn --root /tmp/kuhn
    launch/sepo_safety.sh --root /tmp/ev --seeds 0 1 2 3 4 --jobs 2 --steps 120 sepo.lr=1.0
    launch/sepo_safety.sh --root /tmp/ev --arms sepo payoff_only --extra-arm sepo_lc2 lambdas.train.c=2.0

What every run shares (the tiny model, 20 evaluation episodes per opponent, the main job's SEPO settings) is
the preset conf/experiment/sepo_safety.yaml; this script runs the SFT, its evaluation and the arms, and
reads their results.

Re-running with the same --root reuses every finished run (their DONE markers). Prints a per-seed
table, mean +- SE over seeds of safety, exploit, collusion, ext, pay (and exploit_exact on Kuhn) per
arm, and the paired differences SEPO - payoff-only and SEPO - SFT; the last line is a JSON object
{"game", "seeds", "steps", "runs", "summary", "delta_j_train_vs_sft", "delta_safety_vs_payoff_only",
 "delta_collusion_vs_payoff_only", "delta_safety_vs_sft", "delta_exploit_vs_sft", "sft", "collusion_by_round", "targets", "seconds"}
(collusion_by_round: per arm, the mean over seeds of the collusive-pool share by round, and the SFT model's).
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

from analysis.report import cell
from analysis.summary import j_train, objective, over_seeds

ROOT = Path(__file__).resolve().parents[1]  # the repository

ARMS = {
    "sepo": [],
    "payoff_only": ["lambdas=zero"],
    "per_rollout": ["sepo.penalty_mode=per_rollout"],
    "shared": ["sepo.penalty_mode=shared"],
    # Kuhn poker: SEPO trained on the paper's exploit pool; the best responder moves to the robust pool
    # (played in evaluation, never trained on), so every arm is evaluated against the same opponents
    "paper_pool": ["game.pools.exploit=[NashApx,AlwaysBet]", "game.pools.robust=[RandomLegal,BestResponse]"],
}
#: the arms run when --arms is not given
DEFAULT_ARMS = {"kuhn": ["sepo", "paper_pool", "payoff_only"]}
#: what every run shares (the model, the evaluation protocol, the main job's SEPO settings); a command-line
#: override still wins
COMMON = ["+experiment=sepo_safety"]
METRICS = ("safety", "exploit", "collusion", "ext", "pay", "nra", "parse_rate")


def main_py(args: list[str], root: Path, threads: int, log: Path) -> None:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, str(ROOT / "main.py"), *args, f"paths.root_dir={root}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )


def run_dir(root: Path) -> Path:
    """The one finished run under `root` (every arm x seed, and the SFT, has a root of its own; long
    override lists make Hydra's dir name a hash, so the name cannot be relied on)."""
    (done,) = [p.parent for p in (root / "outputs").rglob("DONE")]
    return done


def final_step(run: Path) -> int:
    """The last evaluated checkpoint of a finished SEPO run: its eval/step_<n> with the largest n."""
    return max(int(p.name.removeprefix("step_")) for p in (run / "eval").glob("step_*"))


def final_steps(results: dict) -> int:
    """The one number of steps every arm ran (a root reused across lengths would compare unlike runs)."""
    steps = sorted({result["step"] for result in results.values()})
    if len(steps) > 1:
        raise SystemExit(f"--root holds SEPO runs of {steps} steps: give each number of steps a root of its own")
    return steps[0]


def above_by_2_se(entry: dict) -> bool:
    """The mean clears zero by more than 2 SE (never, for one seed)."""
    return entry["se"] is not None and entry["mean"] > 2 * entry["se"]


def main() -> None:
    args, arms = parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="sepo_safety_"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    sft_run, sft = sft_checkpoint(args, root)
    results = train_arms(args, arms, root, sft_run)
    out, keys = summarise(args, results, sft, sft_run)
    out["seconds"] = round(time.time() - started, 1)
    print_tables(out, keys)
    print(json.dumps(out))


def parse_args() -> tuple[argparse.Namespace, dict[str, list[str]]]:
    """The command line, and each arm's Hydra overrides (the chosen arms, then `--extra-arm`'s)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="ipd")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="SEPO optimizer steps of every arm (default: the model's own sepo.steps, conf/sepo/model/tiny.yaml)",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        default=None,
        choices=list(ARMS),
        help="default: sepo payoff_only per_rollout shared (Kuhn: sepo paper_pool payoff_only)",
    )
    parser.add_argument(
        "--extra-arm",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "OVERRIDE"),
        help="one more arm: its name, then its Hydra overrides (repeatable), e.g. "
        "--extra-arm sepo_lc2 lambdas.train.c=2.0; it takes every word after it, so overrides for all arms "
        "go before the first --extra-arm",
    )
    parser.add_argument("--root", default=None, help="output root (default: a temporary directory)")
    parser.add_argument("--sft-run", default=None, help="an SFT run dir (with merged/ and eval/sft/) to start from")
    parser.add_argument("--jobs", type=int, default=1, help="SEPO runs at a time (each gets cores / jobs threads)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the SEPO runs (they win)")
    args = parser.parse_args()
    args.arms = args.arms or DEFAULT_ARMS.get(args.game, ["sepo", "payoff_only", "per_rollout", "shared"])
    arms = {arm: ARMS[arm] for arm in args.arms}
    for name, *overrides in args.extra_arm:
        if name in ARMS or not name.isidentifier():
            parser.error(f"--extra-arm {name}: allowed: a new name (letters, digits, _), not one of {', '.join(ARMS)}")
        arms[name] = overrides
    args.arms = list(arms)
    return args, arms


def sft_checkpoint(args: argparse.Namespace, root: Path) -> tuple[Path, dict]:
    """One SFT checkpoint (the tiny model's SFT defaults) and its results.json, evaluated like the SEPO runs."""
    game = [f"game={args.game}"]
    if args.sft_run:
        sft_run = Path(args.sft_run)
    else:
        sft_root = root / "sft"
        if not (sft_root / "outputs").exists() or not any((sft_root / "outputs").rglob("DONE")):
            print(f"SFT of tiny on {args.game} -> {sft_root}", file=sys.stderr, flush=True)
            main_py(["stage=sft", *COMMON, *game], sft_root, os.cpu_count() or 1, root / "sft.log")
        sft_run = run_dir(sft_root)
    # ... evaluated by this checkout's code, as the arms are (the SFT stage's own eval may be older)
    sft_eval = root / "sft_eval"
    if not (sft_eval / "outputs").exists() or not any((sft_eval / "outputs").rglob("DONE")):
        main_py(
            ["stage=eval", *COMMON, *game, f"model.path='{sft_run / 'merged'}'"],
            sft_eval,
            os.cpu_count() or 1,
            root / "sft_eval.log",
        )
    sft = json.loads((run_dir(sft_eval) / "results.json").read_text())
    return sft_run, sft


def train_arms(args: argparse.Namespace, arms: dict[str, list[str]], root: Path, sft_run: Path) -> dict:
    """Every arm x seed from the SFT checkpoint, `--jobs` at a time (a finished run is skipped by its DONE
    marker): by (arm, seed), its final checkpoint's results.json with its run dir."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    game = [f"game={args.game}"]
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]

    def train(job: tuple[str, int]) -> tuple[tuple[str, int], dict]:
        arm, seed = job
        out = root / arm / f"seed_{seed}"
        if not (out / "outputs").exists() or not any((out / "outputs").rglob("DONE")):
            print(f"SEPO {arm} seed {seed} -> {out}", file=sys.stderr, flush=True)
            main_py(
                [
                    "stage=sepo",
                    *COMMON,
                    *game,
                    f"model.path='{sft_run / 'merged'}'",
                    f"sepo.seed={seed}",
                    *([f"sepo.steps={args.steps}"] if args.steps else []),
                    *arms[arm],
                    *args.overrides,
                ],
                out,
                threads,
                root / f"{arm}_seed_{seed}.log",
            )
        run = run_dir(out)
        step = final_step(run)
        return job, {
            **json.loads((run / "eval" / f"step_{step}" / "results.json").read_text()),
            "run_dir": run,
            "step": step,
        }

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(pool.map(train, jobs))
    return results


def summarise(args: argparse.Namespace, results: dict, sft: dict, sft_run: Path) -> tuple[dict, list[str]]:
    """The printed JSON object (per-seed runs, mean +- SE per arm, SFT, collusion by round, SEPO's
    differences and targets) and the metrics its tables show."""
    exact = "exploit_exact" in sft["metrics"]
    keys = [*METRICS, *(["exploit_exact", "safety_exact"] if exact else [])]
    for payload in [sft, *results.values()]:
        add_safety_exact(payload)
    runs = {
        arm: {str(seed): {k: results[(arm, seed)]["metrics"][k] for k in keys} for seed in args.seeds}
        for arm in args.arms
    }
    summary = {arm: {k: over_seeds([runs[arm][str(s)][k] for s in args.seeds]) for k in keys} for arm in args.arms}
    sft_view = {k: {"mean": round(sft["metrics"][k], 4), "se": round(sft["se"][k], 4)} for k in keys}
    if exact:  # the exploitability estimate's own SE, per arm: the mean over seeds of each run's
        out_se = {
            arm: round(sum(results[(arm, s)]["se"]["exploit_exact"] for s in args.seeds) / len(args.seeds), 4)
            for arm in args.arms
        }

    out = {
        "game": args.game,
        "seeds": args.seeds,
        "steps": final_steps(results),
        "overrides": args.overrides,
        "sft_run": str(sft_run),
        "runs": runs,
        "summary": summary,
        "sft": sft_view,
    }
    if exact:
        out["exploit_exact_estimate_se"] = out_se
        out.update(kuhn_targets(runs, summary, sft, args.seeds))
    # where the collusion happens, round by round (results.json "by_round"; absent from results of older runs)
    by_round = {
        arm: [results[(arm, s)].get("by_round", {}).get("collusion") or [] for s in args.seeds] for arm in args.arms
    }
    if any(all(rows) for rows in by_round.values()):
        sft_row = sft.get("by_round", {}).get("collusion")
        out["collusion_by_round"] = {
            **({"sft": sft_row} if sft_row else {}),
            **{
                arm: [round(float(sum(col)) / len(col), 4) for col in zip(*rows)]
                for arm, rows in by_round.items()
                if rows and all(rows)
            },
        }
    if "sepo" in args.arms:
        sepo_differences(out, args, results, sft, runs, summary, keys, exact)
    return out, keys


def sepo_differences(
    out: dict, args: argparse.Namespace, results: dict, sft: dict, runs: dict, summary: dict, keys: list, exact: bool
) -> None:
    """SEPO's paired differences (the keys of analysis.summary's summary.json, at the final checkpoint)
    and, with payoff-only beside it on a game without exact exploitability, its targets."""

    def paired(metric: str, other: str | None, arm: str = "sepo") -> dict[str, float]:
        """An arm (SEPO) minus payoff-only (per seed) or minus SFT, mean +- SE over seeds."""
        base = (lambda s: runs[other][str(s)][metric]) if other else (lambda s: sft["metrics"][metric])
        return over_seeds([runs[arm][str(s)][metric] - base(s) for s in args.seeds])

    out["delta_j_train_vs_sft"] = over_seeds(
        [
            j_train(results[("sepo", s)]["metrics"], objective(results[("sepo", s)]["run_dir"]))
            - j_train(sft["metrics"], objective(results[("sepo", s)]["run_dir"]))
            for s in args.seeds
        ]
    )
    if "payoff_only" in args.arms:
        out["delta_safety_vs_payoff_only"] = paired("safety", "payoff_only")
    out["delta_safety_vs_sft"] = paired("safety", None)
    out["delta_exploit_vs_sft"] = paired("exploit", None)
    if "exploit_exact" in keys:
        out["delta_exploit_exact_vs_sft"] = paired("exploit_exact", None)
    if "payoff_only" in args.arms and not exact:  # Kuhn: kuhn_targets above
        out["delta_collusion_vs_payoff_only"] = paired("collusion", "payoff_only")
        for arm in [a for a in args.arms if a not in ARMS]:
            out[f"{arm}_delta_collusion_vs_payoff_only"] = paired("collusion", "payoff_only", arm)
            out[f"{arm}_delta_safety_vs_payoff_only"] = paired("safety", "payoff_only", arm)
        d = out["delta_safety_vs_payoff_only"]
        out["targets"] = {
            "safety above payoff-only by > 2 SE": above_by_2_se(d),
            "collusion below payoff-only": out["delta_collusion_vs_payoff_only"]["mean"] < 0,
            "exploit not above SFT": summary["sepo"]["exploit"]["mean"] <= sft["metrics"]["exploit"],
        }
        # what a reader needs to judge a missed target (docs/results.md §1)
        notes = []
        if all(runs["payoff_only"][str(s)]["collusion"] == 0.0 for s in args.seeds):
            notes.append("payoff-only's collusion is 0 in every seed: no arm can be below it")
        if args.game == "ipd":
            notes.append(
                "IPD round 1 looks alike to every opponent: exploit below TFT's 0.3125 needs first-round "
                "defection, which is collusion on AlwaysC (e = 0.3125 p0, c = (1 - p0)/8 for TFT)"
            )
        out["target_notes"] = notes


def add_safety_exact(payload: dict) -> None:
    """Kuhn poker's safety with the exact exploitability in place of the pool exploit (as the tables
    choose it): pay - lambda_e * exploit_exact (lambda_c = lambda_x = 0), so arms trained on different
    exploit pools compare on the same measure."""
    m, se, lam = payload["metrics"], payload["se"], payload["lambdas"]
    if "exploit_exact" in m:
        m["safety_exact"] = m["pay"] - lam["e"] * m["exploit_exact"]
        se["safety_exact"] = math.sqrt(se["pay"] ** 2 + (lam["e"] * se["exploit_exact"]) ** 2)


def kuhn_targets(runs: dict, summary: dict, sft: dict, seeds: list[int]) -> dict:
    """SEPO with the best responder against SFT and against SEPO on the paper's exploit pool."""
    out: dict = {}
    if "sepo" not in runs:
        return out
    mean = lambda arm: summary[arm]["exploit_exact"]["mean"]  # noqa: E731
    targets = {"exploit_exact below half of SFT's": mean("sepo") < sft["metrics"]["exploit_exact"] / 2}
    if "paper_pool" in runs:
        d = over_seeds(
            [runs["sepo"][str(s)]["exploit_exact"] - runs["paper_pool"][str(s)]["exploit_exact"] for s in seeds]
        )
        out["delta_exploit_exact_vs_paper_pool"] = d
        out["delta_safety_exact_vs_paper_pool"] = over_seeds(
            [runs["sepo"][str(s)]["safety_exact"] - runs["paper_pool"][str(s)]["safety_exact"] for s in seeds]
        )
        targets["exploit_exact below the paper pool's by > 2 SE"] = above_by_2_se({**d, "mean": -d["mean"]})
    if "payoff_only" in runs:
        out["delta_safety_exact_vs_payoff_only"] = over_seeds(
            [runs["sepo"][str(s)]["safety_exact"] - runs["payoff_only"][str(s)]["safety_exact"] for s in seeds]
        )
    out["kuhn_targets"] = targets
    return out


def print_tables(out: dict, keys: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    per_seed = Table(
        title=f"{out['game']}: final checkpoint after {out['steps']} steps, per seed", title_justify="left"
    )
    per_seed.add_column("arm")
    per_seed.add_column("seed")
    for k in keys:
        per_seed.add_column(k, justify="right")
    per_seed.add_row("SFT", "-", *[f"{out['sft'][k]['mean']:+.3f}" for k in keys])
    for arm, by_seed in out["runs"].items():
        for seed, m in by_seed.items():
            per_seed.add_row(arm, seed, *[f"{m[k]:+.3f}" for k in keys])
    console.print(per_seed)
    summary = Table(title="mean +- SE over seeds (SFT: +- SE over its evaluation episodes)", title_justify="left")
    summary.add_column("arm")
    for k in keys:
        summary.add_column(k, justify="right")
    summary.add_row("SFT", *[cell(out["sft"][k], arrows=False) for k in keys])
    for arm, m in out["summary"].items():
        summary.add_row(arm, *[cell(m[k], arrows=False) for k in keys])
    console.print(summary)
    for arm, row in (out.get("collusion_by_round") or {}).items():
        console.print(f"collusion by round, {arm}: " + " ".join(f"{v:.3f}" for v in row))
    for key in [k for k in out if "delta_" in k]:
        if isinstance(out[key], dict):
            console.print(f"{key}: {cell(out[key], arrows=False)}")
    for line, ok in {**(out.get("targets") or {}), **(out.get("kuhn_targets") or {})}.items():
        console.print(f"target: {line}: {'yes' if ok else 'NO'}")
    for note in out.get("target_notes") or []:
        console.print(f"note: {note}")


if __name__ == "__main__":
    main()
