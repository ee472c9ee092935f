"""Sweeps through each launcher: run dirs named by overrides, failures isolated, re-launch skips DONE."""

from __future__ import annotations

import json
import os

import pytest

LAUNCHERS = {"basic": [], "local": ["+launch=local"], "submitit_local": ["+launch=submitit_local"]}
CHEAP = ["stage=eval", "model=scripted", "logger=none", "eval.progress=false", "eval.episodes_per_opponent=2"]


def summary(tmp_path):
    return json.loads((tmp_path / "outputs" / "sweeps" / "default" / "sweep_summary.json").read_text())


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_cheap_jobs_through_each_launcher(cli, tmp_path, launcher):
    proc = cli("-m", *LAUNCHERS[launcher], *CHEAP, "game=ipd,kuhn")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 done, 0 failed, 0 skipped" in proc.stdout
    dirs = sorted(p.parent.parent.name for p in (tmp_path / "outputs" / "sweeps").rglob("DONE"))
    expected = sorted(
        ",".join(sorted([*(a for a in CHEAP if not a.startswith("logger")), f"game={g}"])).replace("=false", "=False")
        for g in ("ipd", "kuhn")
    )
    assert dirs == expected  # named by the overrides (logger excluded), so a re-launch finds them
    games = sorted(json.loads(p.read_text())["game"] for p in (tmp_path / "outputs").rglob("results.json"))
    assert games == ["ipd", "kuhn"]


def job_threads(tmp_path) -> list[int]:
    return [json.loads(p.read_text())["torch_threads"] for p in (tmp_path / "outputs").rglob("launch_status.json")]


@pytest.mark.parametrize("launcher", ["local", pytest.param("submitit_local", marks=pytest.mark.slow)])
def test_parallel_jobs_share_the_cores_and_the_users_setting_wins(cli, tmp_path, launcher):
    """local: cores // n_jobs (2) threads per job; submitit: its cpus_per_task (1); OMP_NUM_THREADS: that."""
    proc = cli("-m", *LAUNCHERS[launcher], *CHEAP, "game=ipd,kuhn", env={"OMP_NUM_THREADS": None})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert job_threads(tmp_path) == [max((os.cpu_count() or 1) // 2, 1) if launcher == "local" else 1] * 2

    explicit = cli("-m", *LAUNCHERS[launcher], *CHEAP, "game=ipd,kuhn", "resume=never", env={"OMP_NUM_THREADS": "3"})
    assert explicit.returncode == 0, explicit.stderr[-2000:]
    assert job_threads(tmp_path) == [3, 3]


def test_failed_job_is_isolated_and_relaunch_skips_done_jobs(cli, tmp_path):
    args = ["-m", *LAUNCHERS["local"], *CHEAP, "model.strategy=TFT,Grim,NotAStrategy"]
    first = cli(*args)
    assert first.returncode == 1
    assert "2 done, 1 failed, 0 skipped" in first.stdout  # a failed job fails the sweep
    failed = summary(tmp_path)["failed"]
    assert len(failed) == 1
    assert "NotAStrategy" in failed[0]
    results_before = {p: p.stat().st_mtime_ns for p in (tmp_path / "outputs").rglob("results.json")}

    second = cli(*args)
    assert second.returncode == 1
    assert "0 done, 1 failed, 2 skipped" in second.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "outputs").rglob("results.json")} == results_before


def test_a_sweep_whose_every_job_fails_exits_1_and_one_that_skips_exits_0(cli, tmp_path):
    bad = cli("-m", *CHEAP, "game=ipd,kuhn", "seed=-1")
    assert bad.returncode == 1
    assert "0 done, 2 failed, 0 skipped" in bad.stdout
    cli("-m", *CHEAP, "game=ipd")
    again = cli("-m", *CHEAP, "game=ipd")
    assert again.returncode == 0
    assert "0 done, 0 failed, 1 skipped" in again.stdout


@pytest.mark.slow
def test_a_killed_job_fails_alone_and_the_summary_says_which(cli, tmp_path):
    """The probe: a joblib sweep with one worker SIGKILLed printed a 43-line traceback, aborted the other
    job and left no FAILED and no summary. Here one SEPO job SIGKILLs itself after its first step."""
    from sepo.builders.tiny import build_tiny

    from .conftest import model_cfg

    tiny = build_tiny(model_cfg("tiny"), tmp_path / ".cache")
    proc = cli(
        "-m",
        *LAUNCHERS["local"],
        "stage=sepo",
        "model=tiny",
        f"model.path={tiny}",
        "logger=none",
        "sepo.steps=2",
        "sepo.rollouts_per_opponent=2",
        "sepo.max_new_tokens=8",
        "sepo.checkpoint_steps=[]",
        "eval.episodes_per_opponent=2",
        "eval.max_new_tokens=8",
        "eval.progress=false",
        "sepo.debug_kill_after_step=1,null",
        "hydra.job.config.override_dirname.exclude_keys=[seed,logger]",  # the kill hook names its dir here
        env={"OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 done, 1 failed, 0 skipped" in proc.stdout, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr
    (failed,) = summary(tmp_path)["failed"]
    assert "ended without a marker" in failed
    (done,) = [p.parent for p in (tmp_path / "outputs").rglob("DONE")]
    assert (done / "eval" / "step_2" / "results.json").exists()
