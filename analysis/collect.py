"""Collect evaluation results into one DataFrame: one row per (run dir, checkpoint).

Two sources give the same columns. A sweep directory: every `results.json` (a standalone eval writes
`<run>/results.json`, a training run `<run>/eval/<checkpoint>/results.json`), plus the `FAILED`
markers of runs that left no results, so the tables can tell a failed cell from one never run. The
W&B public API, for users who logged online: `frame_from_wandb` converts plain (config, summary,
history) dicts and is tested offline; `collect_wandb` is the thin network wrapper around it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis import variants
from sepo import run_lock
from sepo.trees import leaves

log = logging.getLogger(__name__)

# metrics of results.json in the order the CSV shows them; others found in a file are appended
METRICS = (
    "pay",
    "exploit",
    "exploit_max",
    "collusion",
    "ext",
    "robust",
    "safety",
    "nra",
    "parse_rate",
    "exploit_exact",
)
LAMBDAS = ("e", "c", "x")
PHASES = ("base", "sft", "sepo")  # the table rows a result can fill
PAYOFF_ONLY = "payoff_only"  # the row of a SEPO run trained with every lambda 0 (`lambdas=zero`)
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
GAMES = {"ipd": "IPD", "auction": "Auction", "neg_v1": r"Neg.\ v1", "neg_v2": r"Neg.\ v2", "kuhn": "Kuhn"}


def ordered(names, order: dict[str, str]) -> list[str]:
    """Known names in the display dict's order, then the rest alphabetically."""
    names = set(names)
    return [n for n in order if n in names] + sorted(names - set(order))


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
    if stage == "sepo" and lambdas_train and not any(float(v) for v in lambdas_train.values()):
        return PAYOFF_ONLY
    if stage in PHASES:
        return stage
    if stage == "eval" and not checkpoint:
        return "base"
    if stage == "pipeline":
        return "all"
    return stage


def columns(extra_metrics: Iterable[str] = ()) -> list[str]:
    metrics = [*METRICS, *extra_metrics]
    return [*ID_COLUMNS, *(f"lambda_{k}" for k in LAMBDAS), *metrics, *(f"{m}_se" for m in metrics)]


def make_row(
    meta: dict[str, Any],
    metrics: dict[str, Any] | None = None,
    se: dict[str, Any] | None = None,
    lambdas: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One flat row; both collectors go through here so their columns cannot drift apart."""
    row = {k: meta.get(k) for k in ID_COLUMNS}
    row["phase"] = phase_of(row["stage"], row["checkpoint"], meta.get("lambdas_train"))
    row.update({f"lambda_{k}": (lambdas or {}).get(k) for k in LAMBDAS})
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
        text = (run / "FAILED").read_text(errors="replace").strip()
        return "failed", text.splitlines()[0] if text else "FAILED"
    if (run / "DONE").exists():
        return "done", None
    for owner in (run, *list(run.parents)[:1]):  # a pipeline's phase dir: the pipeline holds the lock
        died = run_lock.died_without_marker(owner)
        if died:
            return "failed", f"died without a marker ({died})"
    return "running", None


def run_config(run: Path) -> dict[str, Any]:
    """game, model, stage, seed of a run that left no results.json: from Hydra's saved config, else
    from the run dir's name (`game=ipd,model=tiny,stage=sft/seed_42`)."""
    cfg_file = run / ".hydra" / "config.yaml"
    if cfg_file.exists():
        cfg = yaml.safe_load(cfg_file.read_text()) or {}
        game, model = cfg.get("game") or {}, cfg.get("model") or {}
        name = model.get("name")
        if name == "scripted":
            name = f"scripted:{model.get('strategy') or game.get('reference_strategy')}"
        return {
            "game": game.get("name"),
            "model": name,
            "stage": (cfg.get("stage") or {}).get("name"),
            "seed": cfg.get("seed"),
        }
    keys = dict(part.split("=", 1) for part in run.parent.name.split(",") if "=" in part)
    seed = run.name.removeprefix("seed_")
    return {
        "game": keys.get("game"),
        "model": keys.get("model"),
        "stage": keys.get("stage"),
        "seed": int(seed) if seed.isdigit() else None,
    }


def validation_metrics(path: Path) -> dict[str, float]:
    """`valid_<metric>` of a checkpoint's validation episodes; empty when it has none (or it is unreadable)."""
    try:
        metrics = json.loads(path.read_text())["metrics"]
    except (OSError, json.JSONDecodeError, KeyError):
        return {}
    return {f"valid_{m}": metrics[m] for m in VALIDATION_METRICS if isinstance(metrics.get(m), (int, float))}


def is_results(data: Any) -> bool:
    """Whether a decoded results.json is one this project wrote (what the collector reads of it)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("game"), str)
        and isinstance(data.get("stage"), str)
        and isinstance(data.get("metrics"), dict)
        and isinstance(data.get("se") or {}, dict)
        and isinstance(data.get("lambdas") or {}, dict)
    )


def collect_dir(root: str | Path) -> pd.DataFrame:
    """Every results.json under `root`, plus one metric-less row per failed run without results."""
    root = Path(root)
    rows, runs_with_results = [], set()
    for path in sorted(root.rglob("results.json")):
        run = run_dir_of(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:  # e.g. a run killed mid-write: a failed row, with the reason
            log.warning("unreadable %s: %s", path, err)
            runs_with_results.add(run)
            checkpoint = path.parent.name if path.parent.parent.name == "eval" else None
            rows.append(
                make_row(
                    {
                        **run_config(run),
                        "checkpoint": checkpoint,
                        "status": "failed",
                        "error": f"unreadable {path.name}: {err}",
                        "run_dir": str(run.relative_to(root)),
                    }
                )
            )
            continue
        if not is_results(data):  # another tool's results.json in the same tree: not a cell of ours
            log.warning("skipping %s: not a sepo results.json (no game, stage and metrics)", path)
            continue
        runs_with_results.add(run)
        status, error = run_status(run)
        meta = {**data, "status": status, "error": error, "run_dir": str(run.relative_to(root))}
        metrics = {**(data.get("metrics") or {}), **validation_metrics(path.parent / "validation.json")}
        rows.append(make_row(meta, metrics, data.get("se"), data.get("lambdas")))
    for marker in sorted(root.rglob("FAILED")):
        run = marker.parent
        if run not in runs_with_results:
            status, error = run_status(run)
            rows.append(
                make_row({**run_config(run), "status": status, "error": error, "run_dir": str(run.relative_to(root))})
            )
    if not rows:
        raise FileNotFoundError(f"no results.json and no FAILED marker under {root}")
    df = to_frame(rows)
    identities = {}
    for (run_dir, phase), _ in df.groupby(["run_dir", "phase"], dropna=False, sort=False):
        run = root / run_dir
        settings = variants.recorded(run, root)
        if settings is not None:
            parent = variants.origin(settings.get("model.path"), run, root)
            identities[run_dir] = variants.identity(settings, phase, parent)
    return add_variants(df, identities)


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
                rows.append(make_row(meta, *_split(point), lambdas))
        else:
            summary = run.get("summary") or {}
            metrics, se = _split(summary)
            meta = {
                **base,
                "stage": summary.get("stage", base["stage"]),
                "checkpoint": "final" if training and metrics else None,
                "step": summary.get("step") if training else None,
            }
            rows.append(make_row(meta, metrics, se, lambdas))
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
    start = len(ID_COLUMNS) + len(LAMBDAS)
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
    for k in LAMBDAS:  # the evaluation lambdas (the same for every run of a cell)
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


def failed_phases(df: pd.DataFrame, game: str, model: str) -> set[str]:
    """Phases of (game, model) that a failed run should have filled, so an empty cell reads "failed".

    A failed run without results failed in its own phase (or in any, for a pipeline); one that wrote
    results for some phases failed in the phases after the last of them.
    """
    out: set[str] = set()
    metrics = metric_columns(df)
    failed = df[(df["game"] == game) & (df["model"] == model) & (df["status"] == "failed")]
    for _, run in failed.groupby("run_dir"):
        reached = [PHASES.index(p) for p in run.loc[run[metrics].notna().any(axis=1), "phase"] if p in PHASES]
        if reached:
            out |= set(PHASES[max(reached) + 1 :])
        else:
            out |= {p for p in run["phase"] if p in PHASES} or set(PHASES)
    return out
