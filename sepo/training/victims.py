"""What a learned exploiter plays against (`exploiter.victim`), and the weights its own adapter sits on.

A victim is frozen: a scripted strategy of the game, the configured model as it is (Base), an SFT run (its
merged model), or a SEPO run or one of its checkpoints (a LoRA adapter on the model that run trained from).
The exploiter is a fresh adapter on the victim's base weights (for a scripted victim: the configured model),
so a checkpoint's victim and its exploiter share one copy of those weights (`sepo.lm.adapters`), unless
`exploiter.base` names other weights: an adversary that can speak the game where the victim's base cannot
(against the Base model, an exploiter from the SFT model), with the victim then held apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sepo.errors import ConfigError
from sepo.files import read_settings
from sepo.reuse import ROOT_TOKEN, SETTINGS

SCRIPTED = "scripted:"
BASE = "model"  # the configured model as it is
KEY = "exploiter.victim"
BASE_KEY = "exploiter.base"
ALLOWED = (
    f"{SCRIPTED}<a strategy of the game>, {BASE} (the configured model as it is), an SFT run directory "
    "(holding merged/), a SEPO run or checkpoint directory (holding adapter/), or a model directory"
)


@dataclass(frozen=True)
class Victim:
    label: str  # as results.json names it
    strategy: str | None = None  # a scripted victim's strategy
    base: str | None = None  # the model directory the exploiter's adapter sits on; None: the configured model
    adapter: str | None = None  # the victim's own adapter on that base; None: the base itself

    @property
    def scripted(self) -> bool:
        return self.strategy is not None


def resolve_victim(spec: str | None, root_dir: str) -> Victim:
    """The victim `exploiter.victim` names (a strategy's name is checked when it is built, against the game's)."""
    if not spec:
        raise ConfigError(f"{KEY} is not set; allowed: {ALLOWED}")
    if spec.startswith(SCRIPTED):
        return Victim(label=spec, strategy=spec.removeprefix(SCRIPTED))
    if spec == BASE:
        return Victim(label=BASE)
    run = Path(spec).expanduser()
    if (run / "merged" / "config.json").is_file():
        return Victim(label=str(run), base=str(run / "merged"))
    if (run / "adapter" / "adapter_config.json").is_file():
        return Victim(label=str(run), base=adapter_base(run, root_dir), adapter=str(run / "adapter"))
    if (run / "config.json").is_file():
        return Victim(label=str(run), base=str(run))
    raise ConfigError(f"{KEY}={spec}: not a victim this stage can load; allowed: {ALLOWED}")


def resolve_exploiter_base(spec: str | None) -> str | None:
    """The model directory `exploiter.base` names (an SFT run: its merged/), or None: the victim's own base."""
    if not spec:
        return None
    run = Path(spec).expanduser()
    for candidate in (run / "merged", run):
        if (candidate / "config.json").is_file():
            return str(candidate)
    raise ConfigError(
        f"{BASE_KEY}={spec}: not a model this stage can load; allowed: null (the victim's base), an SFT run "
        "directory (holding merged/) or a model directory"
    )


def adapter_base(run: Path, root_dir: str) -> str:
    """The model a SEPO adapter was trained on: the path its adapter records, or, when that tree has moved, the
    `model.path` its run recorded (relative to the output root, here the current one)."""
    recorded = json.loads((run / "adapter" / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if recorded and Path(recorded).is_dir():
        return recorded
    for settings in (run / SETTINGS, run.parent.parent / SETTINGS):  # a run dir, or its checkpoints/step_N
        if settings.is_file():
            path = str(read_settings(settings).get("model.path") or "")
            path = path.replace(ROOT_TOKEN, str(Path(root_dir).absolute()))
            if Path(path).is_dir():
                return path
    raise ConfigError(
        f"{KEY}={run}: its adapter's base model ({recorded}) is not on this machine, nor is its run's model.path"
    )
