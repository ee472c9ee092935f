"""Collect evaluation results into one DataFrame: one row per (run dir, checkpoint).

Two sources give the same columns. A sweep directory: every `results.json` (a standalone eval writes
`<run>/results.json`, a training run `<run>/eval/<checkpoint>/results.json`), plus a row for every run
dir that left none (failed, killed, or still going), so the tables can tell a failed cell from one never
run. A file that cannot be trusted (cut, nested too deeply, a metric NaN, infinite or missing, damaged
settings) makes a failed row that names it and why: a figure dropped or averaged as if whole would show a
number over fewer runs than its cell claims. YAML is read with `safe_load` only: nothing in it runs. The
W&B public API, for users who logged online: `frame_from_wandb` converts plain (config, summary,
history) dicts and is tested offline; `collect_wandb` is the thin network wrapper around it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import variants
from analysis.paper import SFT_DEGRADATION
from sepo import games, penalties, run_lock
from sepo.files import DamagedFile, why_unreadable
from sepo.trees import leaves

log = logging.getLogger(__name__)

# metrics of results.json in the order the CSV shows them; others found in a file are appended
METRICS = (
    "pay",
    *[name for term in penalties.terms() for name in (term.metric, term.worst_metric) if name],
    "robust",
    "safety",
    "nra",
    "parse_rate",
    "exploit_exact",
)
PHASES = ("base", "sft", "sepo")  # the table rows a result can fill
PAYOFF_ONLY = "payoff_only"  # the row of a SEPO run trained with every lambda 0 (`lambdas=zero`)
ROW_PHASES = (*PHASES, PAYOFF_ONLY)  # every phase with rows of its own in the tables
TRAINING_STAGES = ("sft", "sepo", "pipeline")
ID_COLUMNS = (
    "game",
    "model",
    "stage",
    "phase",
    "checkpoint",
    "step",
    "seed",
    "train_seed",
    "status",
    "run_dir",
    "error",
    "episodes",
    "variant",
)
#: metrics of a checkpoint's validation episodes (`validation.json` beside its results.json) kept as
#: `valid_<metric>` columns: what `best_sepo` chooses by
VALIDATION_METRICS = ("safety", "exploit", "exploit_exact")
CHOICES = ("validation", "reported")  # how the best SEPO checkpoint is chosen (`best_sepo`)
WANDB_STATES = {"finished": "done", "failed": "failed", "crashed": "failed", "killed": "failed", "running": "running"}


#: display names, in table order (a name not listed follows alphabetically)
MODELS = {"gemma4": "Gemma 4 E4B-it", "qwen": "Qwen 3.5-4B", "tiny": "tiny"}


def ordered(names, order: dict[str, str]) -> list[str]:
    """Known names in the display dict's order, then the rest alphabetically."""
    names = set(names)
    return [n for n in order if n in names] + sorted(names - set(order))


#: every game's table label (sepo/games/<game>/): the paper's games in its order, then the others alphabetically
GAMES = {name: games.entry(name).label for name in ordered(games.names(), SFT_DEGRADATION)}


def trained_models(df: pd.DataFrame) -> list[str]:
    """Models every game table lists (a model missing from a game shows as `--` rows there)."""
    return ordered((m for m in df["model"].dropna().unique() if not m.startswith("scripted:")), MODELS)


def phase_of(stage: str | None, checkpoint: str | None, lambdas_train: dict[str, Any] | None = None) -> str | None:
    """The table row a result fills.

    Training runs name the phase in `stage` (base, sft, sepo); a SEPO run trained with every lambda 0
    is the payoff-only baseline. A standalone `eval` of a model with no checkpoint is an untrained
    model, hence Base. A failed `pipeline` run may have failed in any phase, so it is `all`: the
    tables mark every cell it left empty as failed.
    """
    if (
        stage == "sepo"
        and isinstance(lambdas_train, dict)
        and lambdas_train
        and all(map(_zero, lambdas_train.values()))
    ):
        return PAYOFF_ONLY
    if stage in PHASES:
        return stage
    if stage == "eval" and not checkpoint:
        return "base"
    if stage == "pipeline":
        return "all"
    return stage


def _zero(value: Any) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


def columns(extra_metrics: Iterable[str] = ()) -> list[str]:
    metrics = [*METRICS, *extra_metrics]
    return [*ID_COLUMNS, *(f"lambda_{k}" for k in penalties.keys()), *metrics, *(f"{m}_se" for m in metrics)]


def make_row(
    meta: dict[str, Any],
    metrics: dict[str, Any] | None = None,
    se: dict[str, Any] | None = None,
    lambdas: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One flat row; both collectors go through here so their columns cannot drift apart."""
    row = {k: meta.get(k) for k in ID_COLUMNS}
    row["phase"] = phase_of(row["stage"], row["checkpoint"], meta.get("lambdas_train"))
    row.update({f"lambda_{k}": (lambdas or {}).get(k) for k in penalties.keys()})
    row.update({m: v for m, v in (metrics or {}).items() if isinstance(v, (int, float))})
    row.update({f"{m}_se": v for m, v in (se or {}).items() if isinstance(v, (int, float))})
    return row


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with the canonical columns first (missing values NaN, never 0)."""
    known = set(columns())
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in known and not k.endswith("_se")))
    df = pd.DataFrame(rows, columns=columns(extra))
    for col in ("step", "seed", "train_seed", "episodes"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in df.columns[len(ID_COLUMNS) :]:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    for col in ("game", "model", "stage", "phase", "checkpoint", "status", "run_dir", "error"):
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    df["variant"] = df["variant"].fillna("").astype(str)
    return df


def add_variants(df: pd.DataFrame, identities: dict[str, dict[str, str] | None]) -> pd.DataFrame:
    """Each row's variant among the runs of its (game, model, phase): `analysis/variants.py`."""
    df = df.copy()
    for _, group in df.groupby(["game", "model", "phase"], dropna=False, sort=False):
        runs = {r: identities.get(r) for r in group["run_dir"].dropna().unique()}
        labels = variants.variants(runs)
        df.loc[group.index, "variant"] = group["run_dir"].map(labels).fillna("")
    return df


# ----------------------------------------------------------------------------------------------
# sweep directory


def run_dir_of(results: Path) -> Path:
    """`<run>/results.json` or `<run>/eval/<checkpoint>/results.json` -> `<run>`."""
    return results.parents[2] if results.parent.parent.name == "eval" else results.parent


def run_status(run: Path) -> tuple[str, str | None]:
    """(status, first line of the error): done, failed, or running (neither marker yet). A run whose
    process was killed without a chance to write a marker (its lock names an owner that is gone,
    `sepo/run_lock.py`) failed: "died without a marker"."""
    if (run / "FAILED").exists():
        try:
            text = (run / "FAILED").read_text(errors="replace").strip()
        except OSError as err:
            return "failed", f"FAILED (unreadable: {why_unreadable(err)})"
        return "failed", text.splitlines()[0] if text else "FAILED"
    if (run / "DONE").exists():
        return "done", None
    for owner in (run, *list(run.parents)[:1]):  # a pipeline's phase dir: the pipeline holds the lock
        died = died_without_marker(owner)
        if died:
            return "failed", f"died without a marker ({died})"
    return "running", None


def died_without_marker(run: Path) -> str | None:
    """`run_lock.died_without_marker`, for a lock file a reader cannot open or decode (a sweep copied
    read-only, a damaged file): no evidence of a death, so None, as for no lock at all."""
    try:
        return run_lock.died_without_marker(run)
    except (OSError, ValueError, RecursionError, AttributeError, TypeError):
        return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def config_facts(flat: dict[str, Any]) -> dict[str, Any]:
    """game, model, stage, seed and training lambdas from a run's flattened settings or Hydra config."""
    model = _text(flat.get("model.name"))
    if model == "scripted":
        model = f"scripted:{_text(flat.get('model.strategy')) or _text(flat.get('game.reference_strategy'))}"
    lambdas = {k: flat[f"lambdas.train.{k}"] for k in penalties.keys() if f"lambdas.train.{k}" in flat}
    return {
        "game": _text(flat.get("game.name")),
        "model": model,
        "stage": _text(flat.get("stage.name")),
        "seed": _integer(flat.get("seed")),
        "lambdas_train": lambdas or None,
    }


def run_config(run: Path, root: Path | None = None) -> tuple[dict[str, Any], str | None]:
    """(game, model, stage, seed of a run that left no results.json, what was damaged): from Hydra's saved
    config, else its recorded settings, else the run dir's name (`game=ipd,model=tiny,stage=sft/seed_42`).
    A file that cannot be read is named in the second item, and the next source is tried."""
    damage = []
    for path in (run / ".hydra" / "config.yaml", run / variants.SETTINGS):
        if not path.is_file():
            continue
        try:
            return config_facts(variants.read_flat(path)), "; ".join(damage) or None
        except DamagedFile as err:
            damage.append(f"damaged {shown(err.path, root)}: {err.why}")
    keys = dict(part.split("=", 1) for part in run.parent.name.split(",") if "=" in part)
    seed = run.name.removeprefix("seed_")
    facts = {
        "game": keys.get("game"),
        "model": keys.get("model"),
        "stage": keys.get("stage"),
        "seed": int(seed) if seed.isdigit() else None,
    }
    return facts, "; ".join(damage) or None


def shown(path: Path, root: Path | None) -> str:
    """A path as the user named it: relative to the collected directory where it is under it."""
    try:
        return str(path.relative_to(root)) if root is not None else str(path)
    except ValueError:
        return str(path)


def read_json(path: Path) -> Any:
    """A JSON file's data; DamagedFile naming why it cannot be read (cut, not UTF-8, nested too deeply)."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise DamagedFile(path, why_unreadable(err)) from None


def not_a_number(value: Any) -> str | None:
    """Why `value` cannot be a metric (None when it can): a table cell must come from a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{json.dumps(value, default=str)[:40]} (not a number)"
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else f"{value}"
    return None


def number_problems(section: str, values: dict[str, Any]) -> list[str]:
    """`metrics.pay is NaN` for each value of a results section that is not a finite number."""
    return [f"{section}.{k} is {why}" for k, v in values.items() if (why := not_a_number(v)) is not None]


def is_metric_name(key: str) -> bool:
    """Whether a metric of that name can have a column of its own (and not overwrite a row's game or status)."""
    return key not in ID_COLUMNS and not key.startswith(("lambda_", "valid_")) and not key.endswith("_se")


def damage(data: dict[str, Any]) -> list[str]:
    """What is wrong in a decoded results.json of ours. A value dropped or averaged as if whole would put a
    number over fewer runs in a cell, or an `inf`, so any of these makes its row a failed one."""
    problems = [] if isinstance(data.get("model"), str) else ["model is not a name"]
    for section in ("se", "lambdas", "lambdas_train"):
        if not isinstance(data.get(section) or {}, dict):
            problems.append(f"{section} is not a mapping")
    problems += [f"metrics.{k} is not a metric's name" for k in data["metrics"] if not is_metric_name(k)]
    problems += number_problems("metrics", data["metrics"])
    if isinstance(data.get("se") or {}, dict):
        problems += number_problems("se", data.get("se") or {})
    return problems


def validation_metrics(path: Path) -> tuple[dict[str, float], list[str]]:
    """(`valid_<metric>` of a checkpoint's validation episodes, what is wrong with them). Empty when it has
    none or the file is unreadable (the checkpoint is then chosen on the reported episodes, as the caption
    says); a value there that is not a finite number would steer the choice, so it is damage."""
    try:
        metrics = read_json(path)["metrics"]
    except (DamagedFile, KeyError, TypeError, IndexError):
        return {}, []
    if not isinstance(metrics, dict):
        return {}, []
    chosen = {m: metrics[m] for m in VALIDATION_METRICS if m in metrics}
    problems = [f"{path.name}: {p}" for p in number_problems("metrics", chosen)]
    return ({} if problems else {f"valid_{m}": v for m, v in chosen.items()}), problems


def is_results(data: Any) -> bool:
    """Whether a decoded results.json is one this project wrote (what the collector reads of it)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("game"), str)
        and isinstance(data.get("stage"), str)
        and isinstance(data.get("metrics"), dict)
    )


#: the files that make a directory a run dir, results or not
RUN_FILES = {variants.SETTINGS, "DONE", "FAILED"}


def walk(root: Path) -> tuple[list[Path], list[Path]]:
    """(every results.json, every run dir) under `root`. A run dir holds Hydra's config, recorded
    settings or a marker, whether or not it got as far as a results.json. Hidden dirs (Hydra's own
    record, a copy being written) hold no runs."""
    results, runs = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        here, names = Path(dirpath), set(filenames)
        if "results.json" in names:
            results.append(here / "results.json")
        if names & RUN_FILES or (".hydra" in dirnames and (here / ".hydra" / "config.yaml").is_file()):
            runs.append(here)
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
    return sorted(results), sorted(runs)


def failed_row(meta: dict[str, Any], error: str) -> dict[str, Any]:
    """A row without figures that says why: the tables show its cell as failed, never empty."""
    lambdas = meta.get("lambdas_train")
    return make_row(
        {**meta, "lambdas_train": lambdas if isinstance(lambdas, dict) else None, "status": "failed", "error": error}
    )


def results_row(path: Path, root: Path) -> dict[str, Any] | None:
    """The row of one results.json: its figures, or a failed row naming the file and what is wrong with it;
    None for another tool's results.json."""
    run = run_dir_of(path)
    where = {"run_dir": str(run.relative_to(root))}
    try:
        data = read_json(path)
    except DamagedFile as err:  # e.g. a run killed mid-write
        checkpoint = path.parent.name if path.parent.parent.name == "eval" else None
        return failed_row(
            {**run_config(run, root)[0], **where, "checkpoint": checkpoint},
            f"unreadable {shown(path, root)}: {err.why}",
        )
    if not is_results(data):  # another tool's results.json in the same tree: not a cell of ours
        log.warning("skipping %s: not a sepo results.json (no game, stage and metrics)", path)
        return None
    valid, valid_problems = validation_metrics(path.parent / "validation.json")
    problems = damage(data) + valid_problems
    meta = {**data, "model": _text(data.get("model")), **where}
    if problems:
        return failed_row(meta, f"damaged {shown(path, root)}: {'; '.join(problems)}")
    status, error = run_status(run)
    return make_row(
        {**meta, "status": status, "error": error}, {**data["metrics"], **valid}, data.get("se"), data.get("lambdas")
    )


def is_below(run_dir: str, parent: str) -> bool:
    """Whether run dir `run_dir` lies inside run dir `parent` (both relative to the collected root)."""
    return parent == "." or run_dir.startswith(parent + "/")


def run_row(run: Path, root: Path, with_results: set[str]) -> dict[str, Any] | None:
    """The row of a run dir that no results.json speaks for: killed, failed, damaged, or still going.

    A dir whose runs below it have results (a pipeline and its phases) adds a row only when it failed:
    its phases' rows show what it reached, and `failed_phases` what it did not."""
    rel = str(run.relative_to(root))
    if rel in with_results:
        return None
    status, error = run_status(run)
    below = any(is_below(r, rel) for r in with_results)
    if below and status != "failed":
        return None
    facts, damaged = run_config(run, root)
    if damaged:
        status, error = "failed", "; ".join(e for e in (error, damaged) if e)
    elif status == "done" and phase_of(facts["stage"], None, facts.get("lambdas_train")) in (*ROW_PHASES, "all"):
        status, error = "failed", "DONE, but no results.json of ours in it"
    elif status == "running":
        error = "no results.json, no DONE and no FAILED: killed, or still running"
    return make_row({**facts, "status": status, "error": error, "run_dir": rel})


def collect_dir(root: str | Path) -> pd.DataFrame:
    """Every results.json under `root`, plus one metric-less row per run dir that no results.json speaks
    for (failed, killed, damaged or still going), so every run the sweep started is a row."""
    root = Path(root)
    results, runs = walk(root)
    rows, sources = [], []  # sources: the results.json each row comes from
    for path in results:
        row = results_row(path, root)
        if row is not None:
            rows.append(row)
            sources.append(shown(path, root))
    with_results = {row["run_dir"] for row in rows}
    for run in runs:
        row = run_row(run, root, with_results)
        if row is not None:
            rows.append(row)
            sources.append(None)
    if not rows:
        raise FileNotFoundError(
            f"sweep_dir={root} is not allowed: no results.json and no run dir under it; allowed: a directory of "
            "runs (results.json, DONE, FAILED, run_settings.yaml or .hydra/ below it)"
        )
    df = to_frame(rows)
    identities, damaged = identities_of(df, root)
    df = add_variants(without_figures(df, damaged), identities)
    return fail_incomplete(df, pd.Series(sources, dtype=object))


def identities_of(df: pd.DataFrame, root: Path) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(run dir -> its identity among the runs of its row, run dir -> why its settings cannot be read)."""
    identities, damaged = {}, {}
    for (run_dir, phase), _ in df.groupby(["run_dir", "phase"], dropna=False, sort=False):
        run = root / run_dir
        try:
            settings = variants.recorded(run, root)
            if settings is not None:
                parent = variants.origin(settings.get("model.path"), run, root)
                identities[run_dir] = variants.identity(settings, phase, parent)
        except DamagedFile as err:  # which cell its figures belong to is unknown
            damaged[run_dir] = f"damaged {shown(err.path, root)}: {err.why}"
    return identities, damaged


def without_figures(df: pd.DataFrame, damaged: dict[str, str]) -> pd.DataFrame:
    """Each run of `damaged` as one failed row without figures, saying why."""
    if not damaged:
        return df
    hit = df["run_dir"].isin(list(damaged))
    keep = df[~hit | ~df.duplicated("run_dir")].copy()
    rows = keep.index[keep["run_dir"].isin(list(damaged))]
    for i in rows:
        clear(keep, i, damaged[keep.at[i, "run_dir"]])
    return keep


def clear(df: pd.DataFrame, i: Any, error: str) -> None:
    """Row `i` becomes a failed row without figures (in place)."""
    df.loc[i, df.columns[len(ID_COLUMNS) + len(penalties.keys()) :]] = math.nan
    df.at[i, "status"], df.at[i, "error"] = "failed", error


def fail_incomplete(df: pd.DataFrame, sources: pd.Series) -> pd.DataFrame:
    """A results.json that lacks a metric the other runs of its row have is damaged: averaging the rest
    would print that metric over fewer runs than the row's other columns, unmarked."""
    metrics = [m for m in metric_columns(df) if not m.startswith("valid_")]
    has = df[metrics].notna()
    measured = df[has.any(axis=1) & sources.reindex(df.index).notna()]
    for _, group in measured.groupby(["game", "model", "phase", "variant"], dropna=False, sort=False):
        expected = [m for m in metrics if has.loc[group.index, m].any()]
        for i in group.index:
            missing = [m for m in expected if not has.at[i, m]]
            if missing:
                keys = ", ".join(f"metrics.{m}" for m in missing)
                clear(df, i, f"damaged {sources[i]}: {keys} missing (other runs of its row have it)")
    return df


# ----------------------------------------------------------------------------------------------
# W&B


def _get(tree: dict[str, Any], dotted: str) -> Any:
    """`tree["a"]["b"]` for "a.b"; also accepts W&B's flattened "a.b" keys and {"value": x} leaves."""
    if dotted in tree:
        node = tree[dotted]
    else:
        node = tree
        for key in dotted.split("."):
            node = node.get(key) if isinstance(node, dict) else None
    return node["value"] if isinstance(node, dict) and set(node) == {"value"} else node


def _unwrap(tree: Any) -> Any:
    """W&B's config with its {"value": x} leaves replaced by x."""
    if isinstance(tree, dict):
        return _unwrap(tree["value"]) if set(tree) == {"value"} else {k: _unwrap(v) for k, v in tree.items()}
    return tree


def _split(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """W&B keys `eval/<metric>` and `eval_se/<metric>` -> (metrics, se)."""
    metrics = {k.removeprefix("eval/"): v for k, v in values.items() if k.startswith("eval/")}
    se = {k.removeprefix("eval_se/"): v for k, v in values.items() if k.startswith("eval_se/")}
    return metrics, se


def wandb_row(meta: dict[str, Any], metrics: dict[str, Any], se: dict[str, Any], lambdas: Any) -> dict[str, Any]:
    """`make_row`, or a failed row naming the run and key where a logged figure is not a finite number."""
    numbers = {f"{part}/{k}": v for part, values in (("eval", metrics), ("eval_se", se)) for k, v in values.items()}
    # W&B also logs media and tables under eval/: only a number that is not finite is damage
    problems = [
        f"{k} is {not_a_number(v)}" for k, v in numbers.items() if isinstance(v, float) and not math.isfinite(v)
    ]
    if problems:
        return failed_row(meta, f"damaged W&B run {meta.get('run_dir')}: {'; '.join(problems)}")
    return make_row(meta, metrics, se, lambdas if isinstance(lambdas, dict) else None)


def frame_from_wandb(runs: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The collector's DataFrame from W&B runs given as plain dicts (pure: no network).

    Each run: `config` (the resolved Hydra config the tracker logged), `summary`, `state`, `path`,
    and for training runs optionally `history` (logged rows). A training run gives one row per
    history row carrying `eval/*` metrics (checkpoint `step_<k>`, the last one `final` once the run
    finished); a run without such history gives one row from its summary. A row's own `stage` value,
    when logged, overrides the config's (a pipeline run evaluates several phases).
    """
    rows, identities = [], {}
    for run in runs:
        cfg = run.get("config") or {}
        model = _get(cfg, "model.name")
        if model == "scripted":
            model = f"scripted:{_get(cfg, 'model.strategy') or _get(cfg, 'game.reference_strategy')}"
        status = WANDB_STATES.get(run.get("state"), "running")
        base = {
            "game": _get(cfg, "game.name"),
            "model": model,
            "stage": _get(cfg, "stage.name"),
            "seed": _get(cfg, "seed"),
            "status": status,
            "run_dir": run.get("path"),
            "error": None if status != "failed" else f"W&B state: {run.get('state')}",
        }
        lambdas = _get(cfg, "lambdas.eval") or {}
        training = base["stage"] in TRAINING_STAGES
        points = [h for h in run.get("history") or [] if any(k.startswith("eval/") for k in h)] if training else []
        if points:
            for i, point in enumerate(points):
                step = point.get("step", point.get("_step"))
                last = i == len(points) - 1 and status == "done"
                meta = {
                    **base,
                    "stage": point.get("stage", base["stage"]),
                    "step": step,
                    "checkpoint": "final" if last else f"step_{step}",
                }
                rows.append(wandb_row(meta, *_split(point), lambdas))
        else:
            summary = run.get("summary") or {}
            metrics, se = _split(summary)
            meta = {
                **base,
                "stage": summary.get("stage", base["stage"]),
                "checkpoint": "final" if training and metrics else None,
                "step": summary.get("step") if training else None,
            }
            rows.append(wandb_row(meta, metrics, se, lambdas))
        phase = make_row(base)["phase"]
        identities[base["run_dir"]] = variants.identity(leaves(_unwrap(cfg)), phase, None) if cfg else None
    return add_variants(to_frame(rows), identities)


def collect_wandb(path: str) -> pd.DataFrame:
    """All runs of W&B `entity/project` as the collector's DataFrame (needs `wandb login`)."""
    try:
        import wandb
    except ImportError as err:
        raise RuntimeError("--wandb needs the wandb package (pip install wandb)") from err
    try:
        api = wandb.Api(timeout=60)
        found = list(api.runs(path))
    except Exception as err:  # UsageError without an API key, CommError offline or for a wrong path
        raise RuntimeError(
            f"cannot read W&B runs of {path!r}: {err}\n"
            "Log in with `wandb login` (or set WANDB_API_KEY) and check entity/project."
        ) from err
    records = []
    for r in found:
        stage = _get(r.config, "stage.name")
        history = list(r.scan_history()) if stage in TRAINING_STAGES else []
        records.append(
            {
                "config": r.config,
                "summary": dict(r.summary),
                "state": r.state,
                "path": "/".join(r.path),
                "history": history,
            }
        )
    if not records:
        raise RuntimeError(f"no runs in W&B project {path!r}")
    return frame_from_wandb(records)


# ----------------------------------------------------------------------------------------------
# cells: what the tables and figures show


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Metric columns of a collected frame (everything after the ids and lambdas but the SEs)."""
    start = len(ID_COLUMNS) + len(penalties.keys())
    return [c for c in df.columns[start:] if not c.endswith("_se")]


def cells(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (game, model, phase, variant, checkpoint): the mean over the runs that share it, which
    differ only in their seeds (`analysis/variants.py`).

    Its SE: over runs (their spread / sqrt(n)) when there are several, which holds the training
    noise of each seed as well as the evaluation's; one run's own SE over episodes otherwise. Rows
    without any metric (failed runs) are left out; `failed_phases` accounts for them. `unfinished`:
    some run of the cell has no DONE (killed, failed later, or still running), so its figures are not
    those of a finished run and the tables mark them.
    """
    metrics = metric_columns(df)
    ses = [f"{m}_se" for m in metrics]
    keys = ["game", "model", "phase", "variant", "checkpoint"]
    d = df[df[metrics].notna().any(axis=1)].copy()
    d["checkpoint"] = d["checkpoint"].fillna("")
    by = [d[k] for k in keys]
    out = d[metrics].groupby(by, sort=False).mean()
    runs = d.groupby(by, sort=False).size()
    over_runs = d[metrics].groupby(by, sort=False).std(ddof=1).div(runs**0.5, axis=0)
    over_runs.columns = ses
    out[ses] = d[ses].groupby(by, sort=False).mean()  # one run: its own SE over episodes
    several = runs > 1
    out.loc[several, ses] = over_runs.loc[several, ses]
    out["step"] = d["step"].groupby(by, sort=False).max()
    for k in penalties.keys():  # the evaluation lambdas (the same for every run of a cell)
        out[f"lambda_{k}"] = d[f"lambda_{k}"].groupby(by, sort=False).first()
    out["runs"] = runs
    out["unfinished"] = (d["status"] != "done").groupby(by, sort=False).any()
    return out.reset_index()


def variants_of(c: pd.DataFrame, game: str, model: str, phase: str) -> list[str]:
    """The variant labels of one phase's cells, in order ("" alone when its runs share their settings)."""
    sel = c[(c["game"] == game) & (c["model"] == model) & (c["phase"] == phase)]
    return sorted(sel["variant"].unique())


def phase_cells(c: pd.DataFrame, game: str, model: str, phase: str, variant: str = "") -> pd.DataFrame:
    """The checkpoints of one phase's variant, earliest first (no step, as for Base, sorts first)."""
    sel = c[(c["game"] == game) & (c["model"] == model) & (c["phase"] == phase) & (c["variant"] == variant)]
    return sel.sort_values("step", na_position="first", kind="stable")


def latest(c: pd.DataFrame, game: str, model: str, phase: str, variant: str = "") -> pd.Series | None:
    """The Base or SFT cell: the phase's last checkpoint (SFT's final model)."""
    sel = phase_cells(c, game, model, phase, variant)
    return None if sel.empty else sel.iloc[-1]


def matching_variant(c: pd.DataFrame, game: str, model: str, phase: str, variant: str) -> str | None:
    """The variant of `phase` that a row of another phase's `variant` is compared with: the same label,
    else the phase's only one (a λ sweep's SEPO runs all start from one SFT); None when ambiguous."""
    labels = variants_of(c, game, model, phase)
    if variant in labels:
        return variant
    return labels[0] if len(labels) == 1 else None


def start_of(c: pd.DataFrame, game: str, model: str, phase: str, variant: str) -> pd.Series | None:
    """The Base or SFT cell a SEPO variant is compared with (`matching_variant`), or None."""
    match = matching_variant(c, game, model, phase, variant)
    return None if match is None else latest(c, game, model, phase, match)


def selection_safety(cells: pd.DataFrame, prefix: str = "") -> pd.Series:
    """The safety that picks the best checkpoint: with the exact exploitability where it is measured.

    Kuhn poker's pool exploit max(0, mean) is biased upward by noise (the Nash agent reads 0.13 at 20
    episodes, docs/spec.md §3), so there the pool term is swapped for `exploit_exact`: safety + lambda_e *
    (exploit - exploit_exact). Elsewhere it is the safety itself. `prefix="valid_"`: the same on the
    checkpoints' validation episodes.
    """
    safety = cells[f"{prefix}safety"]
    exact = f"{prefix}exploit_exact"
    if exact not in cells:
        return safety
    swap = cells["lambda_e"].fillna(0.0) * (cells[f"{prefix}exploit"] - cells[exact])
    return safety + swap.where(cells[exact].notna(), 0.0)


def best_sepo(
    c: pd.DataFrame, game: str, model: str, choose: str = "validation", phase: str = "sepo", variant: str = ""
) -> pd.Series | None:
    """The SEPO checkpoint with the highest safety (Kuhn: with the exact exploitability,
    `selection_safety`); ties -> earliest. Its `chosen_on` says how it was chosen:

    - `validation` (the default): on the checkpoints' validation episodes, so the reported (test)
      figures of the chosen checkpoint are not the maximum of noisy estimates, which biases upward;
    - `reported`: on the reported episodes themselves, the paper's choice. A phase whose
      checkpoints lack validation episodes (runs from before they existed, W&B) is chosen this way too.
    """
    sel = phase_cells(c, game, model, phase, variant)
    sel = sel[sel["safety"].notna()]
    return None if sel.empty else choose_best(sel, choose)


def choose_best(checkpoints: pd.DataFrame, choose: str) -> pd.Series:
    """The highest-`selection_safety` row of checkpoints that all have a safety (see `best_sepo`)."""
    validated = choose == "validation" and "valid_safety" in checkpoints and checkpoints["valid_safety"].notna().all()
    best = checkpoints.loc[selection_safety(checkpoints, "valid_" if validated else "").idxmax()].copy()
    best["chosen_on"] = "validation" if validated else "reported"
    return best


def failed_phases(
    df: pd.DataFrame, game: str, model: str, variant: str | None = None, status: str = "failed"
) -> set[str]:
    """Phases of (game, model) that a failed run should have filled, so an empty cell reads "failed" and a
    filled one says that a run of it is missing (`status="running"`: runs not finished, for the ‡ mark).

    A failed run without results failed in its own phase (of its own variant; a pipeline's in any);
    one that wrote results for some phases, itself or in its phases' dirs below it, failed in the phases
    after the last of them. `variant=None`: of any variant.
    """
    out: set[str] = set()
    metrics = metric_columns(df)
    mine = df[(df["game"] == game) & (df["model"] == model)]
    for run_dir, run in mine[mine["status"] == status].groupby("run_dir"):
        below = mine[mine["run_dir"].map(lambda r, parent=run_dir: isinstance(r, str) and is_below(r, parent))]
        figures = pd.concat([run, below])
        reached = [PHASES.index(p) for p in figures.loc[figures[metrics].notna().any(axis=1), "phase"] if p in PHASES]
        own = run.loc[run[metrics].isna().all(axis=1)]
        if reached:
            out |= set(PHASES[max(reached) + 1 :])
        elif not own["phase"].isin(ROW_PHASES).any():
            out |= set(PHASES)  # a pipeline, or a run whose stage is unknown, may have failed in any
        else:
            out |= {p for p, v in zip(own["phase"], own["variant"]) if p in ROW_PHASES and variant in (None, v)}
    return out
