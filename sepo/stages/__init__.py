"""Stage name -> function(cfg, tracker). Imported lazily so `stage=datagen` never loads torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from sepo.errors import ConfigError

STAGES = {
    "eval": "sepo.stages.evaluate:run_eval",
    "datagen": "sepo.stages.datagen:run_datagen",
    "sft": "sepo.stages.sft:run_sft",
    "sepo": "sepo.stages.sepo_loop:run_sepo",
    "pipeline": "sepo.stages.pipeline:run_pipeline",
    "exploiter": "sepo.stages.exploiter:run_exploiter",
}


def get_stage(name: str) -> Callable[[Any, Any], Any]:
    if name not in STAGES:
        raise ConfigError(f"stage.name={name!r} is not a known stage; allowed: {', '.join(sorted(STAGES))}")
    module, fn = STAGES[name].split(":")
    return getattr(importlib.import_module(module), fn)
