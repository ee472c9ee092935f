"""A run dir is never resumed, reused, cleared or reported on silently wrong terms: resumes check their
settings, `resume=never` clears before it starts, one launch at a time, a rejected command removes only
what it made, and the sweep's exit code and summary come from each job's own marker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import sepo.stages
from analysis import collect
from sepo import reuse, run_lock
from sepo.run.task import run_task

EVAL = ["stage=eval", "model=scripted", "logger=none", "eval.episodes_per_opponent=2"]


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning: ")]


def test_an_unfinished_run_is_resumed_only_with_its_own_settings(cli, tmp_path):
    """The probe: a run killed before DONE, re-run into the same dir with game=kuhn, used to finish as
    kuhn on top of the IPD run's files."""
    run = tmp_path / "run"
    assert cli(*EVAL, "game=ipd", f"hydra.run.dir={run}").returncode == 0
    (run / "DONE").unlink()  # as if killed after its last result was written
    other = cli(*EVAL, "game=kuhn", f"hydra.run.dir={run}")
    assert other.returncode == 2
    (line,) = error_lines(other)
    assert "holds an unfinished run with other settings" in line
    assert "game.name='ipd' (now 'kuhn')" in line
    assert "; allowed: " in line
    assert not (run / "DONE").exists()
    assert json.loads((run / "results.json").read_text())["game"] == "ipd"
    again = cli(*EVAL, "game=ipd", f"hydra.run.dir={run}")
    assert again.returncode == 0
    assert (run / "DONE").exists()


def test_a_key_added_after_a_run_finished_counts_only_where_it_is_set_otherwise(cli, tmp_path):
    """A finished run recorded before a key existed (here `eval.temperature`, cut from its record) is reused when
    the key has its shipped default now (a new key's default keeps what runs did before it), and refused, in one
    line naming the key, when the launch sets it otherwise."""
    run = tmp_path / "run"
    assert cli(*EVAL, f"hydra.run.dir={run}").returncode == 0
    record = run / reuse.SETTINGS
    record.write_text("".join(line for line in record.read_text().splitlines(True) if "eval.temperature" not in line))
    finished = {name: (run / name).read_bytes() for name in ("DONE", "results.json")}
    again = cli(*EVAL, f"hydra.run.dir={run}")
    assert again.returncode == 0, again.stderr
    assert "DONE marker present" in (run / "cli.log").read_text()  # skipped, not run again
    assert {name: (run / name).read_bytes() for name in finished} == finished
    other = cli(*EVAL, "eval.temperature=0.1", f"hydra.run.dir={run}")
    assert other.returncode == 2
    (line,) = error_lines(other)
    assert "finished with other settings: eval.temperature='<absent>' (now 0.1)" in line


def test_a_stage_that_trains_no_sepo_is_reused_whatever_sepos_settings(cli, compose_cfg, tmp_path):
    """An evaluation (like an SFT) reads nothing under `sepo` but the seed it labels results with, so SEPO retuned
    (`sepo.lr`) reuses it, also from a record written while every stage still recorded SEPO's settings; the
    stages that train with SEPO record them all."""
    run = tmp_path / "run"
    assert cli(*EVAL, f"hydra.run.dir={run}").returncode == 0
    record = run / reuse.SETTINGS
    kept = record.read_text()
    seed = reuse.settings(compose_cfg(*EVAL))["sepo.seed"]
    assert "sepo.lr:" not in kept and f"sepo.seed: {seed}" in kept
    record.write_text(kept + "sepo.lr: 123.0\n")  # as an older record holds it
    again = cli(*EVAL, "sepo.lr=0.5", f"hydra.run.dir={run}")
    assert again.returncode == 0, again.stderr
    assert "DONE marker present" in (run / "cli.log").read_text()  # skipped, not run again
    other = cli(*EVAL, f"sepo.seed={seed + 1}", f"hydra.run.dir={run}")
    assert other.returncode == 2
    (line,) = error_lines(other)
    assert f"finished with other settings: sepo.seed={seed} (now {seed + 1})" in line
    for stage in reuse.SEPO_STAGES:
        assert "sepo.lr" in reuse.settings(compose_cfg(f"stage={stage}"))


def files_of(run) -> dict[str, tuple[bytes, int]]:
    """Every file of a run dir, its bytes and modification time; not the lock file, which any launch that
    takes the dir writes its name into and clears."""
    return {
        str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != run_lock.LOCK
    }


#: state of the run in the dir -> (what the refused launch adds to the command, what its one line says)
REFUSALS = {
    "running": ("eval.temperature=0.1", "is in use by another launch"),
    "finished": ("eval.temperature=0.1", "finished with other settings"),
    "unfinished": ("eval.temperature=0.1", "holds an unfinished run with other settings"),
    "finished, a rejected value": ("model.strategy=NotAStrategy", "unknown ipd strategy 'NotAStrategy'"),
}


@pytest.mark.parametrize("state", list(REFUSALS))
def test_a_refused_launch_leaves_the_run_dir_as_it_was(cli, tmp_path, state):
    """The probe: while a run was going in X, the same command with eval.temperature=0.1 into X was refused
    (the dir was busy), but afterwards X's .hydra/config.yaml said 0.1 and run_settings.yaml 0.8: Hydra
    writes .hydra/ before the project's lock is taken."""
    run = tmp_path / "run"
    assert cli(*EVAL, f"hydra.run.dir={run}").returncode == 0
    if state == "unfinished":
        (run / "DONE").unlink()
    before = files_of(run)
    override, says = REFUSALS[state]
    with run_lock.hold(run) if state == "running" else contextlib.nullcontext():
        refused = cli(*EVAL, override, f"hydra.run.dir={run}")
    assert refused.returncode == 2
    (line,) = error_lines(refused)
    assert says in line
    assert files_of(run) == before  # .hydra/ byte for byte, and every other file


def test_a_damaged_settings_record_is_one_line_and_runs_nothing(cli, tmp_path):
    """The probe: a tagged, list-valued or binary run_settings.yaml gave a 53-line ConstructorError
    traceback on re-run (safe_load ran nothing, rightly)."""
    run, executed = tmp_path / "run", tmp_path / "executed"
    assert cli(*EVAL, f"hydra.run.dir={run}").returncode == 0
    damaged = {
        "tagged": f"!!python/object/apply:os.system ['touch {executed}']\n".encode(),
        "a list": b"- a\n- b\n",
        "binary": bytes(range(256)),
    }
    for kind, content in damaged.items():
        if kind == "a list":
            (run / "DONE").unlink()  # an unfinished run reads its record the same way
        (run / reuse.SETTINGS).write_bytes(content)
        before = files_of(run)
        proc = cli(*EVAL, f"hydra.run.dir={run}")
        assert proc.returncode == 2, kind
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: {run / reuse.SETTINGS} is damaged ("), line
        assert line.endswith("; allowed: resume=never to start afresh, or another run dir (hydra.run.dir=...)"), line
        assert files_of(run) == before, kind
        assert not executed.exists()
    assert cli(*EVAL, "resume=never", f"hydra.run.dir={run}").returncode == 0  # what the line offers works
    assert (run / "DONE").exists()


def test_resume_never_clears_the_old_run_before_any_work(compose_cfg, tmp_path, monkeypatch):
    """The probe: `resume=never` killed mid-run left the old DONE, so the next `resume=auto` launch
    took the half-rewritten dir for a finished run."""
    run_task(compose_cfg(*EVAL))
    assert (tmp_path / "DONE").exists()
    assert (tmp_path / "results.json").exists()
    (tmp_path / "notes.txt").write_text("mine")  # a file the user keeps there is not the run's

    monkeypatch.setitem(sepo.stages.STAGES, "eval", "tests.test_run_dir_safety:dies_mid_run")
    with pytest.raises(RuntimeError, match="killed mid-run"):
        run_task(compose_cfg(*EVAL, "resume=never"))
    assert not (tmp_path / "DONE").exists()
    assert (tmp_path / "FAILED").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def dies_mid_run(cfg, tracker):
    out = __import__("pathlib").Path(cfg.paths.output_dir)
    assert not (out / "DONE").exists(), "the old run is still there"
    assert not (out / "results.json").exists(), "the old run is still there"
    raise RuntimeError("killed mid-run")


def test_one_launch_at_a_time_and_a_killed_one_is_reported(cli, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with run_lock.hold(run):
        busy = cli(*EVAL, f"hydra.run.dir={run}")
    assert busy.returncode == 2
    (line,) = error_lines(busy)
    assert "is in use by another launch" in line
    assert f"pid {os.getpid()}" in line
    assert not (run / "DONE").exists()
    assert not (run / "FAILED").exists()

    # a launch SIGKILLed mid-run leaves its name in the lock and no marker
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from sepo import run_lock; import time\nwith run_lock.hold(__import__('pathlib').Path({str(run)!r})): time.sleep(60)",
        ]
    )
    time.sleep(3)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert run_lock.died_without_marker(run)
    assert f"pid {child.pid}" in run_lock.died_without_marker(run)
    (run / "results.json").write_text(
        json.dumps({"game": "ipd", "model": "x", "stage": "eval", "metrics": {"pay": 1.0}})
    )
    status, detail = collect.run_status(run)
    assert status == "failed"
    assert detail.startswith("died without a marker")
    (run / "results.json").unlink()
    resumed = cli(*EVAL, f"hydra.run.dir={run}")
    assert resumed.returncode == 0
    assert "died without a marker; resuming it" in resumed.stderr
    assert (run / "DONE").exists()
    assert run_lock.died_without_marker(run) is None


def test_a_rejected_command_removes_only_what_it_made(cli, tmp_path):
    """The probe: `eval.temperature=-1` with hydra.run.dir naming a dir of the user's *.log files
    deleted the dir."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "old.log").write_text("kept")
    proc = cli(*EVAL, "eval.temperature=-1", f"hydra.run.dir={mine}")
    assert proc.returncode == 2
    assert sorted(p.name for p in mine.iterdir()) == ["old.log"]
    assert (mine / "old.log").read_text() == "kept"
    fresh = tmp_path / "a" / "b"
    assert cli(*EVAL, "eval.temperature=-1", f"hydra.run.dir={fresh}").returncode == 2
    assert not (tmp_path / "a").exists()  # made by this launch: gone, parents too


def test_the_exit_code_and_summary_come_from_each_jobs_marker(cli, tmp_path):
    """The probe: an empty launch_status.json in the sweep dir plus a failing job exited 0."""
    sweep = tmp_path / "outputs" / "sweeps" / "default"
    sweep.mkdir(parents=True)
    (sweep / "launch_status.json").write_text("")
    proc = cli("-m", *EVAL, "game=ipd,kuhn", "seed=-1")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-1500:]
    assert "0 done, 2 failed, 0 skipped" in proc.stdout, proc.stdout + proc.stderr[-1500:]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert len(summary["failed"]) == 2
    assert all("seed=-1" in line for line in summary["failed"])


def fills_the_disk(cfg, tracker):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_ends_in_failed_with_its_reason(compose_cfg, tmp_path, monkeypatch):
    """The probe: a full disk left a truncated results.json and an empty FAILED."""
    from sepo.files import write_text_atomically

    write_text_atomically(tmp_path / "results.json", "old, whole")
    real_replace = os.replace

    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError):
        write_text_atomically(tmp_path / "results.json", "new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / "results.json").read_text() == "old, whole"  # all or nothing
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left to fill the disk

    monkeypatch.setitem(sepo.stages.STAGES, "eval", "tests.test_run_dir_safety:fills_the_disk")
    with pytest.raises(OSError):
        run_task(compose_cfg(*EVAL))
    assert (tmp_path / "FAILED").read_text().splitlines()[0].startswith("the disk is full: OSError: ")


def runs_out_of_gpu_memory(cfg, tracker):
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 186.00 MiB.\n(100 lines of advice)")


def test_out_of_gpu_memory_is_one_line_naming_what_sizes_the_memory(compose_cfg, tmp_path, monkeypatch, capsys):
    """The first full-size SEPO run on a GPU (Qwen 3.5 4B, an H200) ended in a 100-line CUDA traceback
    that named none of the settings that size the memory."""
    monkeypatch.setitem(sepo.stages.STAGES, "eval", "tests.test_run_dir_safety:runs_out_of_gpu_memory")
    with pytest.raises(SystemExit) as exit_:
        run_task(compose_cfg(*EVAL, "sepo.micro_batch=16"))
    assert exit_.value.code == 1
    marker = (tmp_path / "FAILED").read_text()
    assert marker.startswith("OutOfMemory: out of GPU memory in stage eval (CUDA out of memory. Tried to allocate")
    assert "sepo.micro_batch (now 16)" in marker
    assert "re-run the same command to resume" in marker
    assert capsys.readouterr().err.count("\n") == 1


def test_a_finished_sweep_moved_to_another_root_is_still_the_same_sweep(cli, tmp_path):
    """The probe: a finished sweep copied elsewhere failed the reuse check on datagen.out_dir, a path
    derived from its run dir, and its message named a FAILED file that did not exist."""
    first = cli("-m", *EVAL, "game=ipd,kuhn", "paths.root_dir=" + str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr[-2000:]
    subprocess.run(["cp", "-r", str(tmp_path / "a"), str(tmp_path / "b")], check=True)
    again = cli("-m", *EVAL, "game=ipd,kuhn", "paths.root_dir=" + str(tmp_path / "b"))
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    assert "0 done, 0 failed, 2 skipped" in again.stdout, again.stdout + again.stderr[-2000:]
