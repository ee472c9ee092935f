"""Reuse a finished run only when it ran with the settings asked for now.

Run dirs are named after their overrides, so a re-launched sweep finds its finished jobs and skips
them (`resume=auto`). But the same dir can be asked for with other settings (`hydra.run.dir=D` and a
different game, or a changed default in conf/), and skipping it then would report old results under
new settings. So a run saves the settings it finished with (`finished_config.yaml`, resolved, beside
`DONE`) and a copy of Hydra's own record (`.hydra_finished/`); a later launch of the same dir is skipped
only when its settings equal them, up to the keys that cannot change results (`RESULT_NEUTRAL_KEYS`),
and is refused with one line naming the differing keys otherwise. Hydra rewrites `.hydra/` at every
launch, so the finished run's copy is put back either way.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from sepo.trees import leaves

#: keys (and whole nodes) whose value cannot change a run's results: where outputs go, how progress and
#: trackers are shown, whether to resume, and test hooks
RESULT_NEUTRAL_KEYS = ("resume", "logger", "paths", "eval.progress", "sepo.debug_kill_after_step", "sweep_name")
SAVED = "finished_config.yaml"
HYDRA_COPY = ".hydra_finished"


def settings(cfg: DictConfig) -> dict[str, Any]:
    """The run's resolved settings, flattened, without the result-neutral keys."""
    flat = leaves(OmegaConf.to_container(cfg, resolve=True))
    return {k: v for k, v in flat.items() if not any(k == n or k.startswith(n + ".") for n in RESULT_NEUTRAL_KEYS)}


def save_finished(out: Path, cfg: DictConfig) -> None:
    (out / SAVED).write_text(yaml.safe_dump(settings(cfg), sort_keys=True))
    if (out / ".hydra").is_dir():
        shutil.copytree(out / ".hydra", out / HYDRA_COPY, dirs_exist_ok=True)


def differences(out: Path, cfg: DictConfig) -> list[str] | None:
    """`key=finished (now asked)` for each differing setting; None when the run saved none (older runs)."""
    if not (out / SAVED).exists():
        return None
    before, now = yaml.safe_load((out / SAVED).read_text()) or {}, settings(cfg)
    differing = [k for k in set(before) | set(now) if before.get(k) != now.get(k)]
    # the telling ones first: a config group's choice (`game.name`), then keys both runs have
    differing.sort(key=lambda k: (not k.endswith(".name"), not (k in before and k in now), k))
    return [f"{k}={before.get(k, '<absent>')!r} (now {now.get(k, '<absent>')!r})" for k in differing]


def restore_hydra_record(out: Path) -> None:
    """Put back the finished run's `.hydra/` (Hydra has just rewritten it for this launch)."""
    if (out / HYDRA_COPY).is_dir():
        shutil.copytree(out / HYDRA_COPY, out / ".hydra", dirs_exist_ok=True)
