"""Data-parallel SFT and SEPO under torchrun: 2 processes, gloo backend, CPU (issue 11).

SEPO splits a batch's groups across the processes and sums their gradients, so two processes must
take the very update one process takes; and a run must leave one DONE, one results.json per
checkpoint and one W&B run, however many processes trained it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT, SMALL, final_adapter, wandb_cli

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is needed",
)


def launch(args: list[str], root, processes: int, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    env.pop("PROJECT_ROOT", None)
    prefix = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        if processes > 1
        else [sys.executable]
    )
    return subprocess.run(
        [*prefix, str(ROOT / "main.py"), *args, f"paths.root_dir={root}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_two_processes_take_the_one_process_update_and_write_everything_once(tmp_path):
    cache = tmp_path / "cache"
    args = [
        *SMALL,
        "sepo.steps=2",
        "sepo.checkpoint_steps=[1]",
        "sepo.refresh_steps=1",
        "logger=wandb",
        f"paths.cache_dir={cache}",
    ]
    one = launch(args, tmp_path / "one", 1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(args, tmp_path / "two", 2)
    assert two.returncode == 0, two.stderr[-3000:]

    (run_one,) = [p.parent for p in (tmp_path / "one" / "outputs").rglob("DONE")]
    done = [p.parent for p in (tmp_path / "two" / "outputs").rglob("DONE")]
    assert len(done) == 1, done
    run_two = done[0]
    assert json.loads((run_two / "DONE").read_text())["processes"] == 2
    assert sorted(p.relative_to(run_two).as_posix() for p in run_two.rglob("results.json")) == [
        "eval/step_1/results.json",
        "eval/step_2/results.json",
    ]
    assert len(list((run_two / "wandb").glob("offline-run-*"))) == 1
    assert not list(run_two.rglob("FAILED"))

    a, b = final_adapter(run_one), final_adapter(run_two)
    assert a.keys() == b.keys()
    moved = max(float(a[k].abs().max()) for k in a if "lora_B" in k)  # LoRA's B starts at zero
    assert moved > 1e-4  # the update is not trivially zero
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    # Adam divides every coordinate by its own gradient scale, so where a gradient is ~0 the rounding
    # of summing two halves in another order shows in the weights (3.4e-6 of a ~1e-3 update with torch
    # 2.13 / transformers 5.24; a wrong batch or gradient moves them by the update itself). That the
    # gradient is the same is checked below, on the logged loss and gradient norm.
    assert worst < 0.01 * moved, (worst, moved)
    # the same gradient, not merely the same Adam step (Adam would hide a doubled gradient): the loss
    # and the gradient norm before clipping, as logged to W&B, agree step by step
    logged = [training_history(r) for r in (run_one, run_two)]
    assert [h["step"] for h in logged[0]] == [h["step"] for h in logged[1]] == [1, 2]
    for h1, h2 in zip(*logged):
        for key in ("sepo/loss", "sepo/grad_norm", "sepo/decisions", "sepo/tokens_generated", "sepo/adv_scale"):
            assert h1[key] == pytest.approx(h2[key], rel=1e-5, abs=1e-7), key
    # the batches were the same batches: the evaluation of step 1 agrees too
    r1, r2 = (json.loads((r / "eval" / "step_1" / "results.json").read_text())["metrics"] for r in (run_one, run_two))
    assert r1 == pytest.approx(r2, abs=1e-9)


@pytest.mark.slow
def test_sft_runs_data_parallel_and_rank_zero_writes_the_outputs(tmp_path):
    args = [
        "stage=sft",
        "model=tiny",
        "game=ipd",
        "logger=none",
        "sft.max_steps=2",
        "sft.max_examples=64",
        "sft.max_valid_examples=16",
        "sft.agreement_examples=8",
        "sft.eval_steps=2",
        "sft.save_steps=2",
        "eval.episodes_per_opponent=1",
        "eval.max_new_tokens=8",
        "eval.progress=false",
        "game.pools.train=[TFT]",
        "game.pools.exploit=[AlwaysD]",
        "game.pools.robust=[Random]",
        "datagen.episodes_per_opponent=4",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    proc = launch(args, tmp_path, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p.parent for p in (tmp_path / "outputs").rglob("DONE")]
    metrics = json.loads((run / "sft_metrics.json").read_text())
    assert metrics["global_step"] == 2
    assert (run / "merged").is_dir()
    assert [p.relative_to(run).as_posix() for p in run.rglob("results.json")] == ["eval/sft/results.json"]
    assert "data parallel over 2 processes" in (run / "cli.log").read_text() + proc.stderr + proc.stdout


def training_history(run) -> list[dict]:

    (wandb_dir,) = list((run / "wandb").glob("offline-run-*"))
    out = subprocess.run(
        [wandb_cli(), "leet", "inspect", "--json", str(wandb_dir)], capture_output=True, text=True, check=True
    ).stdout
    history = [json.loads(line)["history"]["item"] for line in out.splitlines() if '"type":"history"' in line]
    return [h for h in history if "sepo/loss" in h]


@pytest.mark.slow
def test_a_submitit_job_of_two_tasks_is_one_data_parallel_run(tmp_path):
    """The SLURM preset's code path (`+launch=slurm_ddp`: one task per GPU, torch's variables from
    submitit's TorchDistributedEnvironment), tried with the local executor and two CPU tasks."""
    args = [
        "-m",
        "+launch=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        *SMALL,
        "sepo.steps=2",
        "sepo.checkpoint_steps=[1]",
        "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    proc = launch(args, tmp_path, 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (done,) = list((tmp_path / "outputs").rglob("DONE"))
    assert json.loads(done.read_text())["processes"] == 2
    assert sorted(p.parent.name for p in done.parent.rglob("results.json")) == ["step_1", "step_2"]
    assert not list((tmp_path / "outputs").rglob("FAILED"))


def test_the_slurm_preset_asks_for_one_task_per_gpu():
    from sepo.run.compose import compose_config

    cfg = compose_config(
        ["+launch=slurm_ddp", "hydra.launcher.gpus_per_node=4", "hydra.launcher.tasks_per_node=4"], with_hydra=True
    )
    launcher = cfg.hydra.launcher
    assert "SlurmLauncher" in launcher._target_
    assert launcher.gpus_per_node == launcher.tasks_per_node == 4
    assert launcher.max_num_timeout == 3  # inherited from the one-GPU preset
