"""analysis on sweeps that went wrong: damaged metrics, killed runs, failed variants, damaged files, Ctrl-C
and odd names. Every run the sweep started is a row; a run whose figures are missing or cannot be
trusted is a failed (or unfinished) row that names the file and why, and the cell it belongs to is
marked, never a plausible number over fewer seeds and never `inf`."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import matplotlib.figure
import pandas as pd
import pytest
import yaml

from analysis import collect, summary, tables
from sepo.files import files_written_atomically

FULL = {"pay": 1.25, "exploit": 0.5, "ext": 0.25, "safety": 0.75, "nra": 0.125}


def run_dir(
    root: Path,
    name: str,
    stage: str = "eval",
    metrics: dict | None = None,
    marker: str | None = "DONE",
    model: str = "tiny",
    settings: dict | None = None,
    seed: int = 1,
) -> Path:
    """A run dir as a launch leaves it: Hydra's config, the recorded settings, results.json (when
    `metrics`) and a marker (None: killed before it wrote one)."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    flat = {"game.name": "ipd", "model.name": model, "stage.name": stage, "seed": seed, **(settings or {})}
    (run / "run_settings.yaml").write_text(yaml.safe_dump(flat))
    nested: dict = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(nested))
    if metrics is not None:
        training = stage != "eval"
        path = run / "eval" / "final" / "results.json" if training else run / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "game": "ipd",
            "model": model,
            "stage": stage,
            "checkpoint": "final" if training else None,
            "step": 10 if training else None,
            "seed": 42,
            "lambdas": {"e": 1, "c": 1, "x": 1},
            "lambdas_train": {k: flat.get(f"lambdas.train.{k}", 1.0) for k in "ecx"},
            "metrics": metrics,
            "se": {},
        }
        path.write_text(json.dumps(payload))
    if marker:
        (run / marker).write_text("RuntimeError: boom\n" if marker == "FAILED" else "{}\n")
    return run


def line_of(latex: str, start: str) -> str:
    (line,) = [row for row in latex.splitlines() if row.startswith(start)]
    return line


def cells_of(line: str) -> list[str]:
    """A LaTeX row's cells (an escaped `\\&` is no separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)&", line.removesuffix(r"\\").strip())]


def run_tables(capsys, *argv: str, entry=tables.main) -> tuple[int, str, str]:
    code = entry([*map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------
# 3. damaged metrics


def test_a_non_finite_or_missing_metric_fails_its_run_and_marks_the_cell(tmp_path, capsys):
    run_dir(tmp_path, "s1", metrics={**FULL, "pay": float("nan"), "exploit": float("inf")}, seed=1)
    run_dir(tmp_path, "s2", metrics={k: v for k, v in FULL.items() if k != "safety"}, seed=2)
    run_dir(tmp_path, "s3", metrics=FULL, seed=3)

    df = collect.collect_dir(tmp_path).set_index("run_dir")
    assert df.loc["s1", "status"] == "failed"
    assert df.loc["s1", "error"] == "damaged s1/results.json: metrics.pay is NaN; metrics.exploit is inf"
    assert df.loc["s2", "status"] == "failed"
    assert df.loc["s2", "error"].startswith("damaged s2/results.json: metrics.safety missing")
    assert df.loc[["s1", "s2"], list(FULL)].isna().all(axis=None)  # nothing of them is averaged in

    code, out, _ = run_tables(capsys, tmp_path)
    assert code == 0
    assert "3 rows (1 done, 2 failed)" in out
    assert "failed s1: damaged s1/results.json: metrics.pay is NaN; metrics.exploit is inf" in out
    latex = (tmp_path / "tables" / "table_ipd.tex").read_text()
    base = cells_of(line_of(latex, "Base"))
    assert base[0] == "Base" + tables.PARTIAL  # over the one seed left, and marked so
    assert base[1:] == [f"{FULL['pay']:.3f}", f"{FULL['exploit']:.3f}", f"{FULL['ext']:.3f}"] + [
        f"{FULL[m]:+.3f}" for m in ("safety", "nra")
    ]
    assert "inf" not in latex and "nan" not in latex.lower()
    assert "some of its runs failed or were damaged" in latex
    degradation = (tmp_path / "tables" / "sft_degradation.tex").read_text()
    assert cells_of(line_of(degradation, "IPD"))[2] == f"{FULL['exploit']:.3f}" + tables.PARTIAL


def test_a_validation_file_with_a_non_finite_figure_is_damage(tmp_path):
    run = run_dir(tmp_path, "sepo", stage="sepo", metrics=FULL, settings={"sepo.seed": 0})
    (run / "eval" / "final" / "validation.json").write_text(json.dumps({"metrics": {"safety": float("inf")}}))
    row = collect.collect_dir(tmp_path).iloc[0]
    assert row["status"] == "failed"
    assert "validation.json: metrics.safety is inf" in row["error"]


# ---------------------------------------------------------------------------------------------
# 4. killed runs


def killed(root: Path, name: str, seed: int, lock_owner: bool, stage: str = "eval") -> Path:
    """A run SIGKILLed 8 s in: .hydra/ and run_settings.yaml, no results.json, DONE or FAILED; with
    `lock_owner`, its lock still names the process that died."""
    run = run_dir(root, name, stage=stage, metrics=None, marker=None, seed=seed)
    if lock_owner:
        owner = {"pid": 2**22 + 1, "host": "gone", "time": time.time() - 8}
        (run / ".run.lock").write_text(json.dumps(owner))
    return run


@pytest.mark.parametrize("lock_owner, status, mark", [(True, "failed", "PARTIAL"), (False, "running", "UNFINISHED")])
def test_a_killed_run_is_a_row_marked_in_its_cell(tmp_path, capsys, lock_owner, status, mark):
    run_dir(tmp_path, "seed_1", metrics=FULL, seed=1)
    killed(tmp_path, "seed_2", 2, lock_owner)

    df = collect.collect_dir(tmp_path).set_index("run_dir")
    assert df.loc["seed_2", ["game", "model", "phase", "status"]].tolist() == ["ipd", "tiny", "base", status]
    code, out, _ = run_tables(capsys, tmp_path)
    assert code == 0
    assert f"2 rows (1 done, 1 {status})" in out
    assert f"{status} seed_2: " in out
    latex = (tmp_path / "tables" / "table_ipd.tex").read_text()
    base = cells_of(line_of(latex, "Base"))
    assert base[0] == "Base" + getattr(tables, mark)
    assert base[1] == f"{FULL['pay']:.3f}"


def test_a_killed_run_alone_in_its_cell_shows_there(tmp_path):
    run_dir(tmp_path, "base", metrics=FULL)
    killed(tmp_path, "sepo", 0, lock_owner=True, stage="sepo")
    df = collect.collect_dir(tmp_path)
    latex = tables.game_table(df, collect.cells(df), "ipd")
    assert cells_of(line_of(latex, "SEPO"))[1:] == [tables.FAILED] * 5
    assert "run failed" in latex


def test_a_running_pipeline_with_results_below_it_adds_no_row(tmp_path):
    """The pipeline reads its own run dir before its DONE: its phases' rows speak for it."""
    pipeline = run_dir(tmp_path, "pipe", stage="pipeline", metrics=None, marker=None)
    phase = pipeline / "base" / "eval" / "base" / "results.json"
    phase.parent.mkdir(parents=True)
    phase.write_text(
        json.dumps({"game": "ipd", "model": "tiny", "stage": "base", "checkpoint": "base", "metrics": FULL})
    )
    (pipeline / "base" / "DONE").write_text("base eval\n")
    df = collect.collect_dir(tmp_path)
    assert df["run_dir"].tolist() == ["pipe/base"]
    assert df["status"].tolist() == ["done"]


# ---------------------------------------------------------------------------------------------
# 5. a failed variant


def test_a_failed_variant_keeps_its_row_dagger_and_footnote(tmp_path, capsys):
    run_dir(tmp_path, "base", metrics=FULL)
    run_dir(tmp_path, "sepo", stage="sepo", metrics=FULL, settings={"lambdas.train.e": 2.0})
    run_dir(tmp_path, "sepo_big", stage="sepo", metrics=None, marker="FAILED", settings={"lambdas.train.e": 1e308})

    code, out, _ = run_tables(capsys, tmp_path)
    assert code == 0
    assert "3 rows (2 done, 1 failed)" in out
    latex = (tmp_path / "tables" / "table_ipd.tex").read_text()
    failed = cells_of(line_of(latex, r"SEPO ($\lambda_e$=1e+308)"))
    assert failed[1:] == [tables.FAILED] * 5
    assert f"{FULL['pay']:.3f}" in line_of(latex, r"SEPO ($\lambda_e$=2.0, final)")
    assert r"$^\dagger$: run failed" in latex
    degradation = (tmp_path / "tables" / "sft_degradation.tex").read_text()
    assert cells_of(line_of(degradation, r"IPD & tiny ($\lambda_e$=1e+308)"))[4] == tables.FAILED


# ---------------------------------------------------------------------------------------------
# 12. damaged files


DAMAGED_YAML = {
    "tagged": b"!!python/object/apply:os.system ['touch PWNED']\n",
    "list": b"- game.name: ipd\n- stage.name: eval\n",
    "binary": bytes(range(256)),
}


@pytest.mark.parametrize("which", ["run_settings.yaml", ".hydra/config.yaml"])
@pytest.mark.parametrize("kind", list(DAMAGED_YAML))
def test_a_damaged_settings_file_fails_its_run_only(tmp_path, capsys, monkeypatch, which, kind):
    monkeypatch.chdir(tmp_path)
    run_dir(tmp_path, "good", metrics=FULL, seed=1)
    bad = run_dir(tmp_path, "bad", metrics=FULL, seed=2)
    if which == ".hydra/config.yaml":  # a run of older code: its Hydra config is all it recorded
        (bad / "run_settings.yaml").unlink()
    (bad / which).write_bytes(DAMAGED_YAML[kind])

    code, out, err = run_tables(capsys, tmp_path)
    assert code == 0, err
    assert not (tmp_path / "PWNED").exists()  # read as data, never run
    assert re.search(rf"failed bad: damaged bad/{re.escape(which)}: \S", out), out
    df = pd.read_csv(tmp_path / "tables" / "results.csv").set_index("run_dir")
    assert df.loc["bad", "status"] == "failed" and pd.isna(df.loc["bad", "pay"])
    latex = (tmp_path / "tables" / "table_ipd.tex").read_text()
    assert cells_of(line_of(latex, "Base"))[1] == f"{FULL['pay']:.3f}"


def test_a_killed_run_with_a_damaged_config_is_a_named_failed_row(tmp_path):
    run_dir(tmp_path, "good", metrics=FULL)
    bad = killed(tmp_path, "bad", 2, lock_owner=False)
    (bad / ".hydra" / "config.yaml").write_bytes(DAMAGED_YAML["tagged"])
    row = collect.collect_dir(tmp_path).set_index("run_dir").loc["bad"]
    assert row["status"] == "failed"
    assert row["error"].startswith("damaged bad/.hydra/config.yaml: could not determine a constructor")
    assert row[["game", "phase"]].tolist() == ["ipd", "base"]  # from its run_settings.yaml instead


def test_a_deeply_nested_results_file_is_a_failed_row_for_tables_and_summary(tmp_path, capsys):
    run_dir(tmp_path, "good", metrics=FULL)
    deep = run_dir(tmp_path, "deep", metrics=FULL, seed=2)
    (deep / "results.json").write_text("[" * 100000 + "]" * 100000)

    code, out, err = run_tables(capsys, tmp_path)
    assert code == 0, err
    assert "failed deep: unreadable deep/results.json: nested too deeply to read" in out
    assert summary.cli([str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 15. outputs whole or not at all; Ctrl-C; paths that cannot work


def test_ctrl_c_leaves_no_png_without_its_pdf_and_ends_in_one_line(tmp_path, capsys, monkeypatch):
    run_dir(tmp_path, "base", metrics=FULL)
    run_dir(tmp_path, "sepo", stage="sepo", metrics=FULL)
    savefig = matplotlib.figure.Figure.savefig

    def interrupted_at_the_pdf(fig, fname, *args, format=None, **kwargs):
        if format == "pdf":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, while the PNG is written and the PDF is not
        return savefig(fig, fname, *args, format=format, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", interrupted_at_the_pdf)
    code, _, err = run_tables(capsys, tmp_path, entry=lambda argv: tables.cli(argv))
    assert code == 130
    assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted")
    out = tmp_path / "tables"
    assert not (out / "figures" / "delta_safety.png").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert (out / "table_ipd.tex").read_text().rstrip().endswith(r"\end{table}")  # written before: whole


def test_files_written_together_are_all_new_even_when_ctrl_c_comes_between_renames(tmp_path, monkeypatch):
    a, b = tmp_path / "a.png", tmp_path / "a.pdf"
    a.write_text("old")
    b.write_text("old")
    replace = os.replace

    def interrupted_after_the_first(src, dst):
        replace(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", interrupted_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        with files_written_atomically(a, b) as (ta, tb):
            ta.write_text("new")
            tb.write_text("new")
    assert a.read_text() == b.read_text() == "new"
    with pytest.raises(RuntimeError):
        with files_written_atomically(a, b) as (ta, tb):
            ta.write_text("newer")
            raise RuntimeError("disk full")
    assert a.read_text() == b.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pdf", "a.png"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["{root}", "--out", "/proc/x"], "--out=/proc/x is not allowed; allowed: a writable directory"),
        (["{root}/none"], "sweep_dir={root}/none is not allowed; allowed: an existing directory"),
        (["{root}/base/DONE"], "sweep_dir={root}/base/DONE is not allowed; allowed: an existing directory"),
    ],
)
def test_paths_that_cannot_work_are_one_line_and_exit_2(tmp_path, capsys, argv, expected):
    run_dir(tmp_path, "base", metrics=FULL)
    code, _, err = run_tables(capsys, *(a.format(root=tmp_path) for a in argv))
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith("error: " + expected.format(root=tmp_path))
    assert summary.cli([a.format(root=tmp_path) for a in argv]) == 2
    assert capsys.readouterr().err.startswith("error: ")


# ---------------------------------------------------------------------------------------------
# 16. names that LaTeX would read as commands


@pytest.mark.parametrize(
    "model, printed",
    [
        ("a&b", r"a\&b"),
        ("x\\y", r"x\textbackslash{}y"),
        ("50%_{z}", r"50\%\_\{z\}"),
        ("$~^#", r"\$\textasciitilde{}\textasciicircum{}\#"),
    ],
)
def test_names_reach_latex_escaped_once_and_group_headers_still_form(tmp_path, capsys, model, printed):
    run_dir(tmp_path, "base", metrics=FULL, model=model)
    run_dir(tmp_path, "sepo", stage="sepo", metrics=FULL, model=model)
    code, _, err = run_tables(capsys, tmp_path)
    assert code == 0, err
    for name in ("table_ipd.tex", "sft_degradation.tex"):
        latex = (tmp_path / "tables" / name).read_text()
        assert tables.GROUP not in latex
        header = cells_of(line_of(latex, r"\textbf{"))
        for line in latex.splitlines():
            if " & " in line and not line.startswith(r"\multicolumn"):
                assert len(cells_of(line)) == len(header), line
    latex = (tmp_path / "tables" / "table_ipd.tex").read_text()
    assert rf"\multicolumn{{6}}{{@{{}}l}}{{\textit{{{printed}}}}} \\" in latex
    assert printed in (tmp_path / "tables" / "sft_degradation.tex").read_text()
    assert (tmp_path / "tables" / "figures" / "delta_safety.pdf").stat().st_size > 1000


def test_variant_checkpoint_and_game_names_are_escaped():
    assert tables.variant_tex("λe=2.0, x_y=a&b") == r"$\lambda_e$=2.0, x\_y=a\&b"
    assert tables.game_name("g&1") == r"g\&1"
    assert tables.game_name("neg_v1") == r"Neg.\ v1"  # the display names are LaTeX already
    cell = pd.Series({"checkpoint": "best_{1}", "step": float("nan")})
    assert tables.ckpt_label(cell) == r"best\_\{1\}"
    assert tables.file_part("../x/y") == "_x_y"
