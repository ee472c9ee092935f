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
import signal
import tempfile
import threading
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
def files_written_atomically(*paths: Path) -> Iterator[list[Path]]:
    """Yields a temporary path beside each of `paths` (same directory, hence same file system) for the
    block to write; when it ends without an error each is flushed to disk and renamed over its final
    name, with Ctrl-C and SIGTERM held back until every rename is done, so a set of files that belong
    together (a figure's PNG and PDF) is all new or all old. On an error the temporary files are
    removed and nothing at `paths` changes."""
    finals = [Path(p) for p in paths]
    tmps = [p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in finals]
    try:
        yield tmps
        for tmp in tmps:
            with tmp.open("rb") as f:
                os.fsync(f.fileno())
        with signals_held_back():
            for tmp, final in zip(tmps, finals):
                os.replace(tmp, final)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def signals_held_back(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Signals that arrive inside the block are delivered when it ends: a few renames that belong
    together are not cut in two by Ctrl-C. Python runs signal handlers in the main thread only, so
    elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    before = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in signals}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in caught:
            signal.raise_signal(s)


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


class DamagedFile(Exception):
    """A file a run left cannot be read as what it should hold; `why` says what is wrong, for one line."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def why_unreadable(err: BaseException) -> str:
    """One line on why a file could not be decoded (a parser's own message can run over lines)."""
    import yaml

    if isinstance(err, RecursionError):
        return "nested too deeply to read"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}"
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        return err.problem + (f" at line {mark.line + 1}" if mark is not None else "")
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def read_settings(path: Path) -> dict:
    """A run's settings or Hydra config as plain data (`safe_load`: a tag that would build an object or run
    code is refused, never executed). A run writes a non-empty mapping, so anything else is damage."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
        raise DamagedFile(Path(path), why_unreadable(err)) from None
    if not isinstance(data, dict) or not data:
        held = "nothing" if data is None else f"a {type(data).__name__}"
        raise DamagedFile(Path(path), f"it holds {held}, not a mapping of settings")
    return data
