"""A run dir is reused or resumed only when it ran with the settings asked for now.

Run dirs are named after their overrides, so a re-launched sweep finds its finished jobs and skips
them, and its unfinished ones and resumes them (`resume=auto`). But the same dir can be asked for with
other settings (`hydra.run.dir=D` and a different game, a changed default in conf/, `sft.lr` changed
after a crash), and skipping or resuming it then would report old results, or a half of each, under
new settings. So a run records its resolved settings when it starts (`run_settings.yaml`), and a
later launch of the same dir, finished or not, goes ahead only when its settings equal them, up to
the keys that cannot change results (`RESULT_NEUTRAL_KEYS`, and SEPO's settings in a stage that trains no
SEPO: `read_by`); otherwise it is refused with one line
naming the differing keys. A record that cannot be read (damaged, or not a mapping) stops the launch
too, in one line naming the file: what ran there is unknown. A run also keeps a copy of Hydra's own
record (`.hydra_finished/`, a name from when only finished runs kept one), taken when it starts: Hydra
rewrites `.hydra/` at every launch of the dir before the project can refuse it, and a launch that
cannot take a snapshot first (a sweep's in-process job) puts that copy back.

Paths under the output root are recorded relative to it (`${paths.root_dir}/...`), so a finished
sweep moved to another root is still the same sweep.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from sepo.files import DamagedFile, directory_written_atomically, read_settings, write_text_atomically
from sepo.trees import leaves

#: keys (and whole nodes) whose value cannot change a run's results: where outputs go (and the paths
#: derived from it), how progress and trackers are shown, whether to resume, test hooks, and how a CPU's
#: cores are used and passes laid out (prepacked weights give the same products bit for bit; forked workers, like
#: the thread count, which no run records, SFT's passes split by length, and decode steps replayed as CUDA graphs,
#: whose sliding windows hold their keys in ring order, and stopped rows leaving a decoding's batch move float
#: roundings only)
RESULT_NEUTRAL_KEYS = (
    "resume",
    "model.packed_linears",
    "model.cpu_workers",
    "model.decode_graphs",
    "model.drop_stopped_rows",
    "sft.pass_cost",
    "logger",
    "paths",
    "datagen.out_dir",
    "sft.data_dir",
    "eval.progress",
    "sepo.debug_kill_after_step",
    "sepo.debug_detect_anomaly",
    "sweep_name",
)
#: the stages that train with SEPO's machinery. Every other stage (datagen, sft, eval) reads nothing under `sepo`
#: but `sepo.seed`, which an evaluation writes into its results as the training seed; so retuning SEPO on one game
#: leaves the SFT models and evaluations it starts from reusable, instead of training them again
SEPO_STAGES = ("sepo", "pipeline", "exploiter")
SETTINGS = "run_settings.yaml"  # written when a run starts
HYDRA_COPY = ".hydra_finished"
ROOT_TOKEN = "${paths.root_dir}"


def is_neutral(key: str) -> bool:
    return any(key == n or key.startswith(n + ".") for n in RESULT_NEUTRAL_KEYS)


def read_by(key: str, stage: str) -> bool:
    """Whether a run of `stage` can read `key`: SEPO's settings only matter to a stage that trains with SEPO, and
    the exploiter's to the exploiter stage."""
    if key.startswith("exploiter."):
        return stage == "exploiter"
    return stage in SEPO_STAGES or not key.startswith("sepo.") or key == "sepo.seed"


def settings(cfg: DictConfig) -> dict[str, Any]:
    """The run's resolved settings, flattened, without the result-neutral keys and those its stage does not
    read; a path under the output root is written relative to it."""
    tree = OmegaConf.to_container(cfg, resolve=True)
    root = str(Path(tree["paths"]["root_dir"]).absolute())
    stage = cfg.stage.name
    return {k: relative_to_root(v, root) for k, v in leaves(tree).items() if not is_neutral(k) and read_by(k, stage)}


def relative_to_root(value: Any, root: str) -> Any:
    if isinstance(value, str) and root != "/" and (value == root or value.startswith(root + "/")):
        return ROOT_TOKEN + value[len(root) :]
    return value


def record_settings(out: Path, cfg: DictConfig) -> None:
    """What a later launch of this dir must match to reuse or resume it."""
    write_text_atomically(out / SETTINGS, yaml.safe_dump(settings(cfg), sort_keys=True))


class DamagedRecord(Exception):
    """A run's recorded settings cannot be read: what ran in the dir is unknown, so it is neither reused
    nor resumed (the message names the file and why)."""


def recorded_settings(out: Path) -> dict[str, Any] | None:
    """The settings a run in `out` started with; None when it recorded none (no run started there: a launch
    refused before any work records nothing). Raises DamagedRecord when the record cannot be read."""
    return read_record(out / SETTINGS) if (out / SETTINGS).exists() else None


def read_record(path: Path) -> dict[str, Any]:
    """A settings record, read as plain data only (`sepo.files.read_settings`)."""
    try:
        return read_settings(path)
    except DamagedFile as err:
        raise DamagedRecord(f"{path} is damaged ({err.why})") from None


def differences(out: Path, cfg: DictConfig, shipped: Callable[[], dict[str, Any]] | None = None) -> list[str] | None:
    """`key=recorded (now asked)` for each differing setting; None when the run recorded none.

    A key the record lacks was added after the run, and a new key's shipped default keeps what runs did before
    it (how every key is added here), so it differs only where it is now set otherwise: `shipped()` gives the
    settings the shipped config alone would give this run (its group choices, no overrides). A key the run's
    stage does not read is left out of both sides (a record written before `read_by` holds SEPO's settings
    for every stage)."""
    before = recorded_settings(out)
    if before is None:
        return None
    now = settings(cfg)
    stage = cfg.stage.name
    before = {k: v for k, v in before.items() if read_by(k, stage)}
    differing = [k for k in set(before) | set(now) if not is_neutral(k) and before.get(k) != now.get(k)]
    if shipped is not None and any(k not in before for k in differing):
        defaults = shipped()
        differing = [k for k in differing if k in before or k not in defaults or defaults[k] != now.get(k)]
    # the telling ones first: a config group's choice (`game.name`), then keys both runs have
    differing.sort(key=lambda k: (not k.endswith(".name"), not (k in before and k in now), k))
    return [f"{k}={before.get(k, '<absent>')!r} (now {now.get(k, '<absent>')!r})" for k in differing]


def describe(differing: list[str], limit: int = 5) -> str:
    return "; ".join(differing[:limit]) + (f" (and {len(differing) - limit} more)" if len(differing) > limit else "")


def save_hydra_record(out: Path) -> None:
    """The copy of Hydra's record of the launch that now owns `out`, taken when it starts (after its lock
    and its settings), so it exists for a run still going or one that died, not only a finished one."""
    if (out / ".hydra").is_dir():
        _mirror(out / ".hydra", out / HYDRA_COPY)


def restore_hydra_record(out: Path) -> bool:
    """Put back the run's own `.hydra/`, file for file (Hydra has just rewritten it for a launch that is
    not going ahead); False when the run kept no copy."""
    if not (out / HYDRA_COPY).is_dir():
        return False
    _mirror(out / HYDRA_COPY, out / ".hydra")
    return True


def _mirror(source: Path, target: Path) -> None:
    """`target` becomes a copy of `source` (contents and times) in one rename: a reader never sees a part."""
    with directory_written_atomically(target, replace=True) as work:
        shutil.copytree(source, work, dirs_exist_ok=True)
