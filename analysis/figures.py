"""Figures of a sweep, as PNG and PDF (matplotlib's Agg backend: no display needed on a cluster).

- `delta_safety`: Safety(best SEPO checkpoint) - Safety(Base) per game, one panel per model (the
  paper's Figure 1); a game without both cells gets an `n/a` label instead of a zero-height bar.
- `curve_<run>_<phase>`: exploit and safety against training step for each training run with two or
  more checkpoints, with standard-error bars, the run's best (highest-safety) checkpoint starred
  and Base as a dashed line.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import collect  # noqa: E402
from analysis.collect import GAMES, MODELS, ordered, trained_models  # noqa: E402


def plain(name: str) -> str:
    """A display name without LaTeX escapes (matplotlib's mathtext does not read `\\ `)."""
    return name.replace("\\ ", " ").replace("\\", "")


def save(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def delta_safety(df: pd.DataFrame, c: pd.DataFrame, stem: Path) -> list[Path]:
    """ΔSafety = SEPO (best checkpoint) − Base, per game, one panel per model."""
    models = trained_models(df) or ordered(df["model"].dropna().unique(), {})
    games = ordered(df["game"].dropna().unique(), GAMES)
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.2), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        for x, game in enumerate(games):
            base, sepo = collect.latest(c, game, model, "base"), collect.best_sepo(c, game, model)
            if base is None or sepo is None or pd.isna(base["safety"]):
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8, color="grey")
                continue
            delta = sepo["safety"] - base["safety"]
            err = (base["safety_se"] ** 2 + sepo["safety_se"] ** 2) ** 0.5
            ax.bar(x, delta, yerr=None if pd.isna(err) else err, capsize=3,
                   color="tab:green" if delta >= 0 else "tab:red")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(games)), [plain(GAMES.get(g, g)) for g in games], rotation=30)
        ax.set_title(MODELS.get(model, model))
    axes[0][0].set_ylabel("ΔSafety (SEPO − Base)")
    fig.tight_layout()
    return save(fig, stem)


def training_curves(df: pd.DataFrame, c: pd.DataFrame, out: Path) -> list[Path]:
    """Exploit and safety against step for every (training run, phase) with stepped checkpoints."""
    written = []
    trained = df[df["phase"].isin(["sft", "sepo"]) & df["step"].notna() & df["safety"].notna()]
    for (run_dir, phase), run in trained.groupby(["run_dir", "phase"], sort=True):
        if len(run) < 2:  # one checkpoint is a point, not a curve (the tables show it)
            continue
        run = run.sort_values("step")
        best = run.loc[run["safety"].idxmax()]
        game, model = best["game"], best["model"]
        base = collect.latest(c, game, model, "base")
        fig, axes = plt.subplots(1, 2, figsize=(8, 3))
        for ax, metric in zip(axes, ("exploit", "safety")):
            ax.errorbar(run["step"].astype(float), run[metric], yerr=run[f"{metric}_se"].fillna(0),
                        marker="o", capsize=2, label=phase.upper())
            ax.plot([best["step"]], [best[metric]], marker="*", markersize=14, color="gold",
                    markeredgecolor="black", linestyle="none", zorder=3, label=f"best ({best['checkpoint']})")
            if base is not None and pd.notna(base[metric]):
                ax.axhline(base[metric], color="grey", linestyle="--", label="Base")
            ax.set_xlabel("training step")
            ax.set_ylabel(metric)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"{plain(GAMES.get(game, game))} · {MODELS.get(model, model)} · {phase} · {run_dir}", fontsize=8)
        fig.tight_layout()
        written += save(fig, out / f"curve_{re.sub(r'[^A-Za-z0-9.=-]+', '_', run_dir)}_{phase}")
    return written


def write_figures(df: pd.DataFrame, c: pd.DataFrame, out: Path) -> list[Path]:
    return delta_safety(df, c, out / "delta_safety") + training_curves(df, c, out)
