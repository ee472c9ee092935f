"""The Hydra application behind `python main.py` and the `sepo` console script.

Before Hydra composes anything, config-group choices on the command line are checked against the
files in conf/, so `game=chess` ends with one line naming the allowed games instead of Hydra's
multi-line report.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


#: longest run-dir name kept verbatim; file systems allow 255 bytes per path component
MAX_RUN_NAME = 150


def _run_name(override_dirname: str) -> str:
    """Run-dir name from the overrides: `default` when there are none, `/` made path-safe.

    Long override lists are cut and suffixed with a hash of the whole list, so the name stays
    unique, stable across re-launches, and within the file system's limit.
    """
    name = override_dirname.replace("/", "_") or "default"
    if len(name.encode()) <= MAX_RUN_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return name.encode()[:MAX_RUN_NAME - 13].decode(errors="ignore") + "-" + digest


if not OmegaConf.has_resolver("run_name"):
    OmegaConf.register_new_resolver("run_name", _run_name)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_overrides(argv: list[str]) -> str | None:
    """The error line for the first unknown config-group option in `argv`, else None."""
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()} - {"local"}
    for arg in argv:
        if "=" not in arg or arg.startswith("hydra"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key not in groups:
            continue
        allowed = group_options(key)
        values = value.removeprefix("choice(").removesuffix(")").split(",")
        for v in (v.strip() for v in values):
            if v and v != "null" and v not in allowed:
                return f"error: {key}={v} is not a known {key}; allowed: {', '.join(allowed)}"
    return None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from sepo.task import run_task

    run_task(cfg)


def main() -> None:
    error = check_group_overrides(sys.argv[1:])
    if error:
        print(error, file=sys.stderr)
        sys.exit(2)
    _hydra_main()
