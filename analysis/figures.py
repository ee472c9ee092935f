"""Figures of a sweep, as PNG and PDF (matplotlib's Agg backend: no display needed on a cluster).

- `delta_safety`: Safety(best SEPO checkpoint) - Safety(Base) per game, one panel per model (the
  paper's Figure 1), beside Safety(best SEPO) - Safety(SFT); a game without both cells gets an
  `n/a` label instead of a zero-height bar.
- `curve_<game>_<model>`: exploit and safety against SEPO step from step 0 (the SFT model), the
  mean over seeds with a band of its SE, the chosen best checkpoint starred and Base dashed.
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
from sepo.files import files_written_atomically  # noqa: E402


def plain(name: str) -> str:
    """A display name without LaTeX escapes (matplotlib's mathtext does not read `\\ `)."""
    return name.replace("\\ ", " ").replace("\\", "")


def literal(text: str) -> str:
    """A name from data as matplotlib text that prints it: a `$` in it would start mathtext."""
    return text.replace("$", r"\$")


def save(fig, stem: Path) -> list[Path]:
    """The figure as PNG and PDF, both or neither: each is written beside its name, and the two are renamed
    over theirs together once both are whole."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    try:
        with files_written_atomically(*paths) as tmps:
            for tmp, path in zip(tmps, paths):
                fig.savefig(tmp, format=path.suffix[1:], dpi=150, bbox_inches="tight")
    finally:
        plt.close(fig)
    return paths


UNIT = {"kuhn": "per hand"}  # every metric is per round, per hand in Kuhn poker


def unit(game: str) -> str:
    return UNIT.get(game, "per round")


def delta_safety(df: pd.DataFrame, c: pd.DataFrame, stem: Path, choose: str) -> list[Path]:
    """ΔSafety of SEPO's best checkpoint per game, against Base (the paper's Figure 1) and against
    SFT (what SEPO itself added: on a model whose Base is random weights, nearly all of SEPO − Base
    is SFT's doing), one panel per model."""
    models = trained_models(df) or ordered(df["model"].dropna().unique(), {})
    # one bar pair per game and SEPO variant (runs that differ in more than their seeds)
    bars = [
        (game, variant)
        for game in ordered(df["game"].dropna().unique(), GAMES)
        for variant in sorted(set(df.loc[(df["game"] == game) & (df["phase"] == "sepo"), "variant"])) or [""]
    ]
    fig, axes = plt.subplots(1, len(models), figsize=(max(5, 1.1 * len(bars)) * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for x, (game, variant) in enumerate(bars):
            sepo = collect.best_sepo(c, game, model, choose, variant=variant)
            for offset, (phase, colour) in zip((-0.2, 0.2), (("base", "tab:blue"), ("sft", "tab:orange"))):
                start = collect.start_of(c, game, model, phase, variant)
                if start is None or sepo is None or pd.isna(start["safety"]):
                    ax.text(x + offset, 0, "n/a", ha="center", va="bottom", fontsize=7, color="grey")
                    continue
                err = (start["safety_se"] ** 2 + sepo["safety_se"] ** 2) ** 0.5
                ax.bar(
                    x + offset,
                    sepo["safety"] - start["safety"],
                    width=0.4,
                    color=colour,
                    capsize=3,
                    yerr=None if pd.isna(err) else err,
                    label=f"SEPO − {phase.upper() if phase == 'sft' else 'Base'}",
                )
        ax.axhline(0, color="black", linewidth=0.8)
        names = [literal(plain(GAMES[g]) if g in GAMES else g) + (f"\n({literal(v)})" if v else "") for g, v in bars]
        ax.set_xticks(range(len(bars)), names, rotation=30, fontsize=7 if any(v for _, v in bars) else None)
        ax.set_title(literal(MODELS.get(model, model)))
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(dict(zip(labels, handles)).values(), dict(zip(labels, handles)).keys(), fontsize=7)
    axes[0][0].set_ylabel("ΔSafety (game units per round or hand)")
    fig.tight_layout()
    return save(fig, stem)


def over_seeds(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per step: the mean over runs (seeds) and its SE over runs; one run: its own SE over episodes."""
    by_step = runs.groupby("step")[metric]
    out = pd.DataFrame({"mean": by_step.mean(), "runs": by_step.count()})
    spread = by_step.std(ddof=1) / out["runs"] ** 0.5
    own = runs.groupby("step")[f"{metric}_se"].mean()
    out["se"] = spread.where(out["runs"] > 1, own).fillna(0.0)
    return out.reset_index()


def seeds_label(runs: pd.DataFrame) -> str:
    seeds = sorted({int(s) for s in runs["train_seed"].dropna()})
    n = runs["run_dir"].nunique()
    named = (
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        if len(seeds) == n
        else f"{n} run{'s' if n > 1 else ''}"
    )
    return f"SEPO, {named}" + (" (mean ± SE over seeds)" if n > 1 else " (± SE over episodes)")


def training_curves(df: pd.DataFrame, c: pd.DataFrame, out: Path, choose: str = "validation") -> list[Path]:
    """Exploit and safety against SEPO step for each (game, model), from step 0 (the SFT model): the
    mean over seeds with a band of ± its SE, Base dashed, the chosen best checkpoint starred."""
    written = []
    trained = df[(df["phase"] == "sepo") & df["step"].notna() & df["safety"].notna()]
    for (game, model, variant), runs in trained.groupby(["game", "model", "variant"], sort=True):
        sft, base = collect.start_of(c, game, model, "sft", variant), collect.start_of(c, game, model, "base", variant)
        if sft is not None:  # every run starts from the SFT model: its point is step 0 of each
            start = pd.DataFrame(
                [
                    {**sft.to_dict(), "step": 0, "run_dir": r, "train_seed": s}
                    for r, s in runs.groupby("run_dir")["train_seed"].first().items()
                ]
            )
            runs = pd.concat([start[runs.columns.intersection(start.columns)], runs], ignore_index=True)
        if runs["step"].nunique() < 2:  # one point is not a curve (the tables show it)
            continue
        runs = runs.astype({"step": float})
        best = collect.best_sepo(c, game, model, choose, variant=variant)
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
        for ax, metric in zip(axes, ("exploit", "safety")):
            line = over_seeds(runs, metric)
            ax.plot(line["step"], line["mean"], marker="o", markersize=3, label=seeds_label(runs))
            ax.fill_between(line["step"], line["mean"] - line["se"], line["mean"] + line["se"], alpha=0.25)
            if best is not None:
                ax.plot(
                    [float(best["step"])],
                    [best[metric]],
                    marker="*",
                    markersize=13,
                    color="gold",
                    markeredgecolor="black",
                    linestyle="none",
                    zorder=3,
                    label=f"best checkpoint (chosen on {best['chosen_on']} episodes)",
                )
            if base is not None and pd.notna(base[metric]):
                ax.axhline(base[metric], color="grey", linestyle="--", label="Base (untrained)")
            ax.set_xlabel("SEPO step (0: the SFT model)")
            ax.set_ylabel(f"{metric} ({unit(game)})")
        axes[1].legend(fontsize=7)
        title = f"{plain(GAMES[game]) if game in GAMES else game} · {MODELS.get(model, model)}"
        fig.suptitle(literal(title + (f" · {variant}" if variant else "")), fontsize=9)
        fig.tight_layout()
        name = f"{game}_{model}" + (f"_{variant}" if variant else "")
        written += save(fig, out / f"curve_{re.sub(r'[^A-Za-z0-9.=-]+', '_', name)}")
    return written


def write_figures(df: pd.DataFrame, c: pd.DataFrame, out: Path, choose: str = "validation") -> list[Path]:
    return delta_safety(df, c, out / "delta_safety", choose) + training_curves(df, c, out, choose)
