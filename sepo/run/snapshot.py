"""What a single run's dir held before this launch touched it.

Hydra creates the run dir, and writes its record (`.hydra/`) and log into it, before any of the project's
code runs, so before the run's lock is taken and its settings compared. A command line the project then
refuses (a bad value, a busy dir, other settings, a damaged record) should leave the disk as it found it:
the dir removed if this launch made it, a dir the user named with `hydra.run.dir` keeping every file it
held before, and the record of the run already there (finished, unfinished or still going) byte for
byte, or `.hydra/config.yaml` would describe a command that never ran. Only a snapshot taken before
Hydra's first write can tell, so a Hydra callback takes one when the run starts: `on_run_start` comes
before `run_job` makes the dir and writes `.hydra/`, `on_job_start` after both. A sweep's in-process
jobs have no such moment (the launcher calls `run_job` directly); they put back the copy that the run's
owner keeps instead (`reuse.HYDRA_COPY`).

A refused launch writes the record back after Hydra's rewrite, so for that moment it is this launch's;
a run reads its own record only when it starts (`reuse.save_hydra_record`), after taking its lock.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sepo.files import directory_written_atomically

RECORD = ".hydra"  # Hydra's `output_subdir`

#: run dir -> the names it held before the launch (None: it did not exist); its ancestors -> existed
_entries: dict[Path, frozenset[str] | None] = {}
#: run dir -> its record's files before the launch, path -> (bytes, mtime in ns) (None: it had no record)
_records: dict[Path, dict[str, tuple[bytes, int]] | None] = {}


def take(run_dir: Path) -> None:
    forget()
    run_dir = Path(run_dir).absolute()
    record = run_dir / RECORD
    _records[run_dir] = _read(record) if record.is_dir() else None
    for path in (run_dir, *run_dir.parents):
        _entries[path] = frozenset(p.name for p in path.iterdir()) if path.is_dir() else None
        if path.is_dir():
            break


def forget() -> None:
    _entries.clear()
    _records.clear()


def _read(record: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(record)): (p.read_bytes(), p.stat().st_mtime_ns) for p in record.rglob("*") if p.is_file()
    }


def known(path: Path) -> bool:
    return Path(path).absolute() in _entries


def created_now(path: Path) -> bool:
    """Whether `path` did not exist before this launch (False when no snapshot covers it)."""
    path = Path(path).absolute()
    return path in _entries and _entries[path] is None


def entries_before(path: Path) -> frozenset[str]:
    return _entries.get(Path(path).absolute()) or frozenset()


def restore_record(run_dir: Path) -> bool:
    """Put `run_dir`'s `.hydra/` back as it was before this launch (files, bytes and times; none if it had
    none); False when no snapshot covers `run_dir`."""
    run_dir = Path(run_dir).absolute()
    if run_dir not in _records:
        return False
    files = _records[run_dir]
    if files is None:
        shutil.rmtree(run_dir / RECORD, ignore_errors=True)
        return True
    with directory_written_atomically(run_dir / RECORD, replace=True) as work:
        for name, (data, mtime) in files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_bytes(data)
            os.utime(work / name, ns=(mtime, mtime))
    return True


class RunDirSnapshot(Callback):
    """Takes the snapshot of a single run's dir (`python main.py ...` without -m, and each job of
    `+launch=local`, which is one)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            take(Path(OmegaConf.select(config, "hydra.run.dir")))
        except Exception:  # noqa: BLE001 (no snapshot: a refused launch then removes nothing it cannot tell)
            forget()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        forget()  # an earlier launch's snapshot in this process describes no job of this sweep
