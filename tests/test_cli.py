"""The task wrapper and the scripted eval through the real CLI: results.json, DONE, FAILED, resume."""

from __future__ import annotations

import json

import pytest

import sepo.stages
from sepo.run.task import run_task

from .conftest import read_results, run_dirs

RESULT_KEYS = {
    "game",
    "model",
    "stage",
    "checkpoint",
    "step",
    "seed",
    "lambdas",
    "metrics",
    "se",
    "per_opponent",
    "episodes",
}
METRIC_KEYS = {"pay", "exploit", "exploit_max", "collusion", "ext", "robust", "safety", "nra", "parse_rate"}


def test_scripted_eval_writes_results_and_done(cli, tmp_path):
    proc = cli(
        "stage=eval", "model=scripted", "model.strategy=TFT", "game=ipd", "game.pools.exploit=[AlwaysD]", "logger=none"
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = run_dirs(tmp_path)
    assert (run / "DONE").exists()
    assert not (run / "FAILED").exists()
    results = read_results(tmp_path)
    assert RESULT_KEYS <= set(results)
    assert METRIC_KEYS <= set(results["metrics"]) == set(results["se"])
    assert results["metrics"]["exploit"] == pytest.approx(0.625)
    assert results["model"] == "scripted:TFT"
    assert results["episodes"] == 20 * 9  # 9 distinct opponents over all pools
    assert {o["pool"] for o in results["per_opponent"]} == {"train", "exploit", "collusive", "robust"}
    assert "game.pools.exploit=[AlwaysD]" in str(run)  # run dirs are named by their overrides
    (vs_defector, *_) = [e for e in results["per_episode"] if e["opponent"] == "AlwaysD"]
    assert vs_defector["actions"] == [["COOPERATE", "DEFECT"]] + [["DEFECT", "DEFECT"]] * 7  # TFT's rounds


def test_default_scripted_agent_is_the_games_reference_strategy(cli, tmp_path):
    proc = cli("stage=eval", "model=scripted", "logger=none")
    assert proc.returncode == 0, proc.stderr
    assert read_results(tmp_path)["model"] == "scripted:TFT"
    assert read_results(tmp_path)["metrics"]["exploit"] == pytest.approx(0.3125)


def test_finished_run_is_skipped_and_failed_run_leaves_marker(compose_cfg, tmp_path, monkeypatch):
    cfg = compose_cfg("stage=eval", "model=scripted")
    run_task(cfg)
    assert (tmp_path / "DONE").exists()
    (tmp_path / "results.json").write_text("{}")  # a skipped run must not rewrite its results
    assert run_task(cfg) is None
    assert (tmp_path / "results.json").read_text() == "{}"

    def broken(cfg, tracker):
        (tmp_path / "partial.json").write_text("kept")
        raise RuntimeError("boom")

    monkeypatch.setitem(sepo.stages.STAGES, "eval", "tests.test_cli:broken_stage")
    (tmp_path / "DONE").unlink()
    with pytest.raises(RuntimeError, match="boom"):
        run_task(cfg)
    assert "RuntimeError: boom" in (tmp_path / "FAILED").read_text()
    assert not (tmp_path / "DONE").exists()
    assert (tmp_path / "partial.json").read_text() == "kept"


def broken_stage(cfg, tracker):
    (__import__("pathlib").Path(cfg.paths.output_dir) / "partial.json").write_text("kept")
    raise RuntimeError("boom")


def test_sweep_keeps_going_past_a_failed_job(cli, tmp_path):
    proc = cli(
        "-m", "stage=eval", "model=scripted", "model.strategy=TFT,Nope", "logger=none", "eval.episodes_per_opponent=2"
    )
    assert proc.returncode == 1, proc.stderr  # the other job still ran; the sweep as a whole failed
    done = sorted(p.parent.name for p in (tmp_path / "outputs").rglob("DONE"))
    failed = [p for p in (tmp_path / "outputs").rglob("FAILED")]
    assert len(done) == 1
    assert len(failed) == 1
    assert "model.strategy: unknown ipd strategy 'Nope'" in failed[0].read_text()
    assert json.loads(next((tmp_path / "outputs").rglob("results.json")).read_text())["model"] == "scripted:TFT"


def test_long_override_lists_give_bounded_stable_run_names():
    from sepo.run.compose import MAX_RUN_NAME, run_name

    long = ",".join(f"game.pools.train=[TFT,Mixed,Grim,GenerousTFT]{i}" for i in range(10))
    name = run_name(long)
    assert len(name.encode()) <= MAX_RUN_NAME
    assert name == run_name(long) != run_name(long + "x")
    assert run_name("") == "default"
    assert run_name("a=b/c") == "a=b_c"


def test_a_finished_run_is_reused_only_with_the_same_settings(cli, tmp_path):
    """The same run dir asked for with another game is refused in one line naming the key; the finished
    run keeps its results and its own .hydra record; a result-neutral key (eval.progress) is still a skip."""
    run = tmp_path / "run"
    args = ["stage=eval", "model=scripted", "logger=none", "eval.episodes_per_opponent=2", f"hydra.run.dir={run}"]
    assert cli(*args, "game=ipd").returncode == 0
    again = cli(*args, "game=ipd", "eval.progress=false")
    assert again.returncode == 0
    assert "skipping" in again.stdout + again.stderr

    other = cli(*args, "game=kuhn")
    assert other.returncode == 2, other.stderr[-2000:]
    lines = [line for line in other.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    assert "game.name='ipd' (now 'kuhn')" in lines[0], lines
    assert "; allowed: " in lines[0]
    assert not (run / "FAILED").exists()
    assert (run / "DONE").exists()
    assert json.loads((run / "results.json").read_text())["game"] == "ipd"
    assert "name: ipd" in (run / ".hydra" / "config.yaml").read_text()
