"""What a single run's dir held before this launch touched it.

Hydra creates the run dir, and writes its record and log into it, before any of the project's code
runs. A command line the project then rejects (a bad value, a busy dir) should leave the disk as it
found it: the dir removed if this launch made it, but a dir the user named with `hydra.run.dir` keeping
every file it held before. Only a snapshot taken before Hydra's first write can tell the two apart,
so a Hydra callback takes one when the run starts (`on_run_start`, before the job's dir is made).
Sweeps never remove anything (a rejected job is marked FAILED and the sweep goes on), so they need none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

#: run dir -> the names it held before the launch (None: it did not exist); its ancestors -> existed
_entries: dict[Path, frozenset[str] | None] = {}


def take(run_dir: Path) -> None:
    run_dir = Path(run_dir).absolute()
    for path in (run_dir, *run_dir.parents):
        _entries[path] = frozenset(p.name for p in path.iterdir()) if path.is_dir() else None
        if path.is_dir():
            break


def known(path: Path) -> bool:
    return Path(path).absolute() in _entries


def created_now(path: Path) -> bool:
    """Whether `path` did not exist before this launch (False when no snapshot covers it)."""
    path = Path(path).absolute()
    return path in _entries and _entries[path] is None


def entries_before(path: Path) -> frozenset[str]:
    return _entries.get(Path(path).absolute()) or frozenset()


class RunDirSnapshot(Callback):
    """Takes the snapshot of a single run's dir (`python main.py ...` without -m)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            take(Path(OmegaConf.select(config, "hydra.run.dir")))
        except Exception:  # noqa: BLE001 (no snapshot: a rejected launch then removes nothing)
            pass
