"""Writing files so that a reader never sees half of one.

A run is killed at any moment (SIGKILL, the out-of-memory killer, a full disk). A marker, a status
record or a results file that a kill cuts in half would be read later as a finished run with wrong
numbers, or crash the reader. So each is written beside its final name, flushed to disk, and then
renamed over it: the rename is atomic, and a reader sees the old file or the new one, never a part.
"""

from __future__ import annotations

import os
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
