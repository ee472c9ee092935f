"""A table cell holds runs that differ only in their seeds (analysis/variants.py): a λ or lr sweep in one
directory gives rows of its own, labelled by the differing keys, in the LaTeX, the CSV, the figures and
summary.json; an unfinished run's figures are marked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import collect, summary, tables, variants

ROOT = Path(__file__).resolve().parent.parent


def test_an_eval_lambda_sweep_gives_one_row_per_lambda_with_its_own_value(cli, tmp_path):
    """The probe: `stage=eval model=scripted lambdas.eval.e=0.0,2.0` used to print ONE row, the mean."""
    proc = cli(
        "-m", "stage=eval", "model=scripted", "game=ipd", "lambdas.eval.e=0.0,2.0", "eval.episodes_per_opponent=2"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep = tmp_path / "outputs" / "sweeps" / "default"
    safety = {}
    for path in sweep.rglob("results.json"):
        data = json.loads(path.read_text())
        safety[data["lambdas"]["e"]] = data["metrics"]["safety"]
    assert set(safety) == {0.0, 2.0}
    assert safety[0.0] != safety[2.0]
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.tables", str(sweep)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    latex = (sweep / "tables" / "table_ipd.tex").read_text()
    for e, value in safety.items():
        (line,) = [row for row in latex.splitlines() if rf"eval $\lambda_e$={e}" in row]
        assert f"{value:+.3f}" in line
    csv = pd.read_csv(sweep / "tables" / "results.csv")
    assert sorted(csv["variant"]) == ["eval λe=0.0", "eval λe=2.0"]


def fake_run(root: Path, name: str, stage: str, settings: dict, checkpoint: str, step, safety: float, done=True):
    """A run dir as the stages leave it: its recorded settings, a results.json, DONE (unless unfinished)."""
    run = root / name
    path = run / ("eval" if stage != "eval" else "") / (checkpoint if stage != "eval" else "") / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    phase_stage = {"sft": "sft", "sepo": "sepo", "eval": "base"}[stage]
    payload = {
        "game": "ipd",
        "model": "tiny",
        "stage": phase_stage,
        "checkpoint": checkpoint if stage != "eval" else None,
        "step": step,
        "seed": 42,
        "train_seed": settings.get("sepo.seed"),
        "lambdas": {"e": 2.4, "c": 1.0, "x": 1.8},
        "lambdas_train": {"e": settings.get("lambdas.train.e", 2.4), "c": 1.0, "x": 1.8},
        "metrics": {"safety": safety, "exploit": 0.3, "pay": 2.0, "collusion": 0.1, "ext": 0.1},
        "se": {"safety": 0.1, "exploit": 0.01, "pay": 0.1, "collusion": 0.01, "ext": 0.01},
        "per_opponent": [],
        "episodes": 10,
    }
    path.write_text(json.dumps(payload))
    base = {"stage.name": stage, "game.name": "ipd", "model.name": "tiny", "seed": 42, "sepo.lr": 0.001}
    base |= {"sepo.reward_scale": 3.0, "game.max_payoff": 3.0, "lambdas.train.e": 2.4, "lambdas.train.c": 1.0}
    base |= {"lambdas.train.x": 1.8}
    (run / "run_settings.yaml").write_text(yaml.safe_dump({**base, **settings}))
    (run / "sepo").mkdir(exist_ok=True)  # nothing: a pipeline's phase dirs look alike
    if done:
        (run / "DONE").write_text("{}")
    return run


@pytest.fixture
def lr_sweep(tmp_path):
    """One SFT; SEPO at two learning rates, two seeds each, from it (`model.path` = the SFT's merged model)."""
    sft = fake_run(tmp_path, "sft", "sft", {"sft.lr": 0.002}, "sft", 500, 1.0)
    (sft / "merged").mkdir()
    values = {}
    for lr in (0.001, 0.01):
        for seed in (0, 1):
            safety = 2.0 + (10 * lr) + 0.1 * seed
            settings = {"sepo.lr": lr, "sepo.seed": seed, "model.path": str(sft / "merged"), "sft.lr": 2.0e-5}
            fake_run(tmp_path, f"sepo_lr{lr}_s{seed}", "sepo", settings, "final", 60, safety)
            values.setdefault(lr, []).append(safety)
    return tmp_path, values


def test_runs_that_differ_in_more_than_their_seeds_are_cells_of_their_own(lr_sweep):
    root, values = lr_sweep
    df = collect.collect_dir(root)
    c = collect.cells(df)
    assert collect.variants_of(c, "ipd", "tiny", "sepo") == ["sepo.lr=0.001", "sepo.lr=0.01"]
    for lr, seeds in values.items():
        cell = collect.best_sepo(c, "ipd", "tiny", variant=f"sepo.lr={lr}")
        assert cell["runs"] == 2
        assert cell["safety"] == pytest.approx(sum(seeds) / 2)  # seeds averaged, lrs not
    # the SEPO runs' own sft.lr is not a setting of theirs: the SFT they start from (its record) is
    assert collect.variants_of(c, "ipd", "tiny", "sft") == [""]
    latex = tables.game_table(df, c, "ipd")
    assert "SEPO (sepo.lr=0.001, final)" in latex
    assert "SEPO (sepo.lr=0.01, final)" in latex
    out = summary.summarise(root)
    assert set(out) == {"ipd (sepo.lr=0.001)", "ipd (sepo.lr=0.01)"}
    got = out["ipd (sepo.lr=0.01)"]["delta_safety_vs_sft"]["mean"]
    assert got == pytest.approx(sum(values[0.01]) / 2 - 1.0, abs=1e-4)


def test_a_sepo_from_another_sft_is_another_variant(lr_sweep):
    """Two SFTs of different settings: the SEPO runs from each are told apart through their origin."""
    root, _ = lr_sweep
    other = fake_run(root, "sft_b", "sft", {"sft.lr": 0.0005}, "sft", 500, 0.5)
    (other / "merged").mkdir()
    fake_run(
        root,
        "sepo_from_b",
        "sepo",
        {"sepo.lr": 0.001, "sepo.seed": 0, "model.path": str(other / "merged")},
        "final",
        60,
        9.0,
    )
    c = collect.cells(collect.collect_dir(root))
    labels = collect.variants_of(c, "ipd", "tiny", "sepo")
    assert "sepo.lr=0.001, sft.lr=0.0005" in labels
    assert "sepo.lr=0.001, sft.lr=0.002" in labels


def test_unfinished_runs_are_marked_in_every_table(tmp_path):
    fake_run(tmp_path, "sft", "sft", {}, "sft", 500, 1.0)
    fake_run(tmp_path, "sepo", "sepo", {"sepo.seed": 0}, "step_2", 2, 1.5, done=False)  # killed at step 2
    df = collect.collect_dir(tmp_path)
    c = collect.cells(df)
    latex = tables.game_table(df, c, "ipd")
    (line,) = [row for row in latex.splitlines() if row.startswith("SEPO")]
    assert tables.UNFINISHED in line
    assert "unfinished" in latex
    assert tables.UNFINISHED not in [row for row in latex.splitlines() if row.startswith("SFT")][0]
    assert tables.UNFINISHED in tables.degradation_table(df, c)


def test_what_is_a_setting():
    assert variants.is_seed("sepo.seed")
    assert variants.is_seed("generation_seed")
    assert variants.is_seed("seed")
    assert not variants.is_seed("sepo.seeds_per_step")
    settings = {"stage.name": "sft", "sft.lr": 1, "sepo.lr": 2, "lambdas.train.e": 3, "logger.mode": "x", "seed": 4}
    assert variants.identity(settings, "sft", None) == {"sft.lr": "1"}
    assert variants.identity(settings, "base", None) == {}
    assert variants.variants({"a": {"k": "1"}, "b": {"k": "2"}, "c": None}) == {"a": "k=1", "b": "k=2", "c": ""}
