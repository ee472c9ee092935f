"""Sweeps through each launcher: run dirs named by overrides, failures isolated, re-launch skips DONE."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sepo import run_lock

from .conftest import ROOT

LAUNCHERS = {"basic": [], "local": ["+launch=local"], "submitit_local": ["+launch=submitit_local"]}
CHEAP = ["stage=eval", "model=scripted", "logger=none", "eval.progress=false", "eval.episodes_per_opponent=2"]


#: the dir name of a CHEAP job (the result-neutral logger and eval.progress name no run)
CHEAP_JOB = "eval.episodes_per_opponent=2,model=scripted,stage=eval"


def summary(tmp_path, name="default"):
    return json.loads((tmp_path / "outputs" / "sweeps" / name / "sweep_summary.json").read_text())


def launch(tmp_path, *args: str, tag: str = "sweep") -> tuple[subprocess.Popen, Path, Path]:
    """`python main.py args` started in the background as the `cli` fixture runs it: (process, its stdout
    file, its stderr file)."""
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    out, err = tmp_path / f"{tag}.out", tmp_path / f"{tag}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "main.py"), *args], cwd=ROOT, env=env, stdout=stdout, stderr=stderr
        )
    return proc, out, err


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def counts(stdout: str) -> dict[str, int]:
    line = re.search(r"sweep \S+: (\d+) done, (\d+) failed, (\d+) skipped(?:, (\d+) busy)?", stdout)
    assert line, stdout[-2000:]
    return dict(zip(("done", "failed", "skipped", "busy"), (int(n or 0) for n in line.groups())))


def each_job_once(jobs: dict[str, list[str]]) -> list[str]:
    names = [entry.split(": ", 1)[0] for entries in jobs.values() for entry in entries]
    assert len(names) == len(set(names)), jobs
    return sorted(names)


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_cheap_jobs_through_each_launcher(cli, tmp_path, launcher):
    proc = cli("-m", *LAUNCHERS[launcher], *CHEAP, "game=ipd,kuhn")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 done, 0 failed, 0 skipped" in proc.stdout
    dirs = sorted(p.parent.parent.name for p in (tmp_path / "outputs" / "sweeps").rglob("DONE"))
    named = [a for a in CHEAP if not a.startswith(("logger", "eval.progress"))]
    expected = sorted(",".join(sorted([*named, f"game={g}"])) for g in ("ipd", "kuhn"))
    assert dirs == expected  # named by the overrides (result-neutral ones excluded), so a re-launch finds them
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


@pytest.mark.slow  # 30 s to 3 min on 2 cores, beside faster tests of the same path
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


def record_of(run: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted((run / ".hydra").iterdir())}


@pytest.mark.parametrize("launcher", ["basic", "local"])
def test_a_job_another_launch_holds_is_left_to_it_waited_for_and_listed_once(cli, tmp_path, launcher):
    """The probe: two identical sweeps started a second apart both exited 1 with every job DONE; one printed
    "1 done, 2 failed" listing a job twice, and sweep_summary.json had a job both done and failed. A job
    whose dir another launch holds is now left to it, untouched, waited for at the end, and listed once,
    as busy; the sweep succeeds once the holder has finished it."""
    assert cli("-m", *CHEAP, "seed=1").returncode == 0
    held = tmp_path / "outputs" / "sweeps" / "default" / CHEAP_JOB / "seed_1"
    before = record_of(held)
    with run_lock.hold(held):  # another launch, running it
        proc, out, err = launch(tmp_path, "-m", *LAUNCHERS[launcher], *CHEAP, "seed=1,2")
        wait_for(lambda: "waiting for 1 job" in err.read_text(), "the sweep to wait")
        assert (held.parent / "seed_2" / "DONE").exists()  # the sweep went on with its other job
        assert record_of(held) == before  # and left the held one's record as it was
    assert proc.wait(timeout=120) == 0, err.read_text()[-2000:]
    assert counts(out.read_text()) == {"done": 1, "failed": 0, "skipped": 0, "busy": 1}
    jobs = summary(tmp_path)
    assert each_job_once(jobs) == [f"{CHEAP_JOB}/seed_1", f"{CHEAP_JOB}/seed_2"]
    assert jobs["done"] == [f"{CHEAP_JOB}/seed_2"]
    (busy,) = jobs["busy"]
    assert busy == f"{CHEAP_JOB}/seed_1: held by another launch, which finished it (DONE)"


def test_a_busy_job_its_holder_leaves_unfinished_fails_the_sweep(tmp_path):
    held = tmp_path / "outputs" / "sweeps" / "default" / CHEAP_JOB / "seed_1"
    held.mkdir(parents=True)
    with run_lock.hold(held):
        proc, out, err = launch(tmp_path, "-m", *CHEAP, "seed=1,2")
        wait_for(lambda: "waiting for 1 job" in err.read_text(), "the sweep to wait")
    assert proc.wait(timeout=120) == 1
    assert counts(out.read_text()) == {"done": 1, "failed": 0, "skipped": 0, "busy": 1}
    assert f"  BUSY {CHEAP_JOB}/seed_1: held by another launch, which ended without a marker" in out.read_text()


@pytest.mark.slow  # 30 s to 3 min on 2 cores, beside faster tests of the same path
def test_two_identical_sweeps_started_together_run_each_job_once_and_both_exit_0(tmp_path):
    """The probe itself: the second sweep starts while the first is on its long job."""
    args = ["-m", *CHEAP[:-1], "eval.episodes_per_opponent=1500,2", "sweep_name=s"]
    jobs = [f"eval.episodes_per_opponent={n},model=scripted,stage=eval/seed_42" for n in (1500, 2)]
    long = tmp_path / "outputs" / "sweeps" / "s" / jobs[0]
    first, first_out, first_err = launch(tmp_path, *args, tag="first")
    wait_for(lambda: run_lock.holder(long) is not None or first.poll() is not None, "the first sweep's long job")
    second, second_out, second_err = launch(tmp_path, *args, tag="second")
    assert first.wait(timeout=300) == 0, first_err.read_text()[-2000:]
    assert second.wait(timeout=300) == 0, second_err.read_text()[-2000:]
    for out in (first_out, second_out):
        ended = counts(out.read_text())
        assert ended["failed"] == 0 and sum(ended.values()) == 2, out.read_text()[-2000:]
    assert counts(second_out.read_text())["busy"] >= 1  # it reached the long job while the first held it
    assert each_job_once(summary(tmp_path, "s")) == sorted(jobs)
    assert all((tmp_path / "outputs" / "sweeps" / "s" / job / "DONE").exists() for job in jobs)


def test_a_single_run_and_a_sweep_job_of_the_same_overrides_share_a_dir_name(cli, tmp_path):
    """The probe: `eval.progress=false` named single runs `eval.progress=false` but sweep jobs
    `eval.progress=False` (Hydra's sweeper renders a boolean with Python's str), and `paths.cache_dir=...`
    named a run though it is not where its outputs go."""
    same = [*CHEAP, "game.mirrored=false", f"paths.cache_dir={tmp_path / 'cache'}", "seed=1"]
    assert cli(*same).returncode == 0
    assert cli("-m", *same).returncode == 0
    runs, sweeps = tmp_path / "outputs" / "runs", tmp_path / "outputs" / "sweeps" / "default"
    single = [p.parent.relative_to(runs) for p in runs.rglob("DONE")]
    job = [p.parent.relative_to(sweeps) for p in sweeps.rglob("DONE")]
    assert single == job == [Path("eval.episodes_per_opponent=2,game.mirrored=false,model=scripted,stage=eval/seed_1")]
