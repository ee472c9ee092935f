"""Ctrl-C and SIGTERM (SLURM preemption) stop a run with one line, a FAILED marker that says so, and a
re-run that completes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import ROOT

LONG_EVAL = ["stage=eval", "model=scripted", "logger=wandb", "eval.progress=false", "eval.episodes_per_opponent=400"]


def found(root, pattern: str) -> list:
    """`root.rglob(pattern)` while a run writes under it: a temporary file of an atomic write can vanish between
    the walk's listing and its look at it, and then the walk simply looks again at the next poll."""
    try:
        return list(root.rglob(pattern))
    except FileNotFoundError:
        return []


@pytest.mark.parametrize(
    "signum,code", [(signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)]
)
def test_a_signal_marks_failed_closes_the_tracker_and_a_rerun_resumes(tmp_path, cli, signum, code):
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "main.py"), *LONG_EVAL],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not found(tmp_path / "outputs", "wandb/offline-run-*") and time.time() < deadline:
        time.sleep(0.2)  # the stage has started once its tracker exists
    time.sleep(1.0)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-3000:]
    assert signal.Signals(signum).name in lines[0], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (failed,) = list((tmp_path / "outputs").rglob("FAILED"))
    assert "interrupted by " + signal.Signals(signum).name in failed.read_text()
    assert not list((tmp_path / "outputs").rglob("DONE"))
    (run,) = list((tmp_path / "outputs").rglob("wandb/offline-run-*"))
    assert list(run.glob("*.wandb"))  # the tracker wrote its file and was finished

    again = cli(*LONG_EVAL)
    assert again.returncode == 0, again.stderr[-2000:]
    assert list((tmp_path / "outputs").rglob("DONE"))
    assert not list((tmp_path / "outputs").rglob("FAILED"))
