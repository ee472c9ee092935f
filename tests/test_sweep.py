"""Sweeps through each launcher: run dirs named by overrides, failures isolated, re-launch skips DONE."""

from __future__ import annotations

import json

import pytest

LAUNCHERS = {"basic": [], "joblib": ["+launch=local"], "submitit_local": ["+launch=submitit_local"]}
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


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_jobs_share_the_cores_and_the_users_setting_wins(cli, tmp_path, launcher):
    """joblib: cores // n_jobs (2) threads per job; submitit: its cpus_per_task (1); OMP_NUM_THREADS: that."""
    from joblib import cpu_count

    proc = cli("-m", *LAUNCHERS[launcher], *CHEAP, "game=ipd,kuhn", env={"OMP_NUM_THREADS": None})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert job_threads(tmp_path) == [max(cpu_count() // 2, 1) if launcher == "joblib" else 1] * 2

    explicit = cli("-m", *LAUNCHERS[launcher], *CHEAP, "game=ipd,kuhn", "resume=never", env={"OMP_NUM_THREADS": "3"})
    assert explicit.returncode == 0, explicit.stderr[-2000:]
    assert job_threads(tmp_path) == [3, 3]


def test_failed_job_is_isolated_and_relaunch_skips_done_jobs(cli, tmp_path):
    args = ["-m", *LAUNCHERS["joblib"], *CHEAP, "model.strategy=TFT,Grim,NotAStrategy"]
    first = cli(*args)
    assert first.returncode == 1 and "2 done, 1 failed, 0 skipped" in first.stdout  # a failed job fails the sweep
    failed = summary(tmp_path)["failed"]
    assert len(failed) == 1 and "NotAStrategy" in failed[0]
    results_before = {p: p.stat().st_mtime_ns for p in (tmp_path / "outputs").rglob("results.json")}

    second = cli(*args)
    assert second.returncode == 1 and "0 done, 1 failed, 2 skipped" in second.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "outputs").rglob("results.json")} == results_before


def test_a_sweep_whose_every_job_fails_exits_1_and_one_that_skips_exits_0(cli, tmp_path):
    bad = cli("-m", *CHEAP, "game=ipd,kuhn", "seed=-1")
    assert bad.returncode == 1 and "0 done, 2 failed, 0 skipped" in bad.stdout
    cli("-m", *CHEAP, "game=ipd")
    again = cli("-m", *CHEAP, "game=ipd")
    assert again.returncode == 0 and "0 done, 0 failed, 1 skipped" in again.stdout
