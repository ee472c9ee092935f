"""The main job end to end on the tiny model, shrunk to seconds: every phase's outputs and the table."""

from __future__ import annotations

import json

from .conftest import TINY_RUN, run_dirs


def test_pipeline_runs_every_phase_and_writes_the_tables(cli, tmp_path):
    proc = cli("logger=none", *TINY_RUN)  # stage=pipeline and model=tiny are the defaults
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in run_dirs(tmp_path, "DONE") if (p / "sepo").is_dir()]
    results = {p.relative_to(run).as_posix(): json.loads(p.read_text()) for p in run.rglob("results.json")}
    assert set(results) == {
        "base/eval/base/results.json",
        "sft/eval/sft/results.json",
        "sepo/eval/step_1/results.json",
        "sepo/eval/step_2/results.json",
    }
    assert [results[k]["stage"] for k in sorted(results)] == ["base", "sepo", "sepo", "sft"]
    for step in (1, 2):  # every SEPO checkpoint also played the validation episodes that choose the best one
        valid = json.loads((run / "sepo" / "eval" / f"step_{step}" / "validation.json").read_text())
        test = results[f"sepo/eval/step_{step}/results.json"]
        assert (valid["split"], valid["seed"], test["split"], test["seed"]) == ("validation", 1000003, "test", 42)
        assert valid["per_episode"] != test["per_episode"]
        assert valid["train_seed"] == test["train_seed"] == 42
    assert "Δ SEPO−SFT" in proc.stdout
    assert "…" not in proc.stdout
    assert (run / "sft" / "merged" / "model.safetensors").exists()
    assert (run / "sepo" / "adapter").is_dir()
    table = (run / "tables" / "table_ipd.tex").read_text()
    for row in ("Base &", "SFT &", "SEPO ("):
        assert row in table
    assert "pipeline" in proc.stdout + proc.stderr
    for phase in ("base eval", "sft", "sepo"):  # each phase hands its freed memory back before the next one
        assert f"pipeline: after {phase}, resident memory" in proc.stdout + proc.stderr
    assert "SEPO pipeline" in proc.stdout

    again = cli("logger=none", *TINY_RUN)  # a finished run is skipped, its results untouched
    assert again.returncode == 0
    assert "DONE marker present" in again.stdout + again.stderr
