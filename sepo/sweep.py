"""Sweep bookkeeping: each job records how this launch ended for it; the sweep prints a summary.

Jobs may run in other processes (joblib, submitit), so the record is a file in the job's run dir
(`launch_status.json`), and the summary is read back from the sweep dir by a Hydra callback that
runs in the launching process. Only records written since the sweep started are counted.
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

log = logging.getLogger(__name__)

STATUS_FILE = "launch_status.json"


def record_status(run_dir: Path, status: str, detail: str = "") -> None:
    """status: done | failed | skipped (DONE already present, resume=auto); with the job's torch threads
    (sepo/threads.py), so a sweep's share of the cores can be checked afterwards."""
    import torch

    record = {"status": status, "detail": detail, "time": time.time(), "torch_threads": torch.get_num_threads()}
    (run_dir / STATUS_FILE).write_text(json.dumps(record) + "\n")


def summarise(sweep_dir: Path, since: float = 0.0) -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {"done": [], "failed": [], "skipped": []}
    for path in sorted(sweep_dir.rglob(STATUS_FILE)):
        record = json.loads(path.read_text())
        if record["time"] >= since:
            jobs.setdefault(record["status"], []).append(str(path.parent.relative_to(sweep_dir)))
    return jobs


#: failed jobs of the last sweep this process launched (None: no sweep); `sepo.cli` exits 1 when > 0
last_sweep_failures: int | None = None


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.started = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = summarise(sweep_dir, self.started - 1.0)
        counts = Counter({k: len(v) for k, v in jobs.items()})
        lines = [f"sweep {sweep_dir}: {counts['done']} done, {counts['failed']} failed, {counts['skipped']} skipped"]
        lines += [f"  FAILED {name} (see its FAILED file)" for name in jobs["failed"]]
        print("\n".join(lines), flush=True)
        (sweep_dir / "sweep_summary.json").write_text(json.dumps(jobs, indent=2) + "\n")
        global last_sweep_failures
        last_sweep_failures = counts["failed"]
