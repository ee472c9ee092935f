"""analysis: collect a fabricated sweep, write the tables, CSV and figures, check what they say.

The fixture sweep is written into tmp_path by `fabricate` with known numbers: 2 games x 2 models x
(base, sft, sepo step_25 / step_50 / final), one FAILED run (ipd/qwen SFT) and one cell never run
(kuhn/qwen SFT). Numbers are drawn away from zero, so a `0.000` in a table can only be a bug.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis import collect, tables

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("pay", "exploit", "exploit_max", "collusion", "ext", "robust", "safety", "nra", "parse_rate")
GAMES, MODELS = ("ipd", "kuhn"), ("gemma4", "qwen")
SEPO_CKPTS = (("step_25", 25), ("step_50", 50), ("final", 100))
FAILED_CELL, MISSING_CELL = ("ipd", "qwen", "sft"), ("kuhn", "qwen", "sft")


def numbers(game: str, model: str, stage: str, checkpoint: str | None) -> tuple[dict, dict]:
    """Known (metrics, se) of one fixture cell: drawn from a seed named by the cell, never near 0."""
    rng = random.Random(f"{game}/{model}/{stage}/{checkpoint}")
    metrics = {m: round(rng.uniform(0.1, 5.0), 3) for m in METRICS}
    metrics["safety"] = round(rng.uniform(-5.0, -0.1) if rng.random() < 0.5 else rng.uniform(0.1, 5.0), 3)
    if game == "kuhn" and stage != "eval":  # exact exploitability only for policies with probabilities
        metrics["exploit_exact"] = round(rng.uniform(0.1, 1.0), 3)
    return metrics, {m: round(rng.uniform(0.01, 0.05), 3) for m in metrics}


def write_result(path: Path, game: str, model: str, stage: str, checkpoint: str | None, step: int | None) -> dict:
    metrics, se = numbers(game, model, stage, checkpoint)
    payload = {
        "game": game,
        "model": model,
        "stage": stage,
        "checkpoint": checkpoint,
        "step": step,
        "seed": 42,
        "lambdas": {"e": 2.4, "c": 1.0, "x": 1.8},
        "metrics": metrics,
        "se": se,
        "per_opponent": [],
        "episodes": 100,
        "per_episode": [],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    return payload


def best_sepo_metrics(game: str, model: str) -> dict:
    """The fixture's best SEPO checkpoint by the selection rule: highest safety, on Kuhn with the pool
    exploit swapped for the exact one (safety + lambda_e * (exploit - exploit_exact), lambda_e = 2.4)."""

    def selection(m: dict) -> float:
        return m["safety"] + (2.4 * (m["exploit"] - m["exploit_exact"]) if "exploit_exact" in m else 0.0)

    return max((numbers(game, model, "sepo", c)[0] for c, _ in SEPO_CKPTS), key=selection)


def fabricate(root: Path) -> list[dict]:
    """Write the fixture sweep under `root`; returns every results payload written."""
    written = []
    for game in GAMES:
        for model in MODELS:

            def run(stage: str, game: str = game, model: str = model) -> Path:
                return root / f"game={game},model={model},stage={stage}" / "seed_42"

            written.append(write_result(run("eval") / "results.json", game, model, "eval", None, None))
            (run("eval") / "DONE").write_text("{}")
            if (game, model, "sft") == FAILED_CELL:
                (run("sft") / ".hydra").mkdir(parents=True)
                (run("sft") / ".hydra" / "config.yaml").write_text(
                    f"game:\n  name: {game}\nmodel:\n  name: {model}\nstage:\n  name: sft\nseed: 42\n"
                )
                (run("sft") / "FAILED").write_text("RuntimeError: CUDA out of memory\n\ntraceback...")
            elif (game, model, "sft") != MISSING_CELL:
                written.append(
                    write_result(run("sft") / "eval" / "final" / "results.json", game, model, "sft", "final", 50)
                )
                (run("sft") / "DONE").write_text("{}")
            for ckpt, step in SEPO_CKPTS:
                written.append(
                    write_result(run("sepo") / "eval" / ckpt / "results.json", game, model, "sepo", ckpt, step)
                )
            (run("sepo") / "DONE").write_text("{}")
    return written


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("sweep")
    payloads = fabricate(root)
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.tables", str(root)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return root, payloads


def body_rows(latex: str) -> tuple[list[str], list[list[str]], list[list[list[str]]]]:
    """(header cells, all data rows, data rows grouped by model) of a Styler booktabs table."""
    lines = latex.splitlines()
    top = lines.index(r"\toprule")
    header = split(lines[top + 1])
    rows, groups = [], []
    for line in lines[top + 2 : lines.index(r"\bottomrule")]:
        if line.startswith(r"\multicolumn"):
            groups.append([])
        elif line != r"\midrule":
            rows.append(split(line))
            if not groups:  # a table without model groups (SFT degradation)
                groups.append([])
            groups[-1].append(rows[-1])
    return header, rows, groups


def split(line: str) -> list[str]:
    return [cell.strip() for cell in line.removesuffix(r"\\").strip().split(" & ")]


def value(cell: str) -> tuple[float | None, bool]:
    """(number shown, whether bold) of a table cell; None for --, n/a and labels."""
    bold = cell.startswith(r"\textbf{")
    match = re.match(r"(\\textbf\{)?([+-]?\d+\.\d+)", cell)
    return (float(match.group(2)) if match else None), bold


def test_collect_one_row_per_run_and_checkpoint(sweep):
    root, payloads = sweep
    df = collect.collect_dir(root)
    assert len(df) == len(payloads) + 1  # + the failed run without results
    failed = df[df["status"] == "failed"]
    assert len(failed) == 1
    assert failed.iloc[0][["game", "model", "phase"]].tolist() == list(FAILED_CELL)
    assert failed.iloc[0]["error"] == "RuntimeError: CUDA out of memory"
    assert failed.iloc[0][list(METRICS)].isna().all()  # a failed run has no numbers, not zeros
    assert set(df["phase"].dropna()) == {"base", "sft", "sepo"}
    row = df[(df["game"] == "ipd") & (df["model"] == "gemma4") & (df["checkpoint"] == "step_50")].iloc[0]
    metrics, se = numbers("ipd", "gemma4", "sepo", "step_50")
    assert row["safety"] == metrics["safety"]
    assert row["safety_se"] == se["safety"]
    assert row["step"] == 50


def test_game_tables_layout_bold_and_missing_cells(sweep):
    root, _ = sweep
    for game in GAMES:
        latex = (root / "tables" / f"table_{game}.tex").read_text()
        header, rows, groups = body_rows(latex)
        assert all(len(r) == len(header) for r in rows), latex
        assert len(groups) == len(MODELS)
        assert r"\textit{Gemma 4 E4B-it}" in latex
        assert r"\textit{Qwen 3.5-4B}" in latex
        assert "0.000" not in latex
        for j, head in enumerate(header):
            if r"\uparrow" not in head and r"\downarrow" not in head:
                continue
            for group in groups:
                shown = [value(r[j]) for r in group]
                numbers_ = [v for v, _ in shown if v is not None]
                if len(numbers_) < 2:  # a lone value is not "best": nothing bold
                    assert not any(b for _, b in shown), (game, head, group)
                    continue
                best = max(numbers_) if r"\uparrow" in head else min(numbers_)
                assert [v for v, b in shown if b], (game, head, group)
                assert all(v == best for v, b in shown if b), (game, head, group)
                assert all(b for v, b in shown if v == best)
    ipd = (root / "tables" / "table_ipd.tex").read_text()
    qwen_sft = next(line for line in ipd.splitlines() if line.startswith("SFT") and "dagger" in line)
    assert qwen_sft.count(r"--$^\dagger$") == 5
    assert r"$^\dagger$: run failed" in ipd
    kuhn = (root / "tables" / "table_kuhn.tex").read_text()
    assert "--: not run" in kuhn
    assert "Exploit (exact)" in kuhn
    assert "n/a: not measured" in kuhn
    assert r"\begin{tabular}{@{}llcccc@{}}" in kuhn


def test_sepo_row_is_the_highest_safety_checkpoint(sweep):
    root, _ = sweep
    ipd = (root / "tables" / "table_ipd.tex").read_text()
    for model in MODELS:
        safeties = {ckpt: numbers("ipd", model, "sepo", ckpt)[0]["safety"] for ckpt, _ in SEPO_CKPTS}
        best = max(safeties, key=safeties.get)
        label = "final" if best == "final" else f"step {dict(SEPO_CKPTS)[best]}"
        assert f"SEPO ({label}) &" in ipd
        assert f"{safeties[best]:+.3f}" in ipd


def test_sft_degradation_table(sweep):
    root, _ = sweep
    latex = (root / "tables" / "sft_degradation.tex").read_text()
    header, rows, _ = body_rows(latex)
    assert header[:5] == [r"\textbf{Game}", r"\textbf{Model}", r"\textbf{Base}", r"\textbf{SFT}", r"\textbf{SEPO}"]
    assert len(rows) == len(GAMES) * len(MODELS)
    assert all(len(r) == len(header) for r in rows)
    for row in rows:
        game = "ipd" if row[0] == "IPD" else "kuhn"
        model = "gemma4" if row[1].startswith("Gemma") else "qwen"
        base = numbers(game, model, "eval", None)[0]["exploit"]
        sepo = best_sepo_metrics(game, model)["exploit"]
        assert value(row[2])[0] == base
        assert value(row[4])[0] == sepo
        assert row[5] == (r"$\checkmark$" if sepo < base else r"$\times$" if sepo > base else "$=$")
        shown = [value(c) for c in row[2:5]]
        best = min(v for v, _ in shown if v is not None)
        assert all((v == best) == b for v, b in shown if v is not None)
    assert r"--$^\dagger$" in latex
    assert "--: not run" in latex
    assert "0.000" not in latex


def test_csv_and_figures(sweep):
    root, payloads = sweep
    out = root / "tables"
    csv = pd.read_csv(out / "results.csv")
    assert len(csv) == len(payloads) + 1
    assert {"pay", "pay_se", "exploit_exact", "exploit_exact_se", "status", "run_dir"} <= set(csv.columns)
    assert csv["status"].value_counts().to_dict() == {"done": len(payloads), "failed": 1}
    figures = out / "figures"
    for suffix in (".png", ".pdf"):
        assert (figures / f"delta_safety{suffix}").stat().st_size > 1000
        curves = list(figures.glob(f"curve_*{suffix}"))
        assert len(curves) == len(GAMES) * len(MODELS)  # the SEPO runs (SFT ones have one checkpoint)
        assert all(p.stat().st_size > 1000 for p in curves)


def test_se_option_and_out_dir(sweep, tmp_path):
    root, _ = sweep
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.tables", str(root), "--se", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    latex = (tmp_path / "table_ipd.tex").read_text()
    metrics, se = numbers("ipd", "gemma4", "eval", None)
    assert rf"{metrics['pay']:.3f} $\pm$ {se['pay']:.3f}" in latex
    header, rows, _ = body_rows(latex)
    assert all(len(r) == len(header) for r in rows)


def test_cli_errors(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.tables", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "no results.json" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.tables"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "sweep dir" in proc.stderr


def wandb_records(payloads: list[dict]) -> list[dict]:
    """The fixture as W&B would hold it: one run per run dir, training checkpoints in history."""
    runs: dict[tuple, dict] = {}
    for p in payloads:
        stage = p["stage"]
        run = runs.setdefault(
            (p["game"], p["model"], stage),
            {
                "config": {
                    "game": {"name": p["game"]},
                    "model": {"name": p["model"]},
                    "stage": {"name": stage},
                    "seed": p["seed"],
                    "lambdas": {"eval": p["lambdas"]},
                },
                "summary": {},
                "history": [],
                "state": "finished",
                "path": f"ent/proj/{p['game']}-{p['model']}-{stage}",
            },
        )
        logged = {
            **{f"eval/{k}": v for k, v in p["metrics"].items()},
            **{f"eval_se/{k}": v for k, v in p["se"].items()},
        }
        run["summary"] = logged
        if stage != "eval":
            run["history"].append({"step": p["step"], **logged})
    return list(runs.values())


def test_wandb_conversion_matches_directory_collector(sweep):
    root, payloads = sweep
    from_dir = collect.collect_dir(root)
    from_wandb = collect.frame_from_wandb(wandb_records(payloads))
    assert list(from_wandb.columns) == list(from_dir.columns)
    assert (from_wandb.dtypes == from_dir.dtypes).all()
    keys = ["game", "model", "phase", "checkpoint"]
    done = from_dir[from_dir["status"] == "done"]
    merged = done.merge(from_wandb, on=keys, suffixes=("", "_wb"), validate="one_to_one")
    assert len(merged) == len(done) == len(from_wandb)
    for col in ("step", "safety", "exploit", "exploit_exact", "pay_se"):
        pd.testing.assert_series_equal(merged[col], merged[f"{col}_wb"], check_names=False)


def test_wandb_without_login_is_a_clear_error(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="wandb login"):
        collect.collect_wandb("someone/project")


def test_cells_average_seeds_and_failed_phases():
    """Seeds of one cell are averaged (SE over seeds: std / sqrt(n); one run keeps its own SE over
    episodes); a run that failed after writing its Base results marks the later phases failed, not
    "not run"; a SEPO run trained with every lambda 0 is the payoff-only row."""
    rows = [
        collect.make_row(
            {
                "game": "ipd",
                "model": "tiny",
                "stage": "sepo",
                "checkpoint": "final",
                "step": 10,
                "seed": seed,
                "status": "done",
                "run_dir": f"s{seed}",
            },
            {"safety": safety},
            {"safety": 0.3},
        )
        for seed, safety in ((1, 1.0), (2, 2.0))
    ]
    rows.append(
        collect.make_row(
            {"game": "ipd", "model": "tiny", "stage": "base", "seed": 1, "status": "failed", "run_dir": "pipe"},
            {"safety": 0.5},
            {"safety": 0.1},
        )
    )
    df = collect.to_frame(rows)
    cell = collect.best_sepo(collect.cells(df), "ipd", "tiny")
    assert cell["safety"] == pytest.approx(1.5)
    assert cell["safety_se"] == pytest.approx(0.5)  # std 0.7071 / sqrt 2
    assert cell["runs"] == 2
    payoff_only = collect.make_row(
        {
            "game": "ipd",
            "model": "tiny",
            "stage": "sepo",
            "checkpoint": "final",
            "step": 10,
            "seed": 1,
            "status": "done",
            "run_dir": "p",
            "lambdas_train": {"e": 0, "c": 0.0, "x": 0},
        },
        {"safety": -3.0},
        {"safety": 0.25},
    )
    c = collect.cells(collect.to_frame([*rows, payoff_only]))
    alone = collect.best_sepo(c, "ipd", "tiny", phase=collect.PAYOFF_ONLY)
    assert (alone["safety"], alone["safety_se"], alone["runs"]) == (-3.0, 0.25, 1)
    assert collect.best_sepo(c, "ipd", "tiny")["safety"] == pytest.approx(1.5)  # not averaged with payoff-only
    assert collect.failed_phases(df, "ipd", "tiny") == {"sft", "sepo"}


def test_kuhn_best_checkpoint_uses_the_exact_exploitability():
    """Pool exploit is biased upward on Kuhn (docs/spec.md §3): the best checkpoint swaps it for exploit_exact."""

    def row(ckpt, step, safety, exploit, exact):
        return collect.make_row(
            {
                "game": "kuhn",
                "model": "tiny",
                "stage": "sepo",
                "checkpoint": ckpt,
                "step": step,
                "seed": 42,
                "status": "done",
                "run_dir": "r",
            },
            {"safety": safety, "exploit": exploit, "exploit_exact": exact},
            {},
            {"e": 1.5},
        )

    # step 25 looks safer on the noisy pool estimate (0.6 + 1.5 * 0.0), but its exact exploitability is worse:
    # selection safety 0.6 + 1.5 * (0.0 - 0.4) = 0.0 against 0.3 + 1.5 * (0.2 - 0.05) = 0.525
    df = collect.to_frame([row("step_25", 25, 0.6, 0.0, 0.4), row("final", 50, 0.3, 0.2, 0.05)])
    assert collect.best_sepo(collect.cells(df), "kuhn", "tiny")["checkpoint"] == "final"
    assert collect.selection_safety(df).tolist() == pytest.approx([0.0, 0.525], abs=1e-12)


def test_kuhn_tables_show_the_exact_exploitability_with_its_standard_error():
    """exploit_exact is estimated from sampled answers (docs/spec.md §6): its SE is shown even without --se."""

    def row(phase_stage, ckpt, step, exact, exact_se):
        return collect.make_row(
            {
                "game": "kuhn",
                "model": "tiny",
                "stage": phase_stage,
                "checkpoint": ckpt,
                "step": step,
                "seed": 42,
                "status": "done",
                "run_dir": phase_stage,
            },
            {"pay": 0.1, "exploit": 0.0, "safety": 0.1, "nra": 0.2, "exploit_exact": exact},
            {"pay": 0.05, "exploit": 0.0, "safety": 0.05, "nra": 0.01, "exploit_exact": exact_se},
            {"e": 1.5},
        )

    df = collect.to_frame([row("sft", "final", 500, 0.104, 0.0097), row("sepo", "final", 80, 0.061, 0.0071)])
    table = tables.game_table(df, collect.cells(df), "kuhn")
    assert r"0.104 $\pm$ 0.010" in table
    assert r"0.061 $\pm$ 0.007" in table
    assert r"0.100 $\pm$" not in table  # pay keeps the plain layout without --se


def test_the_best_checkpoint_is_chosen_on_validation_episodes_and_reported_on_the_test_ones(tmp_path):
    """step_5 is the best on the reported episodes (noise), final on the validation ones: the default
    reports final's test figures; `--choose reported` (the paper's choice) gives step_5; a run
    without validation episodes falls back to the paper's choice and says so."""
    run = tmp_path / "sweep" / "game=ipd" / "seed_42"
    for ckpt, step, test, valid in (("step_5", 5, 2.0, 0.5), ("final", 10, 1.0, 1.5)):
        for name, safety, split, seed in (
            ("results.json", test, "test", 42),
            ("validation.json", valid, "validation", 7),
        ):
            path = run / "eval" / f"step_{step}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(
                    {
                        "game": "ipd",
                        "model": "tiny",
                        "stage": "sepo",
                        "checkpoint": ckpt,
                        "step": step,
                        "split": split,
                        "seed": seed,
                        "train_seed": 0,
                        "lambdas": {"e": 1, "c": 1, "x": 1},
                        "metrics": {"safety": safety, "exploit": 0.1},
                        "se": {"safety": 0.2},
                    }
                )
            )
    (run / "DONE").write_text("{}\n")
    df = collect.collect_dir(tmp_path / "sweep")
    assert len(df) == 2
    assert sorted(df["valid_safety"]) == [0.5, 1.5]
    assert set(df["train_seed"]) == {0}
    c = collect.cells(df)
    chosen = collect.best_sepo(c, "ipd", "tiny")
    assert (chosen["checkpoint"], chosen["safety"], chosen["chosen_on"]) == ("final", 1.0, "validation")
    paper = collect.best_sepo(c, "ipd", "tiny", "reported")
    assert (paper["checkpoint"], paper["safety"], paper["chosen_on"]) == ("step_5", 2.0, "reported")

    latex = tables.game_table(df, c, "ipd")
    assert "SEPO (final)" in latex
    assert "on validation episodes" in latex
    assert "SEPO (step 5)" in tables.game_table(df, c, "ipd", choose="reported")
    assert "the paper's choice" in tables.game_table(df, c, "ipd", choose="reported")

    (run / "eval" / "step_5" / "validation.json").unlink()  # an older run: no validation episodes
    fallback = collect.best_sepo(collect.cells(collect.collect_dir(tmp_path / "sweep")), "ipd", "tiny")
    assert (fallback["checkpoint"], fallback["chosen_on"]) == ("step_5", "reported")


def test_tables_show_what_is_missing(tmp_path):
    """An unreadable results.json is a failed row with its reason; a game whose only job failed still
    gets its table, of --(dagger)."""
    import yaml

    good = tmp_path / "ipd_run"
    good.mkdir()
    (good / "results.json").write_text(
        json.dumps(
            {
                "game": "ipd",
                "model": "scripted:TFT",
                "stage": "eval",
                "seed": 42,
                "lambdas": {"e": 1, "c": 1, "x": 1},
                "metrics": {"pay": 2.0, "safety": 1.0},
                "se": {},
            }
        )
    )
    (good / "DONE").write_text("{}\n")
    broken = tmp_path / "ipd_sepo" / "eval" / "step_5"
    broken.mkdir(parents=True)
    (broken / "results.json").write_text('{"game": "ipd", "metr')  # killed mid-write
    (tmp_path / "ipd_sepo" / ".hydra").mkdir()
    (tmp_path / "ipd_sepo" / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"game": {"name": "ipd"}, "model": {"name": "tiny"}, "stage": {"name": "sepo"}, "seed": 42})
    )
    failed = tmp_path / "kuhn_run"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "game": {"name": "kuhn", "reference_strategy": "NashApx"},
                "model": {"name": "scripted", "strategy": None},
                "stage": {"name": "eval"},
                "seed": 42,
            }
        )
    )
    (failed / "FAILED").write_text("RuntimeError: boom\n")

    df = collect.collect_dir(tmp_path)
    unreadable = df[df["run_dir"] == "ipd_sepo"].iloc[0]
    assert unreadable["status"] == "failed"
    assert unreadable["error"].startswith("unreadable ipd_sepo/eval/step_5/results.json: ")  # the file, by its path
    assert unreadable["checkpoint"] == "step_5"
    assert unreadable["phase"] == "sepo"
    written = tables.write_all(df, tmp_path / "tables")
    kuhn = (tmp_path / "tables" / "table_kuhn.tex").read_text()
    assert r"--$^\dagger$" in kuhn
    assert r"$^\dagger$: run failed" in kuhn
    assert "Scripted NashApx" in kuhn
    ipd = (tmp_path / "tables" / "table_ipd.tex").read_text()
    assert r"SEPO & --$^\dagger$" in ipd  # the tiny model's SEPO cell: its only results file is unreadable
    assert any(p.name == "results.csv" for p in written)


def test_bold_cells_are_marked_on_a_reindexed_bool_frame():
    """The frame `degradation_table` hands to `render` (bool, widened by `reindex(fill_value=False)`): pandas
    3.0.6's `DataFrame.replace` raised IndexError on it on the GPU machine's image; `bold_css` marks it."""
    from analysis.tables import bold_css

    values = pd.DataFrame([[0.8, 0.5, 0.6, float("nan")]], columns=["Base", "SFT", "SEPO", "Payoff-only"])
    best = values.round(3).min(axis=1)
    bold = values.round(3).eq(best, axis=0).reindex(columns=["Game", *values.columns], fill_value=False)
    css = bold_css(bold)
    assert css.loc[0, "SFT"] == "textbf:--rwrap;"
    assert (css.drop(columns="SFT") == "").all(axis=None)
    assert list(css.columns) == list(bold.columns)
