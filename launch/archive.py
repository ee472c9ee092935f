"""A paper plan's finished runs, kept as small files that git can commit, so a plan that takes many sessions
resumes from what was committed and its tables can be rebuilt from the commit alone.

A run's summary is what `analysis.summary` and `analysis.tables` read of it: its marker, its recorded
settings and its evaluations (`SUMMARY_FILES`), a few hundred kB per run, never a model or a checkpoint. The
launcher keeps every finished run's summary as it finishes (`keep`) and, before the plan starts, puts the
summaries back into the run dirs that lack them (`restore`), so the sweep skips those jobs as finished. An SFT
run whose merged model a job still to run starts from is not put back: it trains again (same seed, same data).
Trained again on another machine it is another draw (machines differ in floating-point order: SmolLM2's Kuhn SFT
at `sft.seed=0` read `exploit_exact` 0.114 on one and 0.149 on another), so the archived runs that started from
the old draw no longer pair with it: `reads_alike` tells, and `forget` sends them back to be run again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the files of a run that the tables and the summary read; everything else (models, checkpoints, logs) stays out
SUMMARY_FILES = ("DONE", "run_settings.yaml", "results.json", "validation.json", "sft_metrics.json")
#: the evaluations of a run, by which a run trained again is compared with its archived finish
EVALUATION_FILES = ("results.json", "validation.json")


def finished_runs(root: Path) -> list[Path]:
    """The outermost dirs under `root` with a DONE marker (a pipeline's phases below it belong to it)."""
    runs: list[Path] = []
    for marker in sorted(root.rglob("DONE")):
        run = marker.parent
        if not any(run.is_relative_to(outer) for outer in runs):
            runs.append(run)
    return runs


def summary_files(run: Path) -> Iterable[Path]:
    return (path for path in sorted(run.rglob("*")) if path.name in SUMMARY_FILES and path.is_file())


def copy_summary(run: Path, target: Path) -> None:
    """`target` gets `run`'s summary files at the same relative paths; DONE last, so a copy cut short is not
    taken for a finished run."""
    files = list(summary_files(run))
    for path in sorted(files, key=lambda p: p.name == "DONE" and p.parent == run):
        destination = target / path.relative_to(run)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def same_marker(run: Path, copy: Path) -> bool:
    """Whether `copy` holds this very finish of `run`: both DONE markers carry the same time (copies keep it)."""
    return (copy / "DONE").is_file() and (copy / "DONE").stat().st_mtime == (run / "DONE").stat().st_mtime


def keep(out: Path, archive: Path) -> list[Path]:
    """Every finished run under `out` that the archive lacks, or holds from an earlier finish (an SFT trained
    again for its model), goes into it; returns their paths relative to `out`."""
    kept = []
    for run in finished_runs(out):
        relative = run.relative_to(out)
        if not same_marker(run, archive / relative):
            shutil.rmtree(archive / relative, ignore_errors=True)
            copy_summary(run, archive / relative)
            kept.append(relative)
    return kept


def restore(archive: Path, out: Path, models_needed: set[Path]) -> tuple[list[Path], list[Path]]:
    """(runs put back, runs left to train again): every archived run whose dir under `out` has no DONE is put
    back, except a run whose merged model (`<run>/merged`) is in `models_needed` and absent."""
    restored, retrained = [], []
    if not archive.is_dir():
        return restored, retrained
    for run in finished_runs(archive):
        relative = run.relative_to(archive)
        target = out / relative
        if (target / "DONE").is_file():
            continue
        if (target / "merged") in models_needed and not (target / "merged").is_dir():
            retrained.append(relative)
            continue
        copy_summary(run, target)
        restored.append(relative)
    return restored, retrained


def unmark_modelless(models_needed: set[Path]) -> list[Path]:
    """A run put back from the archive has a DONE but no weights; when a job still to run starts from its model,
    its DONE goes, so that the sweep trains it again instead of skipping it. Returns those runs."""
    unmarked = []
    for model in sorted(models_needed):
        run = model.parent
        if (run / "DONE").is_file() and not model.is_dir():
            (run / "DONE").unlink()
            unmarked.append(run)
    return unmarked


def evaluations(run: Path) -> dict[str, Any]:
    """{path under `run`: its metrics and their SEs} of every evaluation the run wrote."""
    return {
        str(path.relative_to(run)): {key: body.get(key) for key in ("metrics", "se")}
        for path in summary_files(run)
        if path.name in EVALUATION_FILES
        for body in [json.loads(path.read_text())]
    }


def reads_alike(run: Path, copy: Path) -> bool:
    """Whether `run`, trained again, evaluates exactly as its archived `copy` did: the same draw of its training."""
    return evaluations(run) == evaluations(copy)


def forget(run: Path, copy: Path) -> None:
    """A finished run that must run again: its DONE and summary leave its dir (`run`) and the archive (`copy`)."""
    for path in list(summary_files(run)):
        path.unlink()
    shutil.rmtree(copy, ignore_errors=True)
