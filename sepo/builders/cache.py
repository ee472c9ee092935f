"""Build a model directory once, atomically, and know when a cached one can be trusted.

Every built model (tiny from its config, smollm2 from its package) is an ordinary `save_pretrained`
directory under the cache, named `<model>-<12 hex digits of a hash of what it was built from>`. A
build is written to a temporary directory, loaded and run once there, and only then renamed into
place: concurrent runs never see half a build, and a build that cannot run (a config that makes a
model whose shapes disagree) is never cached for later runs to load. `sepo_build.json` records
every file's hash: a file cut or changed since the build makes the next run rebuild instead of
training on damaged weights.

A build holds a lock (`.locks/<build>.lock` in the cache) from before its temporary directory
exists until after it is gone, so a second run building the same model waits and reuses the
build, and a temporary directory whose lock is free was left by a build that died without
cleaning up (SIGKILL, the out-of-memory killer: 400-500 MB for smollm2). Every build removes
those, and no temporary directory of a build running now.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sepo.errors import ModelLoadError, one_line
from sepo.files import directory_written_atomically, move_aside

log = logging.getLogger(__name__)

BUILD_INFO = "sepo_build.json"
#: the cache's folder of build locks (their files stay: a free lock costs nothing)
LOCKS = ".locks"
#: a temporary or moved-aside directory of a build (`sepo.files`: `.<build>-<suffix>`), and its build
LEFTOVER = re.compile(r"\.(?P<build>[a-z0-9_]+-[0-9a-f]{12})-.+")


def cached_build(out: Path, build: Callable[[Path], dict[str, Any]], what: str, fix: str) -> Path:
    """`out` once it holds an intact build; otherwise `build(tmp)` writes the files into a fresh
    temporary directory (returning what to record about them), which is renamed to `out` once the
    model in it loads and runs. `fix` ends the one-line error when it does not (what to change)."""
    from sepo import distributed

    if distributed.rank() != 0:  # transformers writes weights on rank 0 only: wait for its build
        return wait_for_build(out, what)
    remove_stale_builds(out.parent)
    if reusable(out, what):
        return out
    with build_lock(out, what) as locked:
        if locked:
            remove_stale_builds(out.parent, held=out.name)
        if reusable(out, what):  # another process built it while this one waited
            return out
        with directory_written_atomically(out) as tmp:
            info = build(tmp)
            check_runs(tmp, what, fix)
            info["files"] = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    log.info("built %s in %s", what, out)
    return out


def reusable(out: Path, what: str) -> bool:
    """Whether `out` holds an intact build; a damaged one is moved out of the way."""
    if not out.exists():
        return False
    damage = build_damage(out)
    if damage is None:
        return True
    log.warning("the cached %s in %s is damaged (%s): rebuilding it", what, out, damage)
    discard(out)
    return False


def check_runs(directory: Path, what: str, fix: str) -> None:
    """Load the build the way every run loads it and score one chat prompt: a config whose model is
    built and saved without complaint can still fail its first forward pass (tiny with 3 query heads
    on 2 key/value heads), and a cached build would then fail every later run."""
    import torch
    from omegaconf import OmegaConf

    from sepo.models import load_pretrained

    try:
        model, tokenizer = load_pretrained(directory, OmegaConf.create({"dtype": "float32"}), device="cpu")
        empty = [name for name, p in model.named_parameters() if p.numel() == 0]
        if empty:
            raise ValueError(f"the weight {empty[0]} is empty")
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Which action?"}], tokenize=False, add_generation_prompt=True
        )
        with torch.inference_mode():
            logits = model(input_ids=tokenizer(prompt, return_tensors="pt").input_ids).logits
        if not torch.isfinite(logits).all():
            raise ValueError("its next-token scores are not finite")
    except Exception as err:  # noqa: BLE001 (whatever breaks the first run: the cache keeps nothing)
        raise ModelLoadError(
            f"the {what} built from this config does not load and run ({one_line(err)}), so nothing was cached; {fix}"
        ) from err


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_damage(out: Path) -> str | None:
    """What is wrong with a cached build (a file missing, cut or changed since it was built), or
    None. A build that recorded no file hashes cannot be checked, so it counts as damaged: rebuilding is cheap."""
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


def lock_path(cache_dir: Path, build: str) -> Path:
    return cache_dir / LOCKS / f"{build}.lock"


@contextlib.contextmanager
def build_lock(out: Path, what: str) -> Iterator[bool]:
    """Hold the lock of the build `out` for the block, waiting while another process builds it. Yields
    False where the file system has no locks (the build goes ahead; leftovers are then left alone)."""
    path = lock_path(out.parent, out.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            log.info("waiting for another process building the %s in %s", what, out)
            fcntl.flock(f, fcntl.LOCK_EX)
            locked = True
        except OSError as err:
            log.warning("no lock for building %s (%s): leftovers of dead builds stay", out, one_line(err))
            locked = False
        yield locked  # closing the file releases the lock, as does the death of the process


def lock_is_free(path: Path) -> bool:
    """Whether no live process holds the build lock at `path` (a missing one was never taken)."""
    if not path.exists():
        return True
    try:
        with path.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:  # held (BlockingIOError), or it cannot be told (no locks, read-only cache)
        return False
    return True


def remove_stale_builds(cache_dir: Path, held: str | None = None) -> list[Path]:
    """Remove the temporary and moved-aside directories of builds no live process holds the lock of
    (`held`: the build whose lock this process holds). A live build creates its directory after it
    takes the lock and removes it before it lets go, so one listed here while its lock is free is dead."""
    if not cache_dir.is_dir():
        return []
    removed = []
    for path in sorted(cache_dir.iterdir()):
        match = LEFTOVER.fullmatch(path.name)
        if match is None or not path.is_dir():
            continue
        build = match["build"]
        if build == held or lock_is_free(lock_path(cache_dir, build)):
            log.info("removing %s, left by a build that did not finish", path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


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
