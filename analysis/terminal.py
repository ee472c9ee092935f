"""The main job's closing table in the terminal: every checkpoint it evaluated, and what SEPO changed.

Each cell holds the value over its standard error on two lines, so nine columns fit in
`WIDTH` characters without cutting a digit. The last row is SEPO's final checkpoint minus SFT, on
the same evaluation episodes (the SE treats the two as independent, which overstates it: they
share the episodes).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.collect import collect_dir
from sepo import penalties

WIDTH = 100  # the terminal width the table is laid out for
METRICS = ["pay", *[term.metric for term in penalties.terms()], "safety", "nra", "parse_rate"]
HEADERS = {"parse_rate": "parse", "exploit_exact": "exploit\n(exact)"}
PHASE_ORDER = {"base": 0, "sft": 1, "sepo": 2}


def cell(value: float, se: float) -> str:
    return "--" if pd.isna(value) else f"{value:+.3f}" + ("" if pd.isna(se) else f"\n±{se:.3f}")


def label(row: pd.Series) -> str:
    if row["phase"] == "sepo":
        if row["checkpoint"] == "final":
            return "SEPO final"
        # a failed row (an unreadable checkpoint) may have no step
        return f"SEPO step {int(row['step'])}" if pd.notna(row["step"]) else f"SEPO {row['checkpoint'] or '(failed)'}"
    return {"base": "Base", "sft": "SFT"}.get(row["phase"], str(row["phase"]))


def metrics_of(frame: pd.DataFrame) -> list[str]:
    columns = list(METRICS)
    if "exploit_exact" in frame and frame["exploit_exact"].notna().any():  # Kuhn poker
        columns.insert(2, "exploit_exact")
    return columns


def delta_row(frame: pd.DataFrame, columns: list[str]) -> list[str] | None:
    """SEPO final - SFT per metric, with the SE of a difference of independent estimates."""
    sft, final = frame[frame["phase"] == "sft"], frame[(frame["phase"] == "sepo") & (frame["checkpoint"] == "final")]
    if sft.empty or final.empty:
        return None
    a, b = sft.iloc[-1], final.iloc[-1]
    return [cell(b[c] - a[c], (a[f"{c}_se"] ** 2 + b[f"{c}_se"] ** 2) ** 0.5) for c in columns]


def summary_table(frame: pd.DataFrame, title: str) -> Table:
    frame = frame.assign(order=frame["phase"].map(PHASE_ORDER)).sort_values(["order", "step"])
    columns = metrics_of(frame)
    table = Table(title=title, padding=(0, 1))
    table.add_column("checkpoint", no_wrap=True)
    for c in columns:
        table.add_column(HEADERS.get(c, c), justify="right", no_wrap=True)
    for _, row in frame.iterrows():
        table.add_row(label(row), *[cell(row[c], row[f"{c}_se"]) for c in columns])
    delta = delta_row(frame, columns)
    if delta is not None:
        table.add_section()
        table.add_row("Δ SEPO−SFT", *delta)
    return table


def print_summary(out: Path, width: int = WIDTH) -> None:
    """The pipeline's results under run dir `out` as a terminal table: one row per checkpoint."""
    frame = collect_dir(out)
    game, model = frame["game"].dropna().iloc[0], frame["model"].dropna().iloc[0]
    Console(width=width).print(summary_table(frame, f"SEPO pipeline, {game} · {model}: {out}"))
