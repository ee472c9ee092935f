"""Bad config values stop a run before any work, with one line naming the key and the allowed values.

A table of bad values walks through the real CLI (`python main.py ...`): exit code 2, exactly one
line on stderr of the form `error: key=value ...; allowed: ...`, and no run directory marked DONE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: (command-line arguments, the key=value the error must name)
BAD_VALUES = [
    (["stage=eval", "model=scripted", "seed=-5"], "seed=-5"),
    (["stage=eval", "model=scripted", "generation_seed=1.5"], "generation_seed=1.5"),
    (["stage=eval", "model=scripted", "eval.temperature=-1"], "eval.temperature=-1"),
    (["stage=eval", "model=scripted", "eval.episodes_per_opponent=0"], "eval.episodes_per_opponent=0"),
    (["stage=eval", "model=scripted", "game=kuhn", "eval.episodes_per_opponent=3"], "eval.episodes_per_opponent=3"),
    (["stage=eval", "model=scripted", "paths.root_dir=/proc/version/outputs"], "paths.root_dir=/proc/version/outputs"),
    (["stage=eval", "model=tiny", "model.path=/no/such/checkpoint"], "model.path=/no/such/checkpoint"),
    (["stage=datagen", "datagen.num_opponents=0"], "datagen.num_opponents=0"),
    (["stage=sft", "model=scripted"], "model=scripted"),
    (["stage=sepo", "model=scripted"], "model=scripted"),
    (["stage=sft", "sft.per_device_batch_size=0"], "sft.per_device_batch_size=0"),
    (["stage=sft", "sft.lr=0"], "sft.lr=0"),
    (["stage=sepo", "sepo.steps=-1"], "sepo.steps=-1"),
    (["stage=sepo", "sepo.temperature=0"], "sepo.temperature=0"),
    (["stage=sepo", "sepo.micro_batch=big"], "sepo.micro_batch='big'"),
    (["stage=sepo", "sepo.checkpoint_steps=[0,5]"], "sepo.checkpoint_steps=[0, 5]"),
    (["stage=sepo", "sepo.rollouts_per_opponent=1"], "sepo.rollouts_per_opponent=1"),
    (["stage=sepo", "sepo.penalty_mode=avg"], "sepo.penalty_mode=avg"),
    (["stage=sepo", "sepo.lr_schedule=cos"], "sepo.lr_schedule=cos"),
    (["stage=sepo", "sepo.length_norm=mean"], "sepo.length_norm=mean"),
    (["stage=sepo", "sepo.held_terms=[u]"], "sepo.held_terms=['u']"),
    (["stage=sepo", "sepo.held_terms=[c]", "sepo.adv_norm=group_round"], "sepo.held_terms=['c']"),
    (["stage=sepo", "sepo.held_at_start=[c]"], "sepo.held_at_start=['c']"),
    (["stage=sepo", "sepo.held_terms=[c]", "sepo.held_at_start=[u]"], "sepo.held_at_start=['u']"),
    (["stage=sepo", "model.prefix_cache=false", "model.prefix_tree=true"], "model.prefix_tree=true"),
    (["stage=sepo", "model.prefix_cache=false", "model.cascade_attention=true"], "model.cascade_attention=true"),
    (["stage=eval", "model.cpu_workers=0"], "model.cpu_workers=0"),
    (["stage=eval", "model.drop_stopped_rows=2"], "model.drop_stopped_rows=2"),
    (["stage=eval", "model.prefix_cache=false", "model.drop_stopped_rows=0.5"], "model.drop_stopped_rows=0.5"),
    (
        ["stage=eval", "model.decode_graphs=true", "model.drop_stopped_rows=0.5"],
        "model.drop_stopped_rows=0.5 and model.decode_graphs",
    ),
    (["stage=eval", "model=scripted", "paths.root_dir=/proc/x"], "paths.root_dir=/proc/x"),
    (["stage=eval", "model=scripted", "hydra.run.dir=/proc/x/y"], "hydra.run.dir=/proc/x/y"),
    (["stage=eval", "model=scripted", "logger=wandb", "logger.mode=onlin"], "logger.mode=onlin"),
    (["stage=eval", "model=scripted", "logger=wandb", "logger.project="], "logger.project=''"),
    (["stage=eval", "model=scripted", "game="], "game= is empty"),
    (["stage=eval", "model=scripted", "foo=1"], "foo is not a known key"),
    (["stage=sepo", "sepo.stepz=3"], "did you mean sepo.steps?"),
    (["stage=sft", "model.sft.lr=1"], "did you mean sft.lr?"),  # a model's stage defaults left the model node
    (["stage=sepo", "+sepo.stepz=3"], "+sepo.stepz adds a key"),
    # a mapping merged whole: an entry it does not have is one line (Hydra's own is a stack of them)
    (["stage=sepo", "sepo.rollouts_by_pool={robust:3}"], "sepo.rollouts_by_pool has no entry robust; allowed: train"),
    (["stage=eval", "model=scripted", "game.demonstrators={Foo:1}"], "game.demonstrators has no entry Foo"),
    (["stage=sepo", "sepo.rollouts_by_pool.collusive=1"], "sepo.rollouts_by_pool={'train': None, 'exploit': None"),
    (["stage=eval", "model=tiny", "model.dtype=float99"], "model.dtype=float99"),
    (["stage=sepo", "sepo.lr_final_ratio=2"], "sepo.lr_final_ratio=2"),
    (["stage=sft", "sft.bf16=maybe"], "sft.bf16='maybe'"),  # a boolean: true or false only
    (["stage=sft", "sft.lr_scheduler=cosin"], "sft.lr_scheduler=cosin"),
    (["stage=datagen", "datagen.multi_games=[ipd,chess]"], "datagen.multi_games=['ipd', 'chess']"),
    (["stage=sepo", "sepo.lora.alpha=wide"], "sepo.lora.alpha='wide'"),  # refused by its schema's type
    (["-m", "stage=sepo", "sepo.lr=1e-3,fast"], "sepo.lr='fast'"),  # a sweep: every value is checked
    # a boolean is true or false: OmegaConf would read "yes" as true and "no" as false
    (["stage=eval", "model=tiny", "model.static_cache=maybe"], "model.static_cache='maybe'"),
    (["stage=sft", "sft.gradient_checkpointing=yes"], "sft.gradient_checkpointing='yes'"),
    # a game's rules (sepo/run/schema.py types them, sepo/run/config.py ranges them)
    (["stage=eval", "model=scripted", "game.payoffs.reward=abc"], "game.payoffs.reward='abc'"),
    (["stage=eval", "model=scripted", "game.payoffs.sucker=nan"], "game.payoffs.sucker=nan"),
    (["stage=eval", "model=scripted", "game.strategy_params.Mixed.noise=2"], "game.strategy_params.Mixed.noise=2"),
    (["stage=eval", "model=scripted", "game=auction", "game.bids.LOW=-5"], "game.bids={'LOW': -5"),
    (["stage=eval", "model=scripted", "game=auction", "game.private_values=[]"], "game.private_values=[]"),
    (["stage=eval", "model=scripted", "game=kuhn", "game.ante=-1"], "game.ante=-1"),
    (["stage=eval", "model=scripted", "game=neg_v2", "game.pool_min=5"], "game.pool_min=5 and game.pool_max=4"),
    (["stage=eval", "model=scripted", "game=neg_v2", "game.item_names=[]"], "game.item_names=[]"),
    (["stage=eval", "model=scripted", "game=neg_v2", "game.value_total=-3"], "game.value_total=-3"),
    # the model's build settings, and values that are only wrong for the model (checked on its config)
    (["stage=eval", "model=tiny", "model.architecture.hidden_size=0"], "model.architecture.hidden_size=0"),
    (["stage=eval", "model=tiny", "model.architecture.num_attention_heads=3"], "num_attention_heads=3"),
    (["stage=eval", "model=tiny", "model.tokenizer.vocab_size=0"], "model.tokenizer.vocab_size=0"),
    (["stage=sepo", "model=tiny", "model.lora.target_modules='(['"], "model.lora.target_modules='(['"),
    (["stage=eval", "model=tiny", "eval.max_new_tokens=100000"], "eval.max_new_tokens=100000"),
    (["stage=eval", "model=tiny", "game=kuhn", "eval.action_samples=100000000"], "eval.action_samples=100000000"),
    (["stage=sft", "sft.dataset=nosuch"], "sft.dataset=nosuch"),
    # the launcher and the output root
    (["-m", "stage=eval", "model=scripted", "+launch=local", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0"),
    (["-m", "stage=eval", "model=scripted", "+launch=local", "hydra.launcher.n_jobs=-2"], "hydra.launcher.n_jobs=-2"),
    (["stage=eval", "model=scripted", f"paths.root_dir=/tmp/{'a' * 300}"], "paths.root_dir=/tmp/aaaa"),
]


@pytest.mark.parametrize("args,named", BAD_VALUES, ids=[n for _, n in BAD_VALUES])
def test_a_bad_value_is_one_line_exit_2_and_no_done(cli, tmp_path, args, named):
    proc = cli(*args, *([] if any(a.startswith("logger=") for a in args) else ["logger=none"]))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, proc.stderr[-2000:]  # one line, besides one-line warnings (Kuhn's pool overlap)
    assert lines[0].startswith("error: "), lines[0]
    assert named in lines[0], lines[0]
    assert "; allowed: " in lines[0], lines[0]
    assert not list(tmp_path.rglob("DONE"))
    assert list((tmp_path / "outputs" / "runs").glob("*")) == []  # an absent directory globs to nothing too


def test_a_users_config_dir_gets_the_same_one_line_checks(cli, tmp_path):
    """`--config-dir` runs skipped the key and type checks, and Hydra printed its own 6-line error."""
    user = tmp_path / "user_conf"
    (user / "lambdas").mkdir(parents=True)
    (user / "lambdas" / "mine.yaml").write_text("train: {e: 1.0, c: 0.0, x: 0.0}\neval: {e: 1.0, c: 0.0, x: 0.0}\n")
    for bad, named in (("foo=1", "foo is not a known key"), ("eval.batch_size=big", "eval.batch_size='big'")):
        proc = cli("--config-dir", str(user), "stage=eval", "model=scripted", "lambdas=mine", bad, "logger=none")
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and "; allowed: " in lines[0], proc.stderr[-2000:]
    fine = cli("--config-dir", str(user), "stage=eval", "model=scripted", "lambdas=mine", "logger=none")
    assert fine.returncode == 0, fine.stderr[-2000:]
    (results,) = (tmp_path / "outputs").rglob("results.json")
    assert json.loads(results.read_text())["lambdas"]["e"] == 1.0  # the user's weights were the ones used


def test_a_single_runs_bad_value_is_refused_before_torch_is_imported(cli):
    """The run's value checks run on the composed config before Hydra starts the run, so a bad value costs the
    composition and not torch's import (2.3 s against 7.4 s on 2 AVX2 cores). A sweep's jobs are still checked
    one by one inside the sweep (test_cli: the bad job fails alone)."""
    proc = cli("stage=eval", "model=tiny", "model.dtype=float99", "logger=none", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    timings = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in timings}
    assert "sepo.run.config" in imported and "hydra" in imported  # the recorder saw the checks' own imports
    assert "torch" not in imported
    (error,) = [line for line in proc.stderr.splitlines() if line not in timings]
    assert error.startswith("error: model.dtype=float99 is not allowed; allowed: ")


#: Loaded by every Python process started with this directory on PYTHONPATH: a connection or name lookup
#: is written to $SEPO_NETWORK_LOG and refused, so a test sees any network call the run attempted.
NETWORK_RECORDER = """
import os, socket

def _record(what):
    with open(os.environ["SEPO_NETWORK_LOG"], "a") as f:
        f.write(what + "\\n")
    raise OSError("network call refused by the test: " + what)

def _connect(self, address, *a, **k):
    _record("connect " + repr(address))

def _getaddrinfo(host, *a, **k):
    _record("getaddrinfo " + repr(host))

socket.socket.connect = _connect
socket.getaddrinfo = _getaddrinfo
"""


def network_recording_env(tmp_path) -> tuple[dict[str, str], Path]:
    hook = tmp_path / "network_recorder"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(NETWORK_RECORDER)
    log = tmp_path / "network_calls.log"
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SEPO_NETWORK_LOG": str(log)}, log


def test_the_network_recorder_sees_a_connection(tmp_path):
    """The recorder below must be able to fail: a process that does connect is caught."""
    env, log = network_recording_env(tmp_path)
    code = "import socket\ntry:\n    socket.create_connection(('huggingface.co', 443), timeout=1)\nexcept OSError:\n    pass"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True, timeout=60)
    assert "huggingface.co" in log.read_text()


def test_a_hub_id_not_in_the_cache_fails_without_a_network_call_naming_the_download(cli, tmp_path):
    """Offline by default: no network call at all, one line with the `hf download` command."""
    env, log = network_recording_env(tmp_path)
    proc = cli("stage=eval", "model=gemma4", "logger=none", env={"HF_HOME": str(tmp_path / "empty_hf_home"), **env})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not log.exists(), log.read_text()
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1
    assert "hf download google/gemma-4-E4B-it" in lines[0]
    assert "model.download=true" in lines[0]


def test_an_interpolated_key_can_be_overridden(cli, tmp_path):
    """datagen.out_dir defaults to ${paths.output_dir}/data, which only Hydra's runtime resolves: the key
    check must see that it exists, not fail resolving it (it printed a traceback). The run also carries
    a game option into the data: Kuhn's name_the_check gives a bet after one's own check its own lines."""

    out = tmp_path / "data"
    proc = cli(
        "stage=datagen",
        "game=kuhn",
        "game.reasoning.name_the_check=true",
        "datagen.datasets=[kuhn]",
        "datagen.episodes_per_opponent=4",
        f"datagen.out_dir={out}",
        "logger=none",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    answers = [json.loads(line)["messages"][-1]["content"] for line in (out / "kuhn" / "train.jsonl").open()]
    assert any("my check" in a or "I checked" in a for a in answers)
