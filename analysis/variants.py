"""Which runs may share a table cell: those that differ only in their seeds.

A cell's mean ± SE over runs claims the runs are seeds of one setting. Runs of a λ sweep, an lr sweep
or an ablation in one directory are not, and averaging them would print a number no run measured. So
every run is identified by its settings (the `run_settings.yaml` a run records when it starts; Hydra's
saved config for a launch refused before it started), and within one (game, model, phase) the keys whose values
differ between runs name a **variant**: `λe=2.0`, `sepo.lr=0.001`. Each variant gets cells, rows, bars
and summary entries of its own; runs that differ in nothing else are seeds.

What counts as a setting (what can change the phase's results), and what does not:
- result-neutral keys (`sepo/reuse.py`: output paths, loggers, progress bars, resume) never do;
- seeds (any key `seed` or `*_seed`) are what a cell averages over;
- `stage.*` and `eval.phase` say which row a result fills, which the phase already says;
- keys a phase cannot have used: Base ignores `sft.*`, `sepo.*`, `datagen.*` and the training λ; SFT
  ignores `sepo.*` and the training λ;
- a run that starts from a trained checkpoint (`stage=sepo`, or `stage=eval` of an SFT model) did not
  use its own `sft.*` and `datagen.*`: where `model.path` points into a run dir with recorded settings,
  that run's `sft.*` and `datagen.*` stand in for them and the path itself is no setting (each seed's
  SEPO starts from its own seed's SFT); a checkpoint from elsewhere is identified by its path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sepo import penalties
from sepo.files import DamagedFile, read_settings
from sepo.reuse import ROOT_TOKEN, SETTINGS, is_neutral
from sepo.trees import leaves

#: say which table row a result fills (the phase column), not how it was produced
ROW_KEYS = ("stage", "eval.phase")
#: per phase, the config nodes it cannot have used
UNUSED = {
    "base": ("sft", "sepo", "datagen", "lambdas.train"),
    "sft": ("sepo", "lambdas.train"),
}
#: the nodes that made a trained checkpoint: a run loading one takes them from the run that trained it
TRAINED_BY = ("sft", "datagen")
#: short names in a variant's label (the rest keep their dotted key)
LABELS = {f"lambdas.train.{k}": f"λ{k}" for k in penalties.keys()} | {
    f"lambdas.eval.{k}": f"eval λ{k}" for k in penalties.keys()
}


def _under(key: str, nodes: tuple[str, ...]) -> bool:
    return any(key == n or key.startswith(n + ".") for n in nodes)


def is_seed(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last == "seed" or last.endswith("_seed")


def read_yaml(path: Path) -> dict[str, Any]:
    """A run's settings or Hydra config as plain data (`sepo.files.read_settings`)."""
    return read_settings(path)


def read_flat(path: Path) -> dict[str, Any]:
    """`read_yaml` with nested nodes as dotted keys (a record is flat already; Hydra's config is not)."""
    try:
        return leaves(read_yaml(path))
    except RecursionError:
        raise DamagedFile(path, "nested too deeply to read") from None


def recorded(run: Path, root: Path) -> dict[str, Any] | None:
    """The settings of the run that wrote `run` (a pipeline's phase dirs are its own): its record, else
    Hydra's saved config (a launch refused before the run started records only that; interpolations stay
    unresolved), else None. Raises DamagedFile when the file it should be read from cannot be."""
    for directory in (run, *run.parents):
        for path in (directory / SETTINGS, directory / ".hydra" / "config.yaml"):
            if path.is_file():
                return read_flat(path)
        if directory == root or directory == directory.parent:
            return None
    return None


def origin(path: str | None, run: Path, root: Path) -> dict[str, Any] | None:
    """The recorded settings of the run whose checkpoint `path` is (`<run>/merged`, `<run>/sft/merged`),
    or None. A path recorded relative to the output root is looked up under `run`'s ancestors."""
    if not isinstance(path, str) or not path:
        return None
    candidates = [Path(path)]
    if path.startswith(ROOT_TOKEN):
        rest = path[len(ROOT_TOKEN) :].lstrip("/")
        candidates = [a / rest for a in run.parents]
    for checkpoint in candidates:  # the checkpoint itself may be gone (a run's summary kept without its weights)
        for directory in list(checkpoint.parents)[:3]:
            if (directory / SETTINGS).is_file():
                return recorded(directory, directory)
    return None


def identity(settings: dict[str, Any], phase: str | None, parent: dict[str, Any] | None) -> dict[str, str]:
    """The settings that can change a phase's results, seeds aside, as comparable strings."""
    stage = settings.get("stage.name")
    own = dict(settings)
    if stage in ("sepo", "eval") and settings.get("model.path"):
        own = {k: v for k, v in own.items() if not _under(k, TRAINED_BY)}
        if parent is not None:
            own.pop("model.path")
            own |= {k: v for k, v in parent.items() if _under(k, TRAINED_BY)}
    unused = UNUSED.get(phase or "", ())
    return {
        k: json.dumps(v, sort_keys=True, default=str)
        for k, v in own.items()
        if not (is_neutral(k) or is_seed(k) or _under(k, ROW_KEYS) or _under(k, unused))
    }


def label(differing: dict[str, str | None]) -> str:
    """`λe=2.0, sepo.lr=0.001` from the differing keys and this run's values (None: the run lacks the key)."""
    parts = []
    for key in sorted(differing, key=lambda k: (k not in LABELS, k)):
        raw = differing[key]
        value = "<absent>" if raw is None else json.loads(raw)
        parts.append(f"{LABELS.get(key, key)}={value if isinstance(value, str) else raw}")
    return ", ".join(parts)


def variants(identities: dict[str, dict[str, str] | None]) -> dict[str, str]:
    """run dir -> its variant label among one (game, model, phase)'s runs: the keys on which they differ
    ("" when every run has the same settings). Runs whose settings are unknown get ""."""
    known = {run: ident for run, ident in identities.items() if ident is not None}
    keys = {k for ident in known.values() for k in ident}
    differing = sorted(k for k in keys if len({ident.get(k) for ident in known.values()}) > 1)
    return {
        run: label({k: ident.get(k) for k in differing}) if run in known else "" for run, ident in identities.items()
    }
