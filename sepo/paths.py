"""Where the Hydra configs live, for a checkout and for an installed wheel alike.

In a checkout they sit in `conf/` beside the package (the layout of the design card); a wheel
carries the same files inside the package as `sepo/conf/` (pyproject maps the package `sepo.conf`
to `conf/`), so `pip install .` gives a `sepo` command that runs from any directory. A user's own
config directory is added with Hydra's `--config-dir DIR` (its groups extend or override these).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _conf_dir() -> Path:
    packaged = PACKAGE_DIR / "conf"
    return packaged if (packaged / "config.yaml").is_file() else PACKAGE_DIR.parent / "conf"


CONF_DIR = _conf_dir()


#: what a file system allows a name and a whole path, where it cannot say (Linux's)
NAME_MAX, PATH_MAX = 255, 4096
#: what a run dir adds below an output root: outputs/sweeps/<name>/<run name, at most 150 bytes>/seed_<seed>/...
RUN_DIR_ROOM = 512

#: the words a one-line error uses for what an output directory must be
OUTPUT_DIR_ALLOWED = f"a writable directory (or one that can be created), each name at most {NAME_MAX} bytes"


def can_hold_outputs(root: str | Path) -> bool:
    """Whether run dirs can be created under `root`: a file can actually be created (and is removed
    again) in its nearest existing ancestor, and the names it adds fit the file system. Permission bits
    are not enough: as root, os.access says yes to /proc, where nothing can be created."""
    path = Path(root).expanduser().absolute()
    if any(len(part.encode()) > NAME_MAX for part in path.parts) or len(str(path).encode()) > PATH_MAX - RUN_DIR_ROOM:
        return False
    try:
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
    except OSError:
        return False
    if existing is None or not existing.is_dir():
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".sepo-probe-", dir=existing)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True
