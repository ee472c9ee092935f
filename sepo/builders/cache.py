"""Build a model directory once, atomically, and know when a cached one can be trusted.

Every built model (tiny from its config, smollm2 from its package) is an ordinary `save_pretrained`
directory under the cache, named after a hash of what it was built from. A build is written to a
temporary directory and renamed into place, so concurrent runs never see half a build and the loser
of a race discards its copy. `sepo_build.json` records every file's hash: a file cut or changed
since the build makes the next run rebuild instead of training on damaged weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sepo.errors import ModelLoadError
from sepo.files import directory_written_atomically, move_aside

log = logging.getLogger(__name__)

BUILD_INFO = "sepo_build.json"


def cached_build(out: Path, build: Callable[[Path], dict[str, Any]], what: str) -> Path:
    """`out` once it holds an intact build; otherwise `build(tmp)` writes the files into a fresh
    temporary directory (returning what to record about them) and it is renamed to `out`."""
    from sepo import distributed

    if distributed.rank() != 0:  # transformers writes weights on rank 0 only: wait for its build
        return wait_for_build(out, what)
    if (out / BUILD_INFO).exists():
        damage = build_damage(out)
        if damage is None:
            return out
        log.warning("the cached %s in %s is damaged (%s): rebuilding it", what, out, damage)
        discard(out)
    with directory_written_atomically(out) as tmp:
        info = build(tmp)
        info["files"] = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    log.info("built %s in %s", what, out)
    return out


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_damage(out: Path) -> str | None:
    """What is wrong with a cached build (a file missing, cut or changed since it was built), or
    None. A build of older code that recorded no file hashes counts as damaged: rebuilding is cheap."""
    try:
        files = json.loads((out / BUILD_INFO).read_text()).get("files")
    except (OSError, ValueError) as err:
        return f"unreadable {BUILD_INFO}: {type(err).__name__}"
    if not files:
        return "no file hashes recorded"
    for name, digest in files.items():
        if not (out / name).is_file():
            return f"{name} is missing"
        if sha256(out / name) != digest:
            return f"{name} differs from the build"
    return None


def discard(out: Path) -> None:
    """Move a damaged build out of the way (a run loading it at the same time sees the old dir or none)."""
    move_aside(out, "damaged")


def wait_for_build(out: Path, what: str, timeout_s: float = 900.0) -> Path:
    """Under data parallelism every process loads the model at the same point and rank 0 builds it."""
    from sepo import distributed

    started = time.time()
    while not (out / BUILD_INFO).exists():
        if time.time() - started > timeout_s:
            raise ModelLoadError(
                f"rank {distributed.rank()}: no {what} appeared in {out} within {timeout_s:.0f} s (rank 0 builds it)"
            )
        time.sleep(0.5)
    return out
