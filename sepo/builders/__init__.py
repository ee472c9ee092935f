"""Which model directory a run loads: a model built here (tiny, smollm2) or `model.path`.

The builders sit above the loader (`sepo.models`) and above what they build from: tiny plays the
scripted games for its tokenizer corpus, smollm2 converts the GGUF file of an installed package.
Both write an ordinary checkpoint directory into the cache once (`sepo.builders.cache`), and from
then on every model, built or downloaded, goes through the same `sepo.models.load_pretrained`.
Builders are imported on use, so that validating a config never loads torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from sepo.errors import ModelLoadError

#: model name -> "module:function" building its checkpoint directory (model_cfg, cache_dir) -> Path,
#: used when model.path is null
BUILDERS = {"tiny": "sepo.builders.tiny:build_tiny", "smollm2": "sepo.builders.smollm2:build_smollm2"}


def model_dir(model_cfg: Any, cache_dir: str | Path) -> str:
    """`model.path`, or, when it is null, the cache directory of the model's build (built on first use)."""
    path = model_cfg.get("path")
    if path is not None:
        return str(path)
    if model_cfg.name not in BUILDERS:
        raise ModelLoadError(
            f"model.path is not set for model={model_cfg.name}; set model.path to a local checkpoint directory "
            f"or a hub id (built without one: {', '.join(sorted(BUILDERS))})"
        )
    module, function = BUILDERS[model_cfg.name].split(":")
    return str(getattr(importlib.import_module(module), function)(model_cfg, cache_dir))


def load_model_and_tokenizer(model_cfg: Any, cache_dir: str | Path, device: str | None = None):
    """The run's model (eval mode, on `device`, default cuda when available) and its tokenizer."""
    from sepo.models import load_pretrained

    return load_pretrained(model_dir(model_cfg, cache_dir), model_cfg, device)
