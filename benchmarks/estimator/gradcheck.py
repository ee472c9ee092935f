"""The SEPO estimator's gradient check, `python -m benchmarks gradcheck`.

`gradcheck` runs docs/spec.md §4.4's gradient check (`benchmarks.estimator.finite_differences`): a parametric scripted IPD agent
through the training batch code, the mean estimated update of each term against finite differences
of the exact J, for the default estimator and the paper's variants.
"""

from __future__ import annotations

import argparse
import sys
import time

from sepo.run.compose import compose_config as compose

HELP = "docs/spec.md §4.4: the SEPO estimator's mean update vs finite differences of J"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=int, default=2000, help="rollout batches averaged per point and variant")
    p.add_argument("--burn-in", type=int, default=20, help="batches that only fill the running statistics first")


def run(args: argparse.Namespace) -> dict:
    """docs/spec.md §4.4: the estimator's mean update against finite differences of the exact J (benchmarks/estimator/finite_differences.py)."""
    from benchmarks.estimator.finite_differences import print_table, report

    started = time.perf_counter()
    result = report(
        lambda overrides: compose([*overrides, "logger=none"]),
        args.batches,
        args.burn_in,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print_table(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result
