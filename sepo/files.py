"""Writing files so that a reader never sees half of one.

A run is killed at any moment (SIGKILL, the out-of-memory killer, a full disk). A marker, a status
record or a results file that a kill cuts in half would be read later as a finished run with wrong
numbers, or crash the reader. So each is written beside its final name, flushed to disk, and then
renamed over it: the rename is atomic, and a reader sees the old file or the new one, never a part.
A directory (a model build, a dataset, a checkpoint, the merged SFT model) is written the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def write_text_atomically(path: Path, text: str) -> None:
    """`path.write_text(text)`, all or nothing. On an error (e.g. ENOSPC) the temporary file is removed
    and the error raised; the file at `path`, if any, is unchanged."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def directory_written_atomically(final: Path, *, replace: bool = False, durable: bool = False) -> Iterator[Path]:
    """Yields an empty directory to write into; when the block ends without an error it is renamed to
    `final` in one step, so a reader sees no directory or a whole one. On an error nothing changes.

    - `replace`: an existing `final` is moved aside and deleted first (a re-run writing the same step);
      otherwise an existing `final` means another process finished the same work first, and its copy
      is kept (the same inputs give the same files).
    - `durable`: every file is flushed to disk before the rename (a checkpoint a resume depends on).

    The directory sits in a fresh hidden sibling of `final` (same file system, so the rename is atomic;
    a unique name, so two processes never write into one)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        work = staging / final.name
        work.mkdir()
        yield work
        if durable:
            for path in sorted(work.rglob("*")):
                if path.is_file():
                    with path.open("rb") as f:
                        os.fsync(f.fileno())
        if replace and final.exists():
            move_aside(final, "replaced")
        try:
            work.rename(final)
        except OSError:
            if replace or not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def move_aside(path: Path, why: str) -> None:
    """Rename `path` to a hidden sibling, then delete it: a reader sees the old directory or none."""
    aside = path.with_name(f".{path.name}-{why}-{time.time_ns()}")
    try:
        path.rename(aside)
    except OSError:
        return  # another process moved it first
    shutil.rmtree(aside, ignore_errors=True)
