"""Forked workers (sepo/forked.py): independent parts of a CPU job side by side in child processes. The
results come back in order, a child's failure or death fails the job with its reason, and an evaluation
split over workers plays the very episodes it plays whole."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf

from sepo.arena import play
from sepo.errors import RunError
from sepo.forked import WorkerDied, forked_map, split_round_robin, worker_count
from sepo.games import make_game
from sepo.games.strategy import get_strategy
from sepo.policies import ScriptedPolicy

from .conftest import CONF, ROOT


def test_parts_come_back_in_order_each_from_its_own_process_and_the_threads_are_restored():
    threads = torch.get_num_threads()
    got = forked_map(lambda part: (part, os.getpid(), torch.get_num_threads()), ["a", "b", "c"])
    assert [g[0] for g in got] == ["a", "b", "c"]
    assert got[0][1] == os.getpid() and len({g[1] for g in got}) == 3
    assert all(g[2] == max(1, threads // 3) for g in got)
    assert torch.get_num_threads() == threads


def test_a_failing_child_fails_the_job_with_its_traceback():
    def work(part):
        if part == 1:
            raise ValueError("bad part 1")
        return part

    with pytest.raises(RuntimeError, match="(?s)forked worker \\(pid \\d+\\) failed.*ValueError: bad part 1"):
        forked_map(work, [0, 1])


def dies(part):
    if part == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if part == 2:
        time.sleep(120)  # collected after the dead one: killed, not waited for
    return part


def test_a_child_that_dies_fails_the_job_in_one_line_naming_it_and_its_signal():
    """The probe: a SIGKILLed worker of `model.cpu_workers=2` ended the run in a traceback. A worker that dies
    is a known way for a run to fail (a RunError: FAILED and one line), and the workers after it are killed
    rather than waited for."""
    started = time.time()
    with pytest.raises(WorkerDied) as died:
        forked_map(dies, [0, 1, 2])
    assert isinstance(died.value, RunError)
    message = str(died.value)
    assert re.fullmatch(
        r"a forked worker \(pid \d+\) was killed by SIGKILL before handing back its part of the job; "
        r"re-run the same command to resume",
        message,
    ), message
    assert time.time() - started < 30


def children_forked_from(pid: int) -> list[int]:
    """Processes whose parent is `pid` and that run its command line (forks of it, not programs it started)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read() if entry.isdigit() else ""
            same = stat and open(f"/proc/{entry}/cmdline").read() == open(f"/proc/{pid}/cmdline").read()
        except OSError:
            continue
        if same and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def test_a_worker_killed_during_an_evaluation_fails_the_run_in_one_line(tmp_path):
    """The whole way: `model=tiny model.cpu_workers=2` plays its evaluation in two 1-thread processes; one
    SIGKILLed leaves FAILED naming it and one line, exit 1, no traceback."""
    run, log = tmp_path / "run", tmp_path / "stderr"
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    command = ["stage=eval", "model=tiny", "model.cpu_workers=2", "logger=none", "eval.progress=false"]
    with log.open("w") as err:
        job = subprocess.Popen(
            [sys.executable, str(ROOT / "main.py"), *command, "eval.episodes_per_opponent=4", f"hydra.run.dir={run}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        deadline = time.time() + 120
        while not (workers := children_forked_from(job.pid)) and job.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert workers, "the evaluation forked no worker"
        os.kill(workers[0], signal.SIGKILL)
        job.wait(timeout=120)
    stderr = log.read_text()
    assert job.returncode == 1, stderr[-2000:]
    assert "Traceback" not in stderr
    (line,) = [x for x in stderr.splitlines() if x.startswith("error: ")]
    assert f"a forked worker (pid {workers[0]}) was killed by SIGKILL" in line
    assert f"{run} is marked FAILED" in line
    reason = (run / "FAILED").read_text().splitlines()[0]
    assert reason.startswith(f"WorkerDied: a forked worker (pid {workers[0]}) was killed by SIGKILL")
    assert reason.endswith("re-run the same command to resume")


def test_workers_are_one_per_thread_at_most_and_one_on_a_gpu():
    assert worker_count(8) == torch.get_num_threads()
    assert worker_count(2, "cuda") == 1
    assert split_round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert split_round_robin(1, 3) == [[0]]


@pytest.mark.parametrize(
    "game_name, agent, opponents",
    [("ipd", "Mixed", ["Random", "TFT", "Mixed"]), ("kuhn", "NashApx", ["RandomLegal", "AlwaysBet"])],
)
def test_episodes_split_over_workers_are_the_episodes_played_whole(game_name, agent, opponents):
    game = make_game(OmegaConf.load(CONF / "game" / f"{game_name}.yaml"))
    pool = {n: get_strategy(game_name, n) for n in opponents}
    seen = []
    whole = play(game, ScriptedPolicy(get_strategy(game_name, agent)), pool, 5, seed=7, mirrored=True)
    split = play(
        game,
        ScriptedPolicy(get_strategy(game_name, agent)),
        pool,
        5,
        7,
        mirrored=True,
        on_episode_done=seen.append,
        workers=2,
    )
    assert len(seen) == len(split) == 5 * len(opponents)

    def trace(records):
        return [(r.opponent, r.index, r.seed, r.mirror, [x.actions for x in r.rounds], r.agent_total) for r in records]

    assert trace(split) == trace(whole)


@pytest.mark.usefixtures("offline", "one_thread")
def test_a_language_model_evaluation_split_over_workers_plays_the_same_episodes(tiny):
    """`model.cpu_workers`: the episodes are dealt to forked processes, each row keeping its own sampling
    stream, so the tiny model plays the very episodes it plays in one process."""
    from sepo.policies.lm import LMPolicy
    from sepo.stages.evaluate import evaluate_policy

    model, tokenizer, cfg = tiny
    game = make_game(OmegaConf.load(CONF / "game" / "ipd.yaml"))
    pools = {"train": ["TFT"], "exploit": ["AlwaysD"], "collusive": ["AlwaysC"], "robust": ["Random"]}
    lambdas = {"e": 1.0, "c": 1.0, "x": 1.0}
    runs = []
    for workers in (1, 2):
        agent = LMPolicy(model, tokenizer, cfg, 1.0, 12, seed=0)
        agent.workers = workers
        runs.append(evaluate_policy(game, agent, pools, lambdas, episodes=2, seed=5, progress=False))
    whole, split = runs
    assert split["episodes"] == whole["episodes"] == 8
    assert split["per_episode"] == whole["per_episode"]
    assert split["metrics"] == whole["metrics"]


def test_the_children_of_a_killed_job_die_with_it(tmp_path):
    """A preempted job leaves no worker running on: each child is killed with its parent."""
    import subprocess
    import sys
    import time

    marker = tmp_path / "child"
    script = (
        "import os, time\nfrom sepo.forked import forked_map\n"
        "def work(part):\n"
        f"    if part: open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(600)\n"
        "forked_map(work, [0, 1])\n"
    )
    job = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    deadline = time.time() + 60
    while not (marker.exists() and marker.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child = int(marker.read_text())
    job.kill()
    job.wait()

    def alive() -> bool:
        try:
            state = next(x for x in open(f"/proc/{child}/status") if x.startswith("State:"))
        except (FileNotFoundError, ProcessLookupError):
            return False
        return "Z" not in state.split()[1]  # a zombie has ended; only its reaping is left

    deadline = time.time() + 10
    while alive() and time.time() < deadline:
        time.sleep(0.1)
    assert not alive()
