"""Sweep bookkeeping: each job records how this launch ended for it; the sweep prints a summary.

Jobs may run in other processes (the local launcher's, submitit's), so the record is a file in the job's run dir
(`launch_status.json`), and the summary is read back from the sweep dir by a Hydra callback that
runs in the launching process: every job dir this sweep started, its record when this launch wrote one,
else its own markers, so a job killed before it could write anything counts as failed, not as absent.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sepo.files import write_text_atomically

log = logging.getLogger(__name__)

STATUS_FILE = "launch_status.json"


def record_status(run_dir: Path, status: str, detail: str = "") -> None:
    """status: done | failed | skipped (DONE already present, resume=auto); with the job's torch threads
    (sepo/threads.py), so a sweep's share of the cores can be checked afterwards. Written atomically: a
    kill mid-write leaves the previous record, never half of one."""
    import torch

    record = {"status": status, "detail": detail, "time": time.time(), "torch_threads": torch.get_num_threads()}
    write_text_atomically(run_dir / STATUS_FILE, json.dumps(record) + "\n")


def job_status(run_dir: Path, since: float) -> tuple[str, str]:
    """How this launch ended for one job: its status record when this launch wrote it, else its markers
    (a job killed before it could write either, e.g. its worker SIGKILLed, has none: failed)."""
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


def summarise(sweep_dir: Path, since: float = 0.0) -> dict[str, list[str]]:
    """done / failed / skipped: every job this sweep launched (its `.hydra/` record is written when the
    job starts), each read from its own run dir; failed entries carry their reason."""
    jobs: dict[str, list[str]] = {"done": [], "failed": [], "skipped": []}
    started = {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml") if p.stat().st_mtime >= since}
    # a status file in the sweep dir itself is no job's (a job's dir is always below it)
    recorded = {p.parent for p in sweep_dir.rglob(STATUS_FILE) if p.stat().st_mtime >= since and p.parent != sweep_dir}
    for run_dir in sorted(started | recorded):
        status, detail = job_status(run_dir, since)
        name = str(run_dir.relative_to(sweep_dir))
        jobs.setdefault(status, []).append(f"{name}: {detail}" if status == "failed" and detail else name)
    return jobs


#: failed jobs of the last sweep this process launched (None: no sweep, or its summary could not be made);
#: `sepo.cli` exits 1 when > 0, and when a sweep started but its summary never came
last_sweep_failures: int | None = None
sweep_started = False
#: jobs whose outcome no run dir of theirs can show (their dir was another launch's, or their command failed
#: before it started): "<run dir>: <why>", from the launcher (job processes) or the task (in-process jobs)
refused_jobs: list[str] = []


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.started = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global sweep_started, last_sweep_failures
        self.started = time.time()
        sweep_started, last_sweep_failures = True, None
        refused_jobs.clear()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = summarise(sweep_dir, self.started - 1.0)
        jobs["failed"] += [r.removeprefix(f"{sweep_dir}/") for r in refused_jobs]
        counts = Counter({k: len(v) for k, v in jobs.items()})
        lines = [f"sweep {sweep_dir}: {counts['done']} done, {counts['failed']} failed, {counts['skipped']} skipped"]
        lines += [f"  FAILED {name}" for name in jobs["failed"]]
        print("\n".join(lines), flush=True)
        global last_sweep_failures
        last_sweep_failures = counts["failed"]
        write_text_atomically(sweep_dir / "sweep_summary.json", json.dumps(jobs, indent=2) + "\n")
