"""`python -m analysis.tables <sweep dir> [--out DIR] [--se] [--wandb entity/project]`.

Writes into `<sweep dir>/tables/` (or --out): one LaTeX table per game in the paper's layout
(Base / SFT / SEPO rows per model, best value per column and model in bold), the SFT-degradation
table (exploit by stage, every game and model), `results.csv` with every collected row, and the
figures (see analysis/figures.py). Tables are rendered by pandas' Styler; the only string surgery
is turning the per-model marker rows into `\\multicolumn` group headers, which Styler cannot express.
An empty cell is never a zero: `--` (not run), `--$^\\dagger$` (its run failed), `n/a` (the run did
not measure that metric), each explained under the table. A row whose figures are not all its runs'
carries a mark after its label: `$^\\dagger$` some of its runs failed (a damaged results.json or run
record counts as failed: a NaN, an infinity or a missing metric is never averaged away), `$^\\ddagger$`
some have no DONE (killed, or still going). Every run dir of the sweep is a row of `results.csv`, with
its status and, where it failed, the file and the reason; the command prints those too.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import collect
from analysis.cli import exit_with, interruptible, not_allowed
from analysis.collect import GAMES, MODELS, ordered, trained_models
from sepo.files import files_written_atomically
from sepo.paths import OUTPUT_DIR_ALLOWED, can_hold_outputs

# display names: config name -> what the paper prints
SIGNED = {"safety", "nra"}  # printed with an explicit sign, as in the paper

NOT_RUN, FAILED, NOT_MEASURED = "--", r"--$^\dagger$", "n/a"
UNFINISHED = r"$^\ddagger$"  # appended to the label of a row whose figures come from a run without DONE
PARTIAL = r"$^\dagger$"  # appended to the label of a row some of whose runs failed: figures over the rest
NOTES = {
    NOT_RUN: "--: not run",
    PARTIAL: r"$^\dagger$: run failed (after a label or value: some of its runs failed or were damaged, and its "
    "figures are over the others; results.csv says which and why)",
    NOT_MEASURED: "n/a: not measured",
    UNFINISHED: r"$^\ddagger$: unfinished (its run has no DONE: killed, failed later, or still running)",
}
GROUP = "@@group@@"  # marks a model's header row until it becomes a \multicolumn


@dataclass(frozen=True)
class Column:
    metric: str
    header: str
    higher_is_better: bool

    @property
    def latex(self) -> str:
        return self.header + (r"$\uparrow$" if self.higher_is_better else r"$\downarrow$")


@dataclass(frozen=True)
class Layout:
    columns: tuple[Column, ...]
    ckpt_column: bool = False  # Kuhn: a Ckpt column and both the best and the final SEPO checkpoint


DEFAULT = Layout(
    (
        Column("pay", "Pay/r", True),
        Column("exploit", "Exploit", False),
        Column("ext", "Ext", False),
        Column("safety", "Safety", True),
        Column("nra", "NRA", True),
    )
)
LAYOUTS = {
    "kuhn": Layout(
        (
            Column("pay", "Pay/hand", True),
            Column("exploit", "Exploit", False),
            Column("safety", "Safety", True),
            Column("exploit_exact", "Exploit (exact)", False),
        ),
        ckpt_column=True,
    )
}


#: LaTeX's special characters and what prints each as itself
ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex(text: str) -> str:
    """A name that comes from data (a model, game, variant or checkpoint name) as LaTeX that prints it:
    every special character escaped, in one pass, so no escape is itself escaped again."""
    return re.sub(r"[\\&%$#_{}~^]", lambda m: ESCAPES[m.group()], str(text))


def file_part(name: str) -> str:
    """A game's name as part of a file name: it comes from data, so it may not leave the output dir."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name).lstrip(".") or "_"


def model_name(model: str) -> str:
    if model.startswith("scripted:"):
        return f"Scripted {tex(model.removeprefix('scripted:'))}"
    return tex(MODELS.get(model, model))


def game_name(game: str) -> str:
    return GAMES.get(game, tex(game))


def ckpt_label(cell: pd.Series | None, short: bool = False) -> str:
    if cell is None:
        return ""
    if cell["checkpoint"] == "final":
        return "final"
    if pd.notna(cell["step"]):
        return f"s{cell['step']}" if short else f"step {cell['step']}"
    return tex(cell["checkpoint"])


#: estimates whose SE every table shows, --se or not: Kuhn's exact exploitability is read from sampled answers
ALWAYS_SE = ("exploit_exact",)


def fmt(value: float, se: float, metric: str, with_se: bool) -> str:
    text = f"{value:+.3f}" if metric in SIGNED else f"{value:.3f}"
    return text + (rf" $\pm$ {se:.3f}" if (with_se or metric in ALWAYS_SE) and pd.notna(se) else "")


def variant_tex(variant: str) -> str:
    """A variant label (`λe=2.0, sepo.lr=0.001`) in LaTeX."""
    return re.sub(r"λ(\w)", r"$\\lambda_\1$", tex(variant))


def row_label(name: str, variant: str = "", checkpoint: str = "") -> str:
    inside = ", ".join(x for x in (variant_tex(variant), checkpoint) if x)
    return f"{name} ({inside})" if inside else name


@dataclass(frozen=True)
class Marks:
    """What the runs that left no figures say about one table row (one phase and variant)."""

    failed: bool = False  # a run of the row failed or was damaged
    unfinished: bool = False  # a run of the row has no marker yet (killed, or still going)

    def missing(self) -> str:
        """An empty cell: failed, not finished yet, or never run."""
        return FAILED if self.failed else NOT_RUN + (UNFINISHED if self.unfinished else "")

    def suffix(self, cell: pd.Series | None) -> str:
        """After a filled row's label: its figures are not all its runs' (see NOTES)."""
        if cell is None:
            return ""
        unfinished = self.unfinished or bool(cell.get("unfinished", False))
        return (UNFINISHED if unfinished else "") + (PARTIAL if self.failed else "")


def marks(df: pd.DataFrame, game: str, model: str, phase: str, variant: str | None) -> Marks:
    return Marks(
        phase in collect.failed_phases(df, game, model, variant),
        phase in collect.failed_phases(df, game, model, variant, status="running"),
    )


def rows_of(df: pd.DataFrame, c: pd.DataFrame, game: str, model: str, layout: Layout, choose: str):
    """(label, ckpt, cell or None, marker of an empty cell) for each row of one model group: every phase's
    variants (runs that differ in more than their seeds) in rows of their own, those whose every run
    failed too."""
    scripted = model.startswith("scripted:")
    for phase, label in (("base", "Base"), ("sft", "SFT")):
        for variant in collect.variants_of(df, game, model, phase) or [""]:
            cell = collect.latest(c, game, model, phase, variant)
            mark = marks(df, game, model, phase, variant)
            no_sft = not collect.variants_of(df, game, model, "sft")
            if cell is not None or not scripted or (phase == "base" and no_sft):
                # a scripted agent: one row, even failed
                yield row_label("Eval" if scripted else label, variant) + mark.suffix(cell), "---", cell, mark.missing()
    if scripted:
        return
    for variant in collect.variants_of(df, game, model, "sepo") or [""]:
        mark = marks(df, game, model, "sepo", variant)
        best = collect.best_sepo(c, game, model, choose, variant=variant)
        final = collect.phase_cells(c, game, model, "sepo", variant)
        final = final[final["checkpoint"] == "final"]
        sepo = [best]
        if layout.ckpt_column and not final.empty and best is not None and best["checkpoint"] != "final":
            sepo.append(final.iloc[-1])
        for cell in sepo:
            yield *trained_label("SEPO", variant, cell, mark, layout), cell, mark.missing()
    for variant in collect.variants_of(df, game, model, collect.PAYOFF_ONLY):
        # GRPO on the payoff alone (`lambdas=zero`), chosen the same way
        mark = marks(df, game, model, collect.PAYOFF_ONLY, variant)
        baseline = collect.best_sepo(c, game, model, choose, phase=collect.PAYOFF_ONLY, variant=variant)
        yield (
            *trained_label("Payoff-only", variant, baseline, mark, layout),
            baseline,
            mark.missing(),
        )


def trained_label(name: str, variant: str, cell: pd.Series | None, mark: Marks, layout: Layout) -> tuple[str, str]:
    """(label, Ckpt column) of a row of RL checkpoints: the checkpoint in its own column or in the label."""
    if layout.ckpt_column:
        return row_label(name, variant) + mark.suffix(cell), ckpt_label(cell, short=True) or "---"
    return row_label(name, variant, ckpt_label(cell)) + mark.suffix(cell), ""


def bold_mask(values: pd.DataFrame, groups: pd.Series, cols: list[Column]) -> pd.DataFrame:
    """True where a cell holds its model group's best value of the column (ties at print precision)."""
    mask = pd.DataFrame(False, index=values.index, columns=values.columns)
    for col in cols:
        shown = values[col.latex].round(3)
        best = shown.groupby(groups).transform("max" if col.higher_is_better else "min")
        rivals = shown.notna().groupby(groups).transform("sum")  # a lone value is not "best"
        mask[col.latex] = shown.notna() & (shown == best) & (rivals > 1)
    return mask


def bold_css(bold: pd.DataFrame) -> pd.DataFrame:
    """Styler's LaTeX bold where `bold` is True. Built with numpy, not `DataFrame.replace`: pandas 3.0.6's
    replace of True/False on a frame of several bool blocks (as `reindex(fill_value=False)` leaves it)
    raised IndexError inside its copy-on-write bookkeeping (the GPU machine's image; 3.1 does not)."""
    return pd.DataFrame(
        np.where(bold.to_numpy(dtype=bool), "textbf:--rwrap;", ""), index=bold.index, columns=bold.columns
    )


def render(shown: pd.DataFrame, bold: pd.DataFrame, column_format: str, caption: str, label: str) -> str:
    """Styler -> LaTeX (booktabs), then marker rows -> `\\midrule` + `\\multicolumn` group headers."""
    styler = (
        shown.style.hide(axis="index")
        .apply(lambda _: bold_css(bold), axis=None)
        .map_index(lambda _: "textbf:--rwrap;", axis="columns")
    )
    latex = styler.to_latex(
        hrules=True, column_format=column_format, caption=caption, label=label, position="t", position_float="centering"
    )
    width = shown.shape[1]
    latex = re.sub(
        rf"^{GROUP}((?:\\.|[^&\\])*?)\s*(&\s*)*\\\\$",  # the name: escaped characters (`\&`) or any but `&`
        lambda m: r"\midrule" + "\n" + rf"\multicolumn{{{width}}}{{@{{}}l}}{{\textit{{{m.group(1)}}}}} \\",
        latex,
        flags=re.M,
    )
    return latex.replace("\\midrule\n\\midrule\n", "\\midrule\n")


def notes_for(shown: pd.DataFrame) -> str:
    """The notes of the marks a table shows: `--` alone, the others anywhere in a cell (after a value or a
    label too)."""
    texts = set(shown.astype(str).to_numpy().ravel())
    used = [
        note for mark, note in NOTES.items() if (mark in texts if mark == NOT_RUN else any(mark in t for t in texts))
    ]
    return (" " + "; ".join(used) + ".") if used else ""


def game_table(df: pd.DataFrame, c: pd.DataFrame, game: str, with_se: bool = False, choose: str = "validation") -> str:
    """The paper's per-game table: a group of Base / SFT / SEPO rows per model."""
    layout = LAYOUTS.get(game, DEFAULT)
    cols = [
        col
        for col in layout.columns
        if col.metric in c.columns
        and (col.metric != "exploit_exact" or c.loc[c["game"] == game, col.metric].notna().any())
    ]
    models = trained_models(df) + ordered(
        (m for m in df.loc[df["game"] == game, "model"].dropna().unique() if m.startswith("scripted:")), {}
    )
    shown, values, groups, chosen_on = [], [], [], set()
    for model in models:
        shown.append({"Model": GROUP + model_name(model)})
        values.append({})
        groups.append(model)
        for label, ckpt, cell, missing in rows_of(df, c, game, model, layout, choose):
            if cell is not None and "chosen_on" in cell:
                chosen_on.add(cell["chosen_on"])
            row = {"Model": label} | ({"Ckpt": ckpt} if layout.ckpt_column else {})
            vals = {}
            for col in cols:
                if cell is None:
                    row[col.latex] = missing
                elif pd.isna(cell[col.metric]):
                    row[col.latex] = NOT_MEASURED
                else:
                    row[col.latex] = fmt(cell[col.metric], cell[f"{col.metric}_se"], col.metric, with_se)
                    vals[col.latex] = cell[col.metric]
            shown.append(row)
            values.append(vals)
            groups.append(model)
    shown = pd.DataFrame(shown).fillna("")
    values = pd.DataFrame(values, columns=[col.latex for col in cols], index=shown.index, dtype=float)
    bold = bold_mask(values, pd.Series(groups, index=shown.index), cols).reindex(
        columns=shown.columns, fill_value=False
    )
    lead = "ll" if layout.ckpt_column else "l"
    caption = (
        f"{game_name(game)} results. Best value per model in bold; SEPO at its highest-safety checkpoint"
        + choice_note(chosen_on)
        + (", and the final one" if layout.ckpt_column else "")
        + "."
        + notes_for(shown)
    )
    return render(shown, bold, f"@{{}}{lead}{'c' * len(cols)}@{{}}", caption, f"tab:{file_part(game)}")


def choice_note(chosen_on: set[str]) -> str:
    """How the table's SEPO checkpoints were chosen, for its caption."""
    notes = {
        "validation": " on validation episodes (reported on the test episodes)",
        "reported": " chosen on the reported episodes themselves (the paper's choice: biased upward)",
    }
    if chosen_on == {"validation", "reported"}:
        return " (on validation episodes where the run has them, else on the reported ones: biased upward)"
    return "".join(notes[c] for c in chosen_on)


def verdict(base: float, sepo: float) -> str:
    """The paper's "vs. Base" mark: SEPO's exploit lower (checkmark), higher (times) or equal."""
    if pd.isna(base) or pd.isna(sepo):
        return NOT_RUN
    base, sepo = round(base, 3), round(sepo, 3)
    return r"$\checkmark$" if sepo < base else r"$\times$" if sepo > base else "$=$"


def degradation_table(df: pd.DataFrame, c: pd.DataFrame, with_se: bool = False, choose: str = "validation") -> str:
    """Exploit by stage for every game and model (SEPO at its highest-safety checkpoint)."""
    shown, values, chosen_on = [], [], set()
    stages = ("Base", "SFT", "SEPO")
    for game in ordered(df["game"].dropna().unique(), GAMES):
        for model in trained_models(df):
            for variant in sorted({v for p in collect.PHASES for v in collect.variants_of(df, game, model, p)}) or [""]:
                matched = {p: collect.matching_variant(df, game, model, p, variant) for p in collect.PHASES}
                cells_ = {
                    "Base": collect.start_of(c, game, model, "base", variant),
                    "SFT": collect.start_of(c, game, model, "sft", variant),
                    "SEPO": None
                    if matched["sepo"] is None
                    else collect.best_sepo(c, game, model, choose, variant=matched["sepo"]),
                }
                if cells_["SEPO"] is not None:
                    chosen_on.add(cells_["SEPO"]["chosen_on"])
                row, vals = {"Game": game_name(game), "Model": row_label(model_name(model), variant)}, {}
                for stage, phase in zip(stages, collect.PHASES):
                    cell, mark = cells_[stage], marks(df, game, model, phase, matched[phase] or variant)
                    if cell is None:
                        row[stage] = mark.missing()
                    elif pd.isna(cell["exploit"]):
                        row[stage] = NOT_MEASURED
                    else:
                        row[stage] = fmt(cell["exploit"], cell["exploit_se"], "exploit", with_se) + mark.suffix(cell)
                        vals[stage] = cell["exploit"]
                row[r"vs.\ Base"] = verdict(vals.get("Base", math.nan), vals.get("SEPO", math.nan))
                shown.append(row)
                values.append(vals)
    shown = pd.DataFrame(shown)
    values = pd.DataFrame(values, columns=list(stages), index=shown.index, dtype=float)
    best = values.round(3).min(axis=1).where(values.notna().sum(axis=1) > 1)
    bold = values.round(3).eq(best, axis=0).reindex(columns=shown.columns, fill_value=False)
    caption = (
        "Exploit across training stages (lower is better; best per row in bold). SEPO at its "
        r"highest-safety checkpoint"
        + choice_note(chosen_on)
        + r"; vs.\ Base: $\checkmark$ SEPO lower, $\times$ higher, $=$ equal."
        + notes_for(shown)
    )
    return render(shown, bold, "@{}llcccc@{}", caption, "tab:sft_degradation")


def write_utf8(path: Path, text: str) -> None:
    """`text` into `path` as UTF-8 whatever the locale (variant labels hold `λ`), whole or not at all."""
    with files_written_atomically(path) as (tmp,):
        tmp.write_bytes(text.encode("utf-8"))


def write_all(df: pd.DataFrame, out: Path, with_se: bool = False, choose: str = "validation") -> list[Path]:
    """Every table, the CSV and the figures into `out`; returns the paths written. Each file is written
    whole or not at all (a temporary file renamed over it), so Ctrl-C or a full disk leaves the old
    outputs or new ones, never a part of one."""
    from analysis import figures  # matplotlib is only needed here

    out.mkdir(parents=True, exist_ok=True)
    c = collect.cells(df)
    written = []
    for game in ordered(df["game"].dropna().unique(), GAMES):
        path = out / f"table_{file_part(game)}.tex"
        write_utf8(path, game_table(df, c, game, with_se, choose))
        written.append(path)
    if trained_models(df):  # a sweep of scripted agents only has no stages to compare
        path = out / "sft_degradation.tex"
        write_utf8(path, degradation_table(df, c, with_se, choose))
        written.append(path)
    path = out / "results.csv"
    rows = df.sort_values(["game", "model", "phase", "step", "run_dir"], na_position="first", kind="stable")
    write_utf8(path, rows.to_csv(index=False))
    written.append(path)
    written += figures.write_figures(df, c, out / "figures", choose)
    return written


def check_paths(sweep_dir: Path | None, out: Path) -> str | None:
    """The one-line error for a sweep dir that is not a directory or an output dir that cannot be written
    (checked before any work, so a bad path costs nothing and leaves nothing behind)."""
    if sweep_dir is not None and not sweep_dir.is_dir():
        return not_allowed(f"sweep_dir={sweep_dir}", "an existing directory of runs (a sweep or run dir)")
    if not can_hold_outputs(out):
        return not_allowed(f"--out={out}", OUTPUT_DIR_ALLOWED)
    return None


STATUS_ORDER = {"done": 0, "failed": 1, "running": 2}


def failures(df: pd.DataFrame) -> list[str]:
    """`failed <run dir>: <why>` for each run that left a failed or unfinished row, once each."""
    rows = df[df["status"] != "done"].drop_duplicates(["run_dir", "status", "error"])
    return [
        f"{status} {run_dir}: {error or status}"
        for status, run_dir, error in rows[["status", "run_dir", "error"]].itertuples(index=False)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n\n")[1])
    parser.add_argument("sweep_dir", nargs="?", type=Path, help="directory searched for results.json and FAILED")
    parser.add_argument("--out", type=Path, help="output directory (default: <sweep dir>/tables)")
    parser.add_argument("--se", action="store_true", help="print ± standard errors in the tables")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="collect runs from W&B instead of a directory")
    parser.add_argument(
        "--choose",
        choices=collect.CHOICES,
        default="validation",
        help="how SEPO's best checkpoint is chosen: on its validation episodes (default), or on the "
        "reported episodes themselves (the paper's choice, biased upward)",
    )
    args = parser.parse_args(argv)
    if args.sweep_dir is None and args.wandb is None:
        parser.error("give a sweep dir, or --wandb entity/project")
    out = args.out or (args.sweep_dir / "tables" if args.sweep_dir else Path("tables"))
    problem = check_paths(None if args.wandb else args.sweep_dir, out)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        df = collect.collect_wandb(args.wandb) if args.wandb else collect.collect_dir(args.sweep_dir)
    except (FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    written = write_all(df, out, args.se, args.choose)
    counts = df["status"].value_counts()
    counts = [f"{counts[s]} {s}" for s in sorted(counts.index, key=lambda s: (STATUS_ORDER.get(s, 9), str(s)))]
    print(f"{len(df)} rows ({', '.join(counts)}); wrote {len(written)} files to {out}")
    for line in failures(df):
        print(f"  {line}")
    for path in written:
        print(f"  {path}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """`main` for the command line: Ctrl-C ends it with one line and 130 (`analysis/cli.py`)."""
    return interruptible(main, argv, "tables not finished (every file written is whole; run it again)")


if __name__ == "__main__":
    exit_with(cli())
