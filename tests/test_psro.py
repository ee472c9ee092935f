"""The PSRO loop (launch/psro.py): its runs in order, and a loop killed mid-run that ends as an uninterrupted one."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch import psro

pytestmark = pytest.mark.usefixtures("offline")

ROOT = Path(__file__).resolve().parent.parent
TINY_RUNS = [
    "game.rounds=3",
    "game.pools.train=[TFT]",
    "game.pools.exploit=[AlwaysD]",
    "game.pools.collusive=[AlwaysC]",
    "game.pools.robust=[Random]",
    "logger=none",
    "eval.progress=false",
    "eval.episodes_per_opponent=2",
    "eval.max_new_tokens=4",
    "sepo.max_new_tokens=4",
    "sepo.rollouts_per_opponent=2",
    "exploiter.steps=1",
    "exploiter.groups=1",
    "exploiter.eval_episodes=2",
]


def command(sft: Path, root: Path) -> list[str]:
    return [sys.executable, "-m", "launch.psro", "--game", "ipd", "--sft", str(sft), "--iterations", "1",
            "--sepo-steps", "1", "--root", str(root), *TINY_RUNS]  # fmt: skip


def test_each_iteration_trains_sepo_against_every_earlier_exploiter_then_reads_a_fresh_one(tmp_path):
    args = argparse.Namespace(
        game="ipd", model="tiny", sft=str(tmp_path / "sft"), iterations=2, sepo_steps=5, overrides=["sepo.lr=1"]
    )
    runs = psro.steps(args, "3", tmp_path / "seed_3")
    assert [d.name for d, _ in runs] == ["exploiter_0", "sepo_1", "exploiter_1", "sepo_2", "exploiter_2"]
    by_name = {d.name: o for d, o in runs}
    assert f"exploiter.victim={(tmp_path / 'sft').absolute()}" in by_name["exploiter_0"]
    assert f"exploiter.victim={tmp_path / 'seed_3' / 'sepo_2'}" in by_name["exploiter_2"]
    pool = [o for o in by_name["sepo_2"] if o.startswith("sepo.learned_exploiters=")]
    assert pool == [
        f"sepo.learned_exploiters=[{tmp_path}/seed_3/exploiter_0/adapter,{tmp_path}/seed_3/exploiter_1/adapter]"
    ]
    assert f"sepo.init_adapter={tmp_path / 'seed_3' / 'sepo_1' / 'adapter'}" in by_name["sepo_2"]
    assert not any(o.startswith("sepo.init_adapter") for o in by_name["sepo_1"])
    assert "sepo.lr=1" in by_name["sepo_1"] and "sepo.lr=1" not in by_name["exploiter_1"]


@pytest.mark.slow
def test_a_loop_killed_mid_run_resumes_and_ends_as_the_uninterrupted_one(tiny_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    whole = subprocess.run(command(tiny_dir, tmp_path / "whole"), cwd=ROOT, env=env, capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]

    killed_root = tmp_path / "killed"
    seed_dir = killed_root / "psro" / "ipd" / "seed_0"
    loop = subprocess.Popen(command(tiny_dir, killed_root), cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while not (seed_dir / "sepo_1" / ".hydra").exists():  # the first exploiter is done, SEPO has started
        assert loop.poll() is None, "the loop ended before it could be killed"
        time.sleep(0.2)
    os.killpg(loop.pid, signal.SIGKILL)
    loop.wait()
    first = (seed_dir / "exploiter_0" / "results.json").read_bytes()
    assert not (seed_dir / "sepo_1" / "DONE").exists()

    again = subprocess.run(command(tiny_dir, killed_root), cwd=ROOT, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"hydra.run.dir={seed_dir / 'exploiter_0'}" not in again.stdout  # the finished run is not run again
    assert f"hydra.run.dir={seed_dir / 'sepo_1'}" in again.stdout
    assert (seed_dir / "exploiter_0" / "results.json").read_bytes() == first
    rows = json.loads((seed_dir / "psro.json").read_text())
    assert [r["policy"] for r in rows] == ["sft", "sepo_1"]
    assert rows == json.loads((tmp_path / "whole" / "psro" / "ipd" / "seed_0" / "psro.json").read_text())


def test_the_summary_over_seeds_pairs_the_fall_from_sft_to_the_last_iteration_by_seed():
    def rows(*learned_and_exact):
        return [{"learned_exploit": x, "pool_exploit": 0.5, "exploit_exact": e} for x, e in learned_and_exact]

    out = psro.over_seeds(
        {"0": rows((1.0, 0.4), (0.6, 0.3), (0.2, 0.1)), "1": rows((0.8, 0.2), (0.7, 0.2), (0.4, 0.2))}
    )
    assert [it["learned_exploit"]["mean"] for it in out["iterations"]] == pytest.approx([0.9, 0.65, 0.3])
    assert out["fall"]["learned_exploit"]["mean"] == pytest.approx(0.6)  # (0.8 + 0.4) / 2
    assert out["fall"]["learned_exploit"]["se"] == pytest.approx(0.2)  # sd 0.283 of the two falls, over sqrt(2)
    assert out["fall"]["pool_exploit"]["mean"] == 0.0
    assert out["exact_last_over_sft"]["mean"] == pytest.approx((0.25 + 1.0) / 2)
