"""The Hydra application behind `python main.py` and the `sepo` console script.

Before Hydra composes anything, config-group choices on the command line are checked against the
files in conf/, so `game=chess` ends with one line naming the allowed games instead of Hydra's
multi-line report.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from sepo.paths import CONF_DIR, OUTPUT_DIR_ALLOWED, can_hold_outputs
from sepo.run.compose import STAGE_NODES, compose_config, refused_value
from sepo.run.schema import register as register_schemas
from sepo.trees import dotted_keys


def user_config_dirs(argv: list[str]) -> list[Path]:
    """Directories given with Hydra's `--config-dir DIR` / `-cd DIR` (a user's own config groups, searched after
    conf/, as Hydra does)."""
    dirs = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    return dirs


def group_options(group: str, extra_dirs: list[Path] = ()) -> list[str]:
    return sorted({p.stem for d in (CONF_DIR, *extra_dirs) for p in (d / group).glob("*.yaml")})


def check_group_overrides(argv: list[str]) -> str | None:
    """The error line for the first unknown config-group option in `argv`, else None."""
    extra = user_config_dirs(argv)
    for d in extra:
        if not d.is_dir():
            return f"error: --config-dir={d} is not a directory; allowed: a directory of config groups (e.g. lambdas/my.yaml)"
    groups = {p.name for d in (CONF_DIR, *extra) if d.is_dir() for p in d.iterdir() if p.is_dir()} - {"local"}
    for arg in argv:
        if "=" not in arg or arg.startswith("hydra"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key not in groups:
            continue
        allowed = group_options(key, extra)
        if not value.strip():
            return f"error: {key}= is empty; allowed: {', '.join(allowed)}"
        values = value.removeprefix("choice(").removesuffix(")").split(",")
        for v in (v.strip() for v in values):
            if v and v != "null" and v not in allowed:
                return f"error: {key}={v} is not a known {key}; allowed: {', '.join(allowed)}"
    return None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from sepo.run.task import run_task

    run_task(cfg)


def check_root_dir(argv: list[str]) -> str | None:
    """The error line when the output root (`paths.root_dir=` or $PROJECT_ROOT) cannot hold run dirs.

    Checked here because Hydra creates the run dir under it before any of the project's code runs.
    """
    given = [a.split("=", 1)[1] for a in argv if a.startswith("paths.root_dir=")]
    root = given[-1] if given else os.environ.get("PROJECT_ROOT")
    if not root or "${" in root:
        return None
    if not can_hold_outputs(root):
        key = "paths.root_dir" if given else "PROJECT_ROOT"
        return f"error: {key}={root} is not allowed; allowed: {OUTPUT_DIR_ALLOWED}"
    return None


def check_hydra_dirs(argv: list[str]) -> str | None:
    """The error line when `hydra.run.dir=` / `hydra.sweep.dir=` names a place no run dir can be made."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value and "${" not in value and not can_hold_outputs(value):
            return f"error: {key}={value} is not allowed; allowed: {OUTPUT_DIR_ALLOWED}"
    return None


#: a `+key=` may add keys only to these free-form nodes (everything else is a typo the schema would hide)
FREE_FORM = ("model.chat_template_kwargs",)


def search_path(extra_dirs: list[Path]) -> list[str]:
    """The override that adds a user's config dirs to a composition outside Hydra's command line, at the
    place `--config-dir` puts them (after conf/)."""
    if not extra_dirs:
        return []
    return ["hydra.searchpath=[" + ",".join(f"file://{d.resolve()}" for d in extra_dirs) + "]"]


def check_keys(argv: list[str]) -> str | None:
    """The error line for the first override naming a key the config does not have (with the closest
    known key), or a `+key` the schema does not know; None when every key exists.

    The config is composed with the command line's group choices (the first of a sweep's values), so
    the keys are those of the game, model, ... asked for. Hydra's own keys are left to Hydra."""
    import difflib

    extra = user_config_dirs(argv)
    groups = {p.name for d in (CONF_DIR, *extra) if d.is_dir() for p in d.iterdir() if p.is_dir()}
    choices, keys = search_path(extra), []  # (key, its override)
    for arg in command_line_overrides(argv):
        if arg.startswith(("hydra.", "~")):
            continue
        key, value = arg.split("=", 1)
        if key.lstrip("+") in groups:
            choices.append(f"{key}={value.removeprefix('choice(').removesuffix(')').split(',')[0]}")
        else:
            keys.append((key, arg))
    try:
        cfg = compose_config(choices)
    except Exception:  # noqa: BLE001 (a composition problem of its own: Hydra reports it)
        return None
    known = dotted_keys(OmegaConf.to_container(cfg, resolve=False))
    for key, arg in keys:
        plain = key.lstrip("+")
        # an interpolated value (datagen.out_dir: ${paths.output_dir}/...) needs Hydra's runtime to resolve:
        # whether the key exists is all that matters here
        exists = plain in known or OmegaConf.select(cfg, plain, default=_MISSING) is not _MISSING
        if key.startswith("+") and not exists and not plain.startswith(FREE_FORM):
            close = difflib.get_close_matches(plain, known, n=1)
            return (
                f"error: +{plain} adds a key the config does not know; allowed: an existing key"
                + (f" (did you mean {close[0]}?)" if close else "")
                + f", or new keys under {', '.join(FREE_FORM)}"
            )
        if not key.startswith("+") and not exists:
            close = [moved] if (moved := stage_key_of_model_default(plain)) in known else []
            close = close or difflib.get_close_matches(plain, known, n=1)
            return f"error: {plain} is not a known key; allowed: a key of the config" + (
                f" (did you mean {close[0]}?)" if close else ""
            )
        if not key.startswith("+") and (line := unknown_entry(cfg, plain, arg)):
            return line
    return None


def unknown_entry(cfg: DictConfig, key: str, arg: str) -> str | None:
    """The error line for `key={name: value, ...}` naming an entry the mapping at `key` does not have (Hydra
    merges a mapping into the config's and refuses a new entry with a stack of its own lines); None otherwise."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not arg.split("=", 1)[1].lstrip().startswith("{") or key.startswith(FREE_FORM):
        return None
    node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
    if not OmegaConf.is_dict(node):
        return None
    try:
        value = OverridesParser.create().parse_override(arg).value()
    except Exception:  # noqa: BLE001 (a value Hydra cannot parse: Hydra reports it)
        return None
    extra = [str(k) for k in value if k not in node] if isinstance(value, dict) else []
    if not extra:
        return None
    return (
        f"error: {key} has no entry {extra[0]}; allowed: {', '.join(map(str, node))}"
        f" (a new entry: +{key}.{extra[0]}=<value>)"
    )


def command_line_overrides(argv: list[str]) -> list[str]:
    """The `key=value` overrides of a command line, without Hydra's options and their values (`-cd DIR`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp"):
            skip = True
        elif "=" in arg and not arg.startswith("-"):
            out.append(arg)
    return out


def check_values(argv: list[str]) -> str | None:
    """The error line for the first override whose value a node's schema (sepo/run/schema.py) refuses, or that
    gives a boolean anything but true or false, every value of a sweep included; None otherwise (and for
    anything Hydra reports itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sepo.run.config import loose_boolean_override, type_error_line

    plain = [a for a in command_line_overrides(argv) if not a.startswith("hydra.")]
    extra = search_path(user_config_dirs(argv))
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
        first = [
            f"{o.get_key_element()}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else a
            for a, o in zip(plain, parsed)
        ]
        candidates = [first] + [
            [*first[:i], f"{o.get_key_element()}={value}", *first[i + 1 :]]
            for i, o in enumerate(parsed)
            if o.is_sweep_override()
            for value in list(o.sweep_string_iterator())[1:]
        ]
    except Exception:  # noqa: BLE001 (an override Hydra cannot parse: Hydra reports it)
        return None
    for overrides in candidates:
        try:
            cfg = compose_config([*extra, *overrides])
        except Exception as err:  # noqa: BLE001 (a composition problem of another kind: Hydra reports it)
            refused = refused_value(err, overrides)
            return f"error: {type_error_line(*refused)}" if refused else None
        loose = loose_boolean_override(cfg, overrides)
        if loose:
            return f"error: {loose}"
    return settings_error(cfg, first) if len(candidates) == 1 and not is_sweep(argv) else None


def is_sweep(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def settings_error(cfg: DictConfig, overrides: list[str]) -> str | None:
    """The error line of the run's own value checks (`check_settings`), run here on a single run so that a
    bad value costs the composition, not a Hydra run and torch's import. A sweep is left to its jobs: each
    bad job fails alone and the rest run. A value this composition cannot resolve (one that needs Hydra's
    runtime) is left to the run, which checks everything again. The checks' warnings (a pool overlap) are
    shown only with an error: a run that goes ahead warns once, from its own checks."""
    from sepo.errors import ConfigError
    from sepo.run.config import check_settings

    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_settings(cfg, overrides)
        except ConfigError as err:
            error = f"error: {err}"
        except Exception:  # noqa: BLE001 (the run's own check reports it)
            pass
    for warning in caught if error else ():
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return error


#: the project's local launcher (`+launch=local`), whose `n_jobs` is a count of processes
PROCESS_LAUNCHER = "hydra_plugins.sepo_launcher.process_launcher.ProcessLauncher"


def check_launcher(argv: list[str]) -> str | None:
    """The error line when a sweep's launcher settings cannot run it (`hydra.launcher.n_jobs=0`)."""
    if not is_sweep(argv):
        return None
    overrides = [*search_path(user_config_dirs(argv)), *command_line_overrides(argv)]
    try:
        launcher = compose_config(overrides, with_hydra=True).hydra.launcher
    except Exception:  # noqa: BLE001 (Hydra reports its own composition problems)
        return None
    n_jobs = launcher.get("n_jobs")
    if launcher.get("_target_") == PROCESS_LAUNCHER and not (
        isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs >= 1
    ):
        return f"error: hydra.launcher.n_jobs={n_jobs!r} is not allowed; allowed: an integer >= 1 (jobs run at once)"
    return None


_MISSING = object()


def stage_key_of_model_default(key: str) -> str:
    """`model.sft.lr` -> `sft.lr`: a model's stage defaults moved out of the model node (into
    conf/<stage>/model/<model>.yaml), and on the command line the stage's own key sets them."""
    for stage in STAGE_NODES:
        if key.startswith(f"model.{stage}."):
            return key.removeprefix("model.")
    return key


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def main() -> None:
    warnings.formatwarning = _one_line_warning  # e.g. a pool overlap: one line, not a source excerpt
    argv = sys.argv[1:]
    error = (
        check_group_overrides(argv)
        or check_root_dir(argv)
        or check_hydra_dirs(argv)
        or check_keys(argv)
        or check_values(argv)
        or check_launcher(argv)
    )
    if error:
        print(error, file=sys.stderr)
        sys.exit(2)
    register_schemas()
    _hydra_main()
    from sepo.run import sweep

    if sweep.sweep_started and sweep.last_sweep_failures is None:  # Hydra swallows a callback's error
        print(
            "error: the sweep ended without its summary; allowed: re-run it (finished jobs are skipped)",
            file=sys.stderr,
        )
        sys.exit(1)
    if sweep.last_sweep_failures:  # a sweep succeeds only when every job is done or skipped
        sys.exit(1)


if __name__ == "__main__":  # `python -m sepo.run.cli ...`, as `python -m sepo` and the `sepo` command
    main()
