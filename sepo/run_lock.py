"""One launch at a time per run dir, and a trace of a launch that died without a marker.

Two launches writing one run dir (the same command started twice, or two commands naming the same
`hydra.run.dir`) would interleave checkpoints and results, and both would report success. So a launch
holds an exclusive `flock` on `<run dir>/.run.lock` while it owns the dir; a second launch is refused in
one line. The kernel drops the lock when its process dies, however it dies, so a stale lock never
blocks anyone. The file stays; a launch writes its name into it and clears it when it ends, however it
ends, unless it is killed: a dir whose lock is free, whose file still names an owner, and which holds
neither DONE nor FAILED was left by a process that was killed without a chance to write a marker (SIGKILL, the out-of-memory killer). The next launch says so in one line
and resumes; the tables read such a dir as failed ("died without a marker"), not as running. A sweep
that found one of its job dirs held waits at its end until the holder lets go (`wait_until_free`), and
reports the job as the holder left it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK = ".run.lock"


class RunDirBusy(Exception):
    """Another live launch holds the run dir."""


def _owner(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


def _describe(owner: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["time"])) if "time" in owner else "an unknown time"
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, started {when}"


def _finished(out: Path) -> bool:
    return (out / "DONE").exists() or (out / "FAILED").exists()


def died_without_marker(out: Path) -> str | None:
    """A description of the launch that left `out` unfinished without a marker, else None (the dir is
    finished, marked, never locked, or its owner is alive)."""
    path = out / LOCK
    if _finished(out) or not path.exists():
        return None
    owner = _owner(path)
    if not owner:
        return None
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # alive: a launch holds it now
        fcntl.flock(f, fcntl.LOCK_UN)
    return _describe(owner)


@contextlib.contextmanager
def hold(out: Path) -> Iterator[str | None]:
    """Own `out` for the `with` block. Yields a description of a previous launch that died there without
    a marker (None if none). Raises RunDirBusy, naming the owner, when a live launch holds it."""
    path = out / LOCK
    stale = died_without_marker(out)
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusy(f"{out} is in use by another launch ({_describe(_owner(path))})") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}))
            f.flush()
            yield stale
        finally:  # a launch that ends, however it ends, clears its name: only a killed one leaves it
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def holder(out: Path) -> str | None:
    """A description of the live launch that holds `out` now, else None."""
    path = out / LOCK
    if not path.exists():
        return None
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(_owner(path))
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def wait_until_free(out: Path) -> None:
    """Block until no launch holds `out` (at once when none does). A shared lock, dropped as soon as it
    is had: waiting takes nothing from the holder, and leaves the dir to whoever launches next."""
    path = out / LOCK
    if not path.exists():
        return
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        fcntl.flock(f, fcntl.LOCK_UN)
