"""The memory benchmark measures the SEPO stage as a process: the real `main.py stage=sepo`, stopped after
its first step, with the kernel's count of its peak."""

import json
import subprocess
import sys

from tests.conftest import ROOT

TINY_IPD = ["game.rounds=3", "sepo.max_new_tokens=4", "sepo.rollouts_per_opponent=2", "eval.progress=false"]


def memory_benchmark(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks.speed.sepo_memory", "--model", "tiny", "--threads", "1", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_stage_runs_to_its_first_step_and_its_process_peak_is_reported(tiny_dir):
    done = memory_benchmark("--games", "ipd", "--limit-gb", "50", f"paths.cache_dir={tiny_dir.parent}", *TINY_IPD)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])["ipd"]
    # a process that imported torch and held a model: hundreds of MiB, not a section's delta
    assert 0.2 < result["peak_gib"] < 50
    assert result["within"] is True
    assert result["seconds_per_step"] > 0
    assert 0.2 < result["tree_pss_peak_gib"] <= result["peak_gib"]  # the sampled tree: the process at least
    assert "ipd      peak " in done.stderr and "PSS" in done.stderr and "within 50 GB" in done.stderr


def test_a_stage_that_ends_before_its_first_step_is_named(tiny_dir):
    done = memory_benchmark("--games", "ipd", f"paths.cache_dir={tiny_dir.parent}", "sepo.max_new_tokens=-1")
    assert done.returncode != 0
    assert "ipd: the SEPO stage ended (rc 2) before its first step" in done.stderr
    assert "sepo.max_new_tokens" in done.stderr  # the stage's own refusal, passed on
