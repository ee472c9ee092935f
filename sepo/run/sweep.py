"""Sweep bookkeeping: each job records how it ended; the sweep prints a summary and exits by it.

Jobs may run in other processes (the local launcher's, submitit's), so the record is a file in the job's
run dir (`launch_status.json`), read back by a Hydra callback in the launching process, with the dir's
markers where it is older than the sweep (a job killed before it could write anything counts as failed,
not as absent). The summary lists every job of the sweep exactly once, as one of:

- done: it ran to DONE; skipped: DONE already, with the same settings (`resume=auto`);
- failed: FAILED, or ended without a marker, with the first line of the reason;
- busy: another launch held its dir when the sweep reached it (the same sweep started twice, two sweeps
  sharing job dirs), so the sweep left it to that launch and touched nothing in it.

A job dir another launch still holds when the sweep's own jobs are over is waited for (Ctrl-C stops the
wait), and then reported as that launch left it: a job is one run, so its state, not which launch ran
it, is what the sweep's results are made of. The sweep succeeds (exit 0) when every job's dir then
holds DONE, whoever finished it: nothing failed, and every busy job was finished by its holder. Two
identical sweeps started together thus run each job once and both exit 0.

Which jobs are the sweep's: the run dirs its launcher gave them (in-process jobs register in
`on_job_start`, the local launcher registers its processes'); where neither can tell (submitit's jobs
start elsewhere), every job dir below the sweep dir written into since it started (its `.hydra/` or a
status record), and a busy one among them is reported by the record its holder left.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sepo import run_lock
from sepo.files import write_text_atomically

log = logging.getLogger(__name__)

STATUS_FILE = "launch_status.json"
#: the exit code of a job's own process (`+launch=local`) that found its run dir held by another launch and
#: touched nothing: sysexits.h's EX_TEMPFAIL ("try again later"), distinct from a failure (1) and bad input (2)
BUSY_EXIT = 75


def record_status(run_dir: Path, status: str, detail: str = "") -> None:
    """status: done | failed | skipped (DONE already present, resume=auto); with the job's torch threads
    (sepo/run/threads.py), so a sweep's share of the cores can be checked afterwards. Written atomically: a
    kill mid-write leaves the previous record, never half of one."""
    import torch

    record = {"status": status, "detail": detail, "time": time.time(), "torch_threads": torch.get_num_threads()}
    write_text_atomically(run_dir / STATUS_FILE, json.dumps(record) + "\n")


def job_status(run_dir: Path, since: float) -> tuple[str, str]:
    """How one job ended: its status record when written since the sweep started (by the sweep, or by a
    launch that held the dir after it), else its markers (a job killed before it could write either, e.g.
    its worker SIGKILLed, has none: failed)."""
    path = run_dir / STATUS_FILE
    if path.exists():
        try:
            record = json.loads(path.read_text())
            if record["time"] >= since:
                return str(record["status"]), str(record.get("detail") or "")
        except (OSError, ValueError, KeyError, TypeError) as err:
            return "failed", f"unreadable {STATUS_FILE}: {type(err).__name__}"
    if (run_dir / "FAILED").exists():
        lines = (run_dir / "FAILED").read_text(errors="replace").strip().splitlines()
        return "failed", lines[0] if lines else "FAILED"
    if (run_dir / "DONE").exists():
        return "done", ""
    return "failed", "ended without a marker (killed?)"


def scanned_jobs(sweep_dir: Path, since: float) -> set[Path]:
    """The job dirs below `sweep_dir` written into since `since` (a job's `.hydra/` is written when it starts,
    its status record when it ends)."""
    started = {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml") if p.stat().st_mtime >= since}
    # a status file in the sweep dir itself is no job's (a job's dir is always below it)
    recorded = {p.parent for p in sweep_dir.rglob(STATUS_FILE) if p.stat().st_mtime >= since and p.parent != sweep_dir}
    return started | recorded


def wait_for_holders(runs: set[Path]) -> dict[Path, str]:
    """Wait until no other launch holds any of `runs`; those still held when Ctrl-C stopped the wait, with
    their holders."""
    held = {run: who for run in runs if (who := run_lock.holder(run))}
    if not held:
        return {}
    print(
        f"waiting for {len(held)} job(s) another launch holds (Ctrl-C stops waiting): "
        + "; ".join(f"{run} ({who})" for run, who in sorted(held.items())),
        file=sys.stderr,
        flush=True,
    )
    try:
        for run in sorted(held):
            run_lock.wait_until_free(run)
    except KeyboardInterrupt:
        pass
    return {run: who for run in held if (who := run_lock.holder(run))}


def busy_outcome(run_dir: Path, holder: str | None) -> tuple[bool, str]:
    """(whether it is finished, how the launch that held it left it)."""
    if holder:
        return False, f"held by another launch ({holder}), still going; re-run this sweep once it ends"
    if (run_dir / "DONE").exists():
        return True, "held by another launch, which finished it (DONE)"
    if (run_dir / "FAILED").exists():
        lines = (run_dir / "FAILED").read_text(errors="replace").strip().splitlines()
        return False, f"held by another launch, which left it FAILED: {lines[0] if lines else ''}"
    return False, "held by another launch, which ended without a marker"


def summarise(
    runs: set[Path], sweep_dir: Path, since: float, busy: set[Path] = frozenset(), held: dict[Path, str] | None = None
) -> tuple[dict[str, list[str]], int]:
    """done / failed / skipped / busy, each job once by the name of its dir below `sweep_dir` (failed and
    busy ones with why), and how many jobs are not finished (failed, or busy and not DONE)."""
    jobs: dict[str, list[str]] = {"done": [], "failed": [], "skipped": [], "busy": []}
    unfinished = 0
    for run_dir in sorted(runs):
        name = str(run_dir.relative_to(sweep_dir)) if run_dir.is_relative_to(sweep_dir) else str(run_dir)
        if run_dir in busy:
            finished, detail = busy_outcome(run_dir, (held or {}).get(run_dir))
            jobs["busy"].append(f"{name}: {detail}")
            unfinished += not finished
            continue
        status, detail = job_status(run_dir, since)
        status = status if status in ("done", "skipped") else "failed"
        jobs[status].append(f"{name}: {detail}" if status == "failed" and detail else name)
        unfinished += status == "failed"
    return jobs, unfinished


def summary_lines(sweep_dir: str, jobs: dict[str, list[str]]) -> list[str]:
    counts = {k: len(v) for k, v in jobs.items()}
    busy = f", {counts['busy']} busy" if counts["busy"] else ""
    head = f"sweep {sweep_dir}: {counts['done']} done, {counts['failed']} failed, {counts['skipped']} skipped{busy}"
    return [head, *(f"  FAILED {name}" for name in jobs["failed"]), *(f"  BUSY {name}" for name in jobs["busy"])]


#: jobs of the last sweep this process launched that are not finished (None: no sweep, or its summary could
#: not be made); `sepo.run.cli` exits 1 when > 0, and when a sweep started but its summary never came
last_sweep_failures: int | None = None
sweep_started = False
#: the run dirs this launch gave its jobs: in-process jobs (`on_job_start`) and the local launcher's processes
launched_jobs: set[Path] = set()
#: run dir -> why this launch left it alone: another launch held it (from the task, in-process jobs, or the
#: local launcher, from a job process's BUSY_EXIT)
busy_jobs: dict[Path, str] = {}


def absolute(path: Path | str) -> Path:
    return Path(os.path.abspath(path))


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.started = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global sweep_started, last_sweep_failures
        self.started = time.time()
        sweep_started, last_sweep_failures = True, None
        launched_jobs.clear()
        busy_jobs.clear()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        launched_jobs.add(absolute(config.hydra.runtime.output_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global last_sweep_failures
        sweep_dir = absolute(config.hydra.sweep.dir)
        since = self.started - 1.0
        runs = {*launched_jobs, *busy_jobs} or scanned_jobs(sweep_dir, since)
        held = wait_for_holders(runs)
        jobs, unfinished = summarise(runs, sweep_dir, since, set(busy_jobs), held)
        print("\n".join(summary_lines(str(config.hydra.sweep.dir), jobs)), flush=True)
        write_text_atomically(sweep_dir / "sweep_summary.json", json.dumps(jobs, indent=2) + "\n")
        last_sweep_failures = unfinished
