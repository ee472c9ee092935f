"""A paper plan's committed archive (launch/archive.py): what it keeps of a run, and how a plan resumes from it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from launch import archive, tiny_paper
from launch.tiny_paper import drop_stale_runs, expand, job_dirs, phases, resume_from_archive

SUMMARY = ("run_settings.yaml", "eval/step_5/results.json", "eval/step_5/validation.json")
WEIGHTS = ("merged/model.safetensors", "adapter/adapter_model.safetensors", "checkpoints/step_5/optimizer.pt")


def finished_run(run: Path, files=SUMMARY + WEIGHTS, done=True) -> Path:
    for name in files:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(name)
    (run / ".hydra").mkdir(exist_ok=True)
    (run / ".hydra" / "config.yaml").write_text("{}")
    if done:
        (run / "DONE").write_text("{}\n")
    return run


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_the_archive_keeps_what_the_tables_read_of_finished_runs_and_no_weights(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    finished_run(out / "sepo_ipd" / "lambdas_ipd" / "sepo_seed_0")
    finished_run(out / "sepo_ipd" / "lambdas_zero" / "sepo_seed_0", done=False)  # killed: nothing of it is kept
    assert archive.keep(out / "sepo_ipd", kept / "sepo_ipd") == [Path("lambdas_ipd/sepo_seed_0")]
    assert files_under(kept) == {f"sepo_ipd/lambdas_ipd/sepo_seed_0/{f}" for f in (*SUMMARY, "DONE")}
    assert archive.keep(out / "sepo_ipd", kept / "sepo_ipd") == []  # already there: not copied again


def test_a_pipeline_is_kept_as_one_run_with_its_phases_inside(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    pipeline = finished_run(out / "seed_1", files=("run_settings.yaml",))
    finished_run(pipeline / "sft", files=("eval/sft/results.json", "merged/model.safetensors"))
    finished_run(pipeline / "sepo", files=SUMMARY[1:])
    assert archive.finished_runs(out) == [pipeline]
    archive.keep(out, kept)
    assert files_under(kept) == {
        "seed_1/DONE",
        "seed_1/run_settings.yaml",
        "seed_1/sft/DONE",
        "seed_1/sft/eval/sft/results.json",
        "seed_1/sepo/DONE",
        *(f"seed_1/sepo/{f}" for f in SUMMARY[1:]),
    }


def test_a_run_finished_again_replaces_its_kept_copy(tmp_path):
    """An SFT trained again for its model (its weights were not kept) finishes anew: its new evaluation, which the
    runs started from it see, replaces the kept one."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    run = finished_run(out / "sft" / "ipd" / "sft_seed_0")
    archive.keep(out, kept)
    (run / "eval" / "step_5" / "results.json").write_text("trained again")
    os.utime(run / "DONE", (1, 1))
    assert archive.keep(out, kept) == [Path("sft/ipd/sft_seed_0")]
    assert (kept / "sft/ipd/sft_seed_0/eval/step_5/results.json").read_text() == "trained again"


def plan_jobs(out: Path) -> dict[tuple[str, str], tuple[Path, Path | None]]:
    """{(phase, run dir name): (run dir, model it starts from)} of tiny's plan on IPD with one seed."""
    jobs = {}
    for phase in phases(out, [0], ("ipd",), "tiny"):
        for line in expand(phase, out, []):
            run, model = job_dirs(line)
            jobs[(phase.name, str(run.relative_to(out / phase.name)))] = (run, model)
    return jobs


def test_the_plan_resumes_from_the_archive_and_trains_again_only_the_sft_a_pending_job_needs(tmp_path):
    """Every job of tiny's IPD plan finished in an earlier session and was kept, except payoff-only: in a fresh
    root the finished jobs come back (the sweep skips them by their DONE), and the IPD SFT, whose model payoff-only
    starts from, is left to train again."""
    first, fresh, kept = tmp_path / "first" / "tiny_paper", tmp_path / "fresh" / "tiny_paper", tmp_path / "kept"
    jobs = plan_jobs(first)
    assert set(jobs) == {
        ("sft", "ipd/sft_seed_0"),
        ("base", "ipd"),
        ("sepo_ipd", "lambdas_ipd/sepo_seed_0"),
        ("sepo_ipd", "lambdas_zero/sepo_seed_0"),
    }
    for (phase, name), (run, _) in jobs.items():
        finished_run(run, done=name != "lambdas_zero/sepo_seed_0")
        archive.keep(first / phase, kept / "tiny_paper" / phase)

    resume_from_archive(phases(fresh, [0], ("ipd",), "tiny"), fresh, [], kept / "tiny_paper")
    done = {key for key, (run, _) in plan_jobs(fresh).items() if (run / "DONE").is_file()}
    assert done == {("base", "ipd"), ("sepo_ipd", "lambdas_ipd/sepo_seed_0")}
    assert not (fresh / "sft" / "ipd" / "sft_seed_0").exists()  # trains again: payoff-only starts from its model
    assert files_under(fresh / "base") == {f"ipd/{f}" for f in (*SUMMARY, "DONE")}


def test_a_put_back_sft_without_weights_loses_its_done_when_a_job_needs_its_model(tmp_path):
    """A later launch adds a job (another arm) that starts from an SFT put back without its model: its DONE goes,
    so the sweep trains it again instead of skipping it and failing the new job."""
    run = finished_run(tmp_path / "sft" / "ipd" / "sft_seed_0", files=SUMMARY)
    assert archive.unmark_modelless({run / "merged"}) == [run]
    assert not (run / "DONE").exists()
    with_model = finished_run(tmp_path / "sft" / "kuhn" / "sft_seed_0")
    assert archive.unmark_modelless({with_model / "merged"}) == []
    assert (with_model / "DONE").is_file()


def evaluated_sft(run: Path, exploit: float) -> Path:
    """A finished SFT run (with its model) whose evaluation read `exploit`."""
    finished_run(run, files=("run_settings.yaml", "merged/model.safetensors"))
    (run / "eval" / "sft").mkdir(parents=True, exist_ok=True)
    (run / "eval" / "sft" / "results.json").write_text(json.dumps({"metrics": {"exploit": exploit}, "se": {}}))
    return run


def test_an_sft_trained_again_as_another_draw_sends_the_runs_from_its_old_draw_back_to_run(tmp_path):
    """Payoff-only is pending, so the IPD SFT trains again; SEPO, finished and archived, started from its earlier
    draw. Trained again the same (one machine), SEPO stays finished; trained again otherwise (another machine's
    floating-point order), SEPO leaves the run dir and the archive, so that it runs again from the new draw."""
    for draw, stays in ((0.5, True), (0.25, False)):
        first, fresh, kept = (tmp_path / str(draw) / d / "tiny_paper" for d in ("first", "fresh", "kept"))
        jobs = plan_jobs(first)
        for (phase, name), (run, _) in jobs.items():
            if phase == "sft":
                evaluated_sft(run, exploit=0.5)
            else:
                finished_run(run, done=name != "lambdas_zero/sepo_seed_0")
            archive.keep(first / phase, kept / phase)
        plan = phases(fresh, [0], ("ipd",), "tiny")
        resume_from_archive(plan, fresh, [], kept)
        sepo = fresh / "sepo_ipd" / "lambdas_ipd" / "sepo_seed_0"
        assert drop_stale_runs(plan, fresh, [], kept) == []  # the SFT has not finished again yet
        evaluated_sft(fresh / "sft" / "ipd" / "sft_seed_0", exploit=draw)  # the sft phase trains it again
        os.utime(fresh / "sft" / "ipd" / "sft_seed_0" / "DONE", (1, 1))  # a finish of its own, not the archived one
        assert drop_stale_runs(plan, fresh, [], kept) == ([] if stays else [sepo])
        assert (sepo / "DONE").is_file() is stays
        assert (kept / "sepo_ipd" / "lambdas_ipd" / "sepo_seed_0" / "DONE").is_file() is stays
        assert (fresh / "base" / "ipd" / "DONE").is_file()  # Base starts from no SFT: it stays either way
        archive.keep(fresh / "sft", kept / "sft")  # the new draw archived: nothing is stale any more
        assert drop_stale_runs(plan, fresh, [], kept) == []


def test_the_launcher_keeps_runs_while_a_phase_still_runs(tmp_path):
    """A phase of long jobs can outlast a session: `run` calls its keeper while the sweep runs, not only after."""
    calls = []
    code = tiny_paper.run(
        [sys.executable, "-c", "import time; time.sleep(0.5)"], meanwhile=lambda: calls.append(1), every_s=0.1
    )
    assert code == 0 and len(calls) >= 3
