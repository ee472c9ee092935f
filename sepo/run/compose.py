"""The project's config composed outside a Hydra run: the one way benchmarks, launch scripts, tests and
the command line's key check read it.

Composing here also registers the `run_name` resolver the config's run directories use, so a config
composed by any of them resolves as a run's would. Nothing is resolved here: callers resolve what they
read (some keys, like `hydra.runtime`, exist only inside a run).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sepo import reuse
from sepo.paths import CONF_DIR
from sepo.run.schema import register as register_schemas

#: the stage nodes a model may set its own defaults for (conf/<stage>/model/<model>.yaml, merged by the
#: defaults list over conf/<stage>/default.yaml)
STAGE_NODES = ("sft", "eval", "sepo")

#: longest run-dir name kept verbatim; file systems allow 255 bytes per path component
MAX_RUN_NAME = 150


def run_name(override_dirname: str) -> str:
    """Run-dir name from the overrides: `default` when there are none, `/` made path-safe, a boolean
    spelled `true`/`false` however it came.

    A single run's name holds each override as typed, and the command line takes booleans in lower case
    only; a sweep's job gets its overrides from Hydra's sweeper, which renders a parsed boolean with
    Python's `str` (`False`). Lower case for both puts a job and the same run alone in dirs of one name.
    Long override lists are cut and suffixed with a hash of the whole list, so the name stays
    unique, stable across re-launches, and within the file system's limit.
    """
    name = re.sub(r"(?<=[=\[,])(True|False)(?=[,\]]|$)", lambda m: m[1].lower(), override_dirname)
    name = name.replace("/", "_") or "default"
    if len(name.encode()) <= MAX_RUN_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return name.encode()[: MAX_RUN_NAME - 13].decode(errors="ignore") + "-" + digest


if not OmegaConf.has_resolver("run_name"):
    OmegaConf.register_new_resolver("run_name", run_name)


def compose_config(
    overrides: Sequence[str] = (), *, with_hydra: bool = False, config_dir: str | Path = CONF_DIR
) -> DictConfig:
    """`conf/config.yaml` with `overrides`, as `python main.py overrides` would compose it (unresolved).

    `with_hydra`: keep the `hydra` node (a sweep's parameters, the launcher's settings)."""
    from hydra import compose, initialize_config_dir

    register_schemas()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=with_hydra)


def refused_value(err: BaseException, overrides: Sequence[str]) -> tuple[str, object] | None:
    """(key, value as the command line gives it) when composition failed because a stage node's schema
    (sepo/run/schema.py) refused the value of an override; None for any other failure."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf.errors import ValidationError

    cause = err.__cause__
    key = getattr(cause, "full_key", None) if isinstance(cause, ValidationError) else None
    if not key:
        return None
    key = re.sub(r"(\[\d+\])+$", "", key)  # a list's entry: the whole list is what was given
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.key_or_group.lstrip("+~") == key:
            return key, override.value()
    return key, getattr(cause, "value", None)


def shipped_settings(cfg: DictConfig) -> dict[str, Any]:
    """The settings the shipped config gives a run of this launch's config groups (model, game, stage, lambdas,
    a preset, ...) with no key overridden: what a key added since a run was recorded would have had."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    given = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    # a config group's choice (`game=ipd`, `+experiment=...`) names a folder of conf/; every other override is a key
    groups = [o for o in given if "=" in o and (CONF_DIR / o.split("=", 1)[0].lstrip("+~")).is_dir()]
    running = GlobalHydra.instance().hydra  # this launch's Hydra, which a second composition may not replace
    GlobalHydra.instance().clear()
    try:
        return reuse.settings(compose_config(groups if given else [f"model={cfg.model.name}", f"game={cfg.game.name}"]))
    except Exception:  # noqa: BLE001 (a config that cannot be composed alone: every new key then counts)
        return {}
    finally:
        if running is not None:
            GlobalHydra.instance().initialize(running)
