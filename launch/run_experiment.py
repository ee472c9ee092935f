"""Run paper experiments as sweeps: `python main.py -m +experiment=<name> +launch=slurm`, then the tables.

    python -m launch.run_experiment paper_ipd [paper_kuhn ...] [--dry-run] [--launch slurm|submitit_local|local]
                                    [--no-tables] [hydra overrides, e.g. hydra.launcher.partition=gpu]

The shell scripts beside this file are one-line wrappers (one per paper table, `grid.sh` for all).
`--dry-run` prints every job of every sweep, one command line each, and submits nothing: each line,
run alone, is exactly that job (same run dir under outputs/sweeps/<sweep_name>/), so a single failed
cell can be re-run by hand. Jobs are expanded by Hydra's own sweeper code from the experiment's
`hydra.sweeper.params` and the command line, so the list is what `-m` would launch.

Resuming: run the same command again. Jobs whose run dir holds DONE are skipped (`resume=auto`), a
job that died mid-SEPO restarts from its last checkpoint, and SLURM requeues preempted jobs itself.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def experiment_jobs(experiment: str, launch: str, overrides: list[str]) -> tuple[str, list[list[str]]]:
    """(sweep_name, one override list per job) exactly as Hydra's basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sepo.run.compose import compose_config

    cfg = compose_config([f"+experiment={experiment}", f"+launch={launch}", *overrides], with_hydra=True)
    params = dict(cfg.hydra.sweeper.get("params") or {})
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    swept = [f"{k}={v}" for k, v in params.items() if k not in given]
    fixed = [f"+experiment={experiment}", f"+launch={launch}"]
    parsed = OverridesParser.create().parse_overrides([*swept, *overrides])
    jobs = [fixed + job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    return str(cfg.sweep_name), jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiments", nargs="+", help="conf/experiment presets, e.g. paper_ipd")
    parser.add_argument("--dry-run", action="store_true", help="print the jobs (one command line each); submit nothing")
    parser.add_argument(
        "--launch",
        default="slurm",
        choices=("slurm", "submitit_local", "local"),
        help="conf/launch preset (default slurm; submitit_local tries the SLURM code path here)",
    )
    parser.add_argument("--no-tables", action="store_true", help="skip `python -m analysis.tables` after each sweep")
    parser.add_argument("--tables-anyway", action="store_true", help="write the tables even when a job failed")
    args, overrides = parser.parse_known_args()
    overrides = [e for e in args.experiments if "=" in e] + overrides  # key=value words are Hydra overrides
    args.experiments = [e for e in args.experiments if "=" not in e]
    unknown = [e for e in args.experiments if not (ROOT / "conf" / "experiment" / f"{e}.yaml").exists()]
    if unknown:
        allowed = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
        parser.exit(2, f"error: experiment={unknown[0]} is not a known experiment; allowed: {', '.join(allowed)}\n")

    for experiment in args.experiments:
        sweep_name, jobs = experiment_jobs(experiment, args.launch, overrides)
        if args.dry_run:
            print(f"# {experiment}: {len(jobs)} job(s) -> outputs/sweeps/{sweep_name}", file=sys.stderr)
            for job in jobs:
                print(shlex.join(["python", "main.py", *job]))
            continue
        command = [sys.executable, "main.py", "-m", f"+experiment={experiment}", f"+launch={args.launch}", *overrides]
        print("+ " + shlex.join(command), file=sys.stderr, flush=True)
        code = subprocess.run(command, cwd=ROOT).returncode
        if code and not args.tables_anyway:
            print(
                f"error: sweep {sweep_name} exited {code} (failed jobs: outputs/sweeps/{sweep_name}/sweep_summary.json); "
                "tables not written (--tables-anyway writes them)",
                file=sys.stderr,
            )
            sys.exit(1)
        if not args.no_tables:
            code = subprocess.run(
                [sys.executable, "-m", "analysis.tables", f"outputs/sweeps/{sweep_name}"], cwd=ROOT
            ).returncode
            if code:
                sys.exit(code)


if __name__ == "__main__":
    main()
