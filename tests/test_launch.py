"""launch/: one script per paper table and one for the grid; `--dry-run` prints the jobs, submits nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def dry_run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "launch" / script), "--dry-run", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=300,
    )


def phase_counts(lines: list[str]) -> dict[str, int]:
    """{phase: jobs} from a launcher's dry run (its `# <phase>: <n> job(s) -> <dir>` lines)."""
    return {
        line.split()[1].rstrip(":"): int(line.split()[2]) for line in lines if line.startswith("# ") and "job" in line
    }


def all_games_plan(sepo_jobs_per_game: int, seeds: int) -> dict[str, int]:
    """The phases of the plan on all five games: per seed 3 SFTs and the `multi` SFT evaluated on auction and
    neg_v1, Base on every game, and each game's SEPO jobs (arms x seeds)."""
    games = ("ipd", "auction", "neg_v1", "neg_v2", "kuhn")
    return {"sft": 3 * seeds, "sft_eval": 2 * seeds, "base": 5, **{f"sepo_{g}": sepo_jobs_per_game for g in games}}


def test_a_table_script_prints_one_command_per_job():
    proc = dry_run("paper_ipd.sh", "hydra.launcher.partition=gpu")
    assert proc.returncode == 0, proc.stderr
    jobs = proc.stdout.strip().splitlines()
    assert jobs == [
        f"python main.py +experiment=paper_ipd +launch=slurm model={m} hydra.launcher.partition=gpu"
        for m in ("gemma4", "qwen")
    ]
    assert not (ROOT / "outputs" / "sweeps" / "paper_ipd" / ".submitit").exists()


def test_the_grid_is_every_game_for_both_models():
    proc = dry_run("grid.sh")
    assert proc.returncode == 0, proc.stderr
    jobs = [line.split() for line in proc.stdout.strip().splitlines()]
    cells = {(w[4], w[5]) for w in jobs}
    assert len(jobs) == 10
    assert cells == {
        (f"game={g}", f"model={m}") for g in ("ipd", "auction", "neg_v1", "neg_v2", "kuhn") for m in ("gemma4", "qwen")
    }


def test_negotiation_runs_each_model_on_its_variant():
    proc = dry_run("paper_negotiation.sh")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "python main.py +experiment=paper_negotiation +launch=slurm",  # the preset: Gemma 4 on v2
        "python main.py +experiment=paper_negotiation +launch=slurm model=qwen game=neg_v1",
    ]


def test_an_unknown_experiment_is_one_line():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "run_experiment.py"), "paper_chess", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "experiment=paper_chess" in proc.stderr
    assert "allowed: " in proc.stderr


def test_tiny_paper_dry_run_lists_every_job_of_every_phase(tmp_path):
    """Per seed 3 SFTs (multi, kuhn, neg_gt) and the multi SFT evaluated on auction and neg_v1, Base on 5 games,
    and per game SEPO and payoff-only x 2 seeds, each seed from that game's SFT of its own seed; nothing is run or
    written."""
    proc = dry_run("tiny_paper.sh", "--root", str(tmp_path), "--seeds", "0,1", "sepo.lr=1e-3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    phases = phase_counts(lines)
    assert phases == all_games_plan(sepo_jobs_per_game=4, seeds=2)
    jobs = [dict(a.split("=", 1) for a in line.split()[2:] if "=" in a) for line in lines if not line.startswith("#")]
    assert len(jobs) == sum(phases.values())
    assert all(j["sepo.lr"] == "0.001" for j in jobs)  # the user's keys reach every job
    out = tmp_path / "tiny_paper"
    trained = {(j["game"], j["sft.seed"]): j["hydra.run.dir"] for j in jobs if j.get("stage") == "sft"}
    assert trained == {(g, s): str(out / "sft" / g / f"sft_seed_{s}") for g in ("ipd", "kuhn", "neg_v2") for s in "01"}
    sft_of = {(j["game"], j["sepo.seed"]): j["model.path"] for j in jobs if j.get("stage") == "sepo"}
    assert sft_of == {
        (g, seed): trained[(s, seed)] + "/merged"
        for g, s in (("ipd", "ipd"), ("auction", "ipd"), ("neg_v1", "ipd"), ("neg_v2", "neg_v2"), ("kuhn", "kuhn"))
        for seed in "01"
    }
    evaluated = {(j["game"], j["sft.seed"]): j["model.path"] for j in jobs if j.get("eval.phase") == "sft"}
    assert evaluated == {(g, s): trained[("ipd", s)] + "/merged" for g in ("auction", "neg_v1") for s in "01"}
    arms = sorted((j["game"], j["lambdas"], j["sepo.seed"]) for j in jobs if j.get("stage") == "sepo")
    assert arms == sorted((g, lam, s) for g, s in sft_of for lam in (g, "zero"))
    assert len({j["hydra.run.dir"] for j in jobs}) == len(jobs)  # every job its own run dir
    preset_of = {line.split()[4]: line.split()[2] for line in lines if " stage=sepo " in line}
    assert preset_of == {  # IPD and Kuhn add their tuned settings to the shared preset
        "game=ipd": "+experiment=tiny_paper_ipd",
        "game=kuhn": "+experiment=tiny_paper_kuhn",
        **{f"game={g}": "+experiment=tiny_paper" for g in ("auction", "neg_v1", "neg_v2")},
    }
    others = {line.split()[2] for line in lines if not line.startswith("#") and " stage=sepo " not in line}
    assert others == {"+experiment=tiny_paper"}  # SFT, SFT evaluation, Base: the shared preset
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.parametrize(
    "games, expected",
    [
        ("neg_v1", {"sft": 3, "sft_eval": 3, "base": 1, "sepo_neg_v1": 6}),
        ("kuhn,neg_v2", {"sft": 6, "base": 2, "sepo_neg_v2": 6, "sepo_kuhn": 6}),
    ],
)
def test_tiny_paper_on_some_games_runs_only_the_sfts_they_start_from(tmp_path, games, expected):
    """One game's verdict over more seeds without the other four games' runs (neg_v1 starts from the `multi`
    SFT, trained under game=ipd, so it needs that SFT and its own SFT evaluation)."""
    proc = dry_run("tiny_paper.sh", "--root", str(tmp_path), "--seeds", "0,1,2", "--games", games)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    phases = phase_counts(lines)
    assert phases == expected
    sft_games = sorted({line.split("game=")[1].split()[0] for line in lines if " stage=sft " in line})
    assert sft_games == sorted({"neg_v1": "ipd", "kuhn": "kuhn", "neg_v2": "neg_v2"}[g] for g in games.split(","))


def test_tiny_paper_refuses_an_unknown_game_in_one_line(tmp_path):
    proc = dry_run("tiny_paper.sh", "--root", str(tmp_path), "--games", "ipd,chess")
    assert proc.returncode == 2
    assert "allowed: a comma-separated subset of ipd,auction,neg_v1,neg_v2,kuhn" in proc.stderr


def test_tiny_paper_takes_a_model_with_a_paper_preset(tmp_path):
    """`--model smollm2`: the same plan under <root>/smollm2_paper, every job with smollm2's preset (Kuhn's SEPO runs
    take smollm2's Kuhn defaults from conf/sepo/model_game/, as the pipeline does); an unknown model is refused in
    one line naming the allowed ones."""
    proc = dry_run(
        "tiny_paper.sh", "--model", "smollm2", "--root", str(tmp_path), "--seeds", "0,1,2", "--games", "kuhn"
    )
    assert proc.returncode == 0, proc.stderr
    jobs = [line.split() for line in proc.stdout.strip().splitlines() if not line.startswith("#")]
    preset = {" ".join(job[3:5]): job[2] for job in jobs}
    assert set(preset.values()) == {"+experiment=smollm2_paper"}
    assert all(f"hydra.run.dir={tmp_path / 'smollm2_paper'}" in " ".join(job) for job in jobs)
    assert sum(" stage=sepo " in " ".join(job) for job in jobs) == 6  # SEPO and payoff-only x 3 seeds

    proc = dry_run("tiny_paper.sh", "--model", "gpt5", "--root", str(tmp_path))
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--model 'gpt5': allowed: gemma4, qwen, smollm2, tiny (a model needs conf/experiment/<model>_paper.yaml)"
        )
    )


def test_the_paper_plan_on_a_full_size_model_trains_each_sft_once_per_seed(tmp_path):
    """`paper_plan.sh --model gemma4 --arms sepo`: the grid's jobs for one model with its three SFTs trained once for
    the one seed (grid.sh trains `multi` once per game), one SEPO run per game and seed, no payoff-only arm."""
    proc = dry_run("paper_plan.sh", "--model", "gemma4", "--root", str(tmp_path), "--seeds", "42", "--arms", "sepo")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    phases = phase_counts(lines)
    assert phases == all_games_plan(sepo_jobs_per_game=1, seeds=1)
    jobs = [line.split() for line in lines if not line.startswith("#")]
    assert {job[2] for job in jobs} == {"+experiment=gemma4_paper"}
    sepo = [dict(a.split("=", 1) for a in job if "=" in a) for job in jobs if "stage=sepo" in job]
    assert sorted((j["game"], j["lambdas"]) for j in sepo) == sorted(
        (g, g) for g in ("ipd", "auction", "neg_v1", "neg_v2", "kuhn")
    )


def test_a_phase_goes_to_slurm_as_one_sweep_that_hydra_waits_for(tmp_path):
    from launch import tiny_paper

    phase = tiny_paper.phases(tmp_path, [42], ("kuhn",), "qwen", ("sepo",))[0]
    slurm = tiny_paper.sweep_command(phase, tmp_path, 2, ["hydra.launcher.partition=gpu"], "slurm")
    assert "+launch=slurm" in slurm
    assert not any(a.startswith("hydra.launcher.n_jobs=") for a in slurm)  # a local launcher's key
    assert slurm[-1] == "hydra.launcher.partition=gpu"
    local = tiny_paper.sweep_command(phase, tmp_path, 2, [])
    assert "+launch=local" in local
    assert "hydra.launcher.n_jobs=2" in local


def test_the_paper_plan_refuses_an_unknown_arm_in_one_line(tmp_path):
    proc = dry_run("paper_plan.sh", "--root", str(tmp_path), "--arms", "sepo,grpo")
    assert proc.returncode == 2
    assert "--arms 'sepo,grpo': allowed: a comma-separated subset of sepo,payoff_only" in proc.stderr


def test_the_safety_benchmark_reads_each_runs_last_checkpoint_and_refuses_mixed_lengths(tmp_path):
    from launch.sepo_safety import final_step, final_steps

    for step in (5, 30, 60):
        (tmp_path / "eval" / f"step_{step}").mkdir(parents=True)
    assert final_step(tmp_path) == 60  # by number, not by name: "step_5" sorts after "step_30"
    assert final_steps({("sepo", 0): {"step": 60}, ("payoff_only", 0): {"step": 60}}) == 60
    with pytest.raises(SystemExit, match=r"\[60, 120\] steps"):
        final_steps({("sepo", 0): {"step": 60}, ("sepo", 1): {"step": 120}})
