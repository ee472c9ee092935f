"""Shared fixtures: compose the real config tree, run the real CLI, and the models every test module
builds the same way (the tiny model, and tiny random-weight copies of the real architectures).

Model fixtures are module-scoped and opt-in: a module that builds models says
`pytestmark = pytest.mark.usefixtures("offline", "one_thread")` for the hub switch and the thread count.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from benchmarks.gpu.full_size import chat_tokenizer, tiny_config
from sepo.builders import load_model_and_tokenizer
from sepo.builders.tiny import IM_END, build_tiny, padded_vocab
from sepo.policies.lm import LMPolicy
from sepo.run.compose import compose_config

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


@pytest.fixture(autouse=True)
def default_signal_handlers():
    """Each test starts with Python's own Ctrl-C and SIGTERM handling, whatever a test before it in the
    same worker left installed, and leaves it so: the tests that send themselves SIGINT expect
    KeyboardInterrupt."""
    signals = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, h) for s, h in zip(signals, (signal.default_int_handler, signal.SIG_DFL))}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


@pytest.fixture
def compose_cfg(tmp_path):
    """compose_cfg(*overrides) -> the composed DictConfig, writing into tmp_path."""

    def _compose(*overrides: str):
        return compose_config([f"paths.output_dir={tmp_path}", f"paths.root_dir={tmp_path}", "logger=none", *overrides])

    return _compose


@pytest.fixture
def cli(tmp_path):
    """cli(*args) -> CompletedProcess of `python main.py args` with outputs under tmp_path. The run gets one
    torch thread unless the caller's environment or `env` says otherwise: the suite's two workers share two
    cores, and a run at torch's default of one thread per core beside the other worker is ten times slower."""

    def _run(*args: str, timeout: int = 600, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
        """`env`: variables to set for this run (None unsets one)."""
        env = {
            "OMP_NUM_THREADS": "1",
            **os.environ,
            "PROJECT_ROOT": str(tmp_path),
            "WANDB_MODE": "offline",
            "HYDRA_FULL_ERROR": "0",
            **(env or {}),
        }
        env = {k: v for k, v in env.items() if v is not None}
        return subprocess.run(
            [sys.executable, str(ROOT / "main.py"), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return _run


def run_dirs(root: Path, marker: str = "results.json") -> list[Path]:
    return sorted(p.parent for p in (root / "outputs").rglob(marker))


def read_results(root: Path) -> dict:
    (path,) = [p for p in (root / "outputs").rglob("results.json")]
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- helpers
#: the main job's pipeline on tiny, shrunk to seconds (3 rounds, 2 train opponents, 3 SFT and 2 SEPO steps)
TINY_RUN = [
    "game.rounds=3",
    "game.pools.train=[TFT,Grim]",
    "game.pools.robust=[Random]",
    "sft.max_examples=24",
    "sft.max_valid_examples=8",
    "sft.epochs=1",
    "sft.max_steps=3",
    "sft.agreement_examples=6",
    "eval.episodes_per_opponent=2",
    "eval.max_new_tokens=6",
    "eval.progress=false",
    "sepo.steps=2",
    "sepo.checkpoint_steps=[1]",
    "sepo.max_new_tokens=6",
    "datagen.episodes_per_opponent=4",
]

#: a small SEPO run of the tiny model on IPD (3 rounds, 2 train opponents, 4-token answers)
SMALL = [
    "stage=sepo",
    "model=tiny",
    "game=ipd",
    "game.rounds=3",
    "game.pools.train=[TFT,Mixed]",
    "game.pools.exploit=[AlwaysD]",
    "game.pools.robust=[Random]",
    "sepo.max_new_tokens=4",
    "sepo.rollouts_per_opponent=3",
    "eval.max_new_tokens=4",
    "eval.episodes_per_opponent=2",
    "eval.progress=false",
]


class LogTracker:
    """A tracker that keeps what a run logs, (step, row) by row, for a test to read."""

    def __init__(self):
        self.rows = []

    def log(self, data, step=None):
        self.rows.append((step, dict(data)))

    def summary(self, data):
        pass


def final_adapter(run):
    return load_file(run / "adapter" / "adapter_model.safetensors")


def wandb_cli() -> str:
    exe = Path(sys.executable).with_name("wandb")
    return str(exe) if exe.exists() else (shutil.which("wandb") or pytest.skip("wandb CLI not installed"))


# --------------------------------------------------------------------------- models
def model_cfg(name: str, **overrides):
    """conf/model/<name>.yaml with dotted-key overrides (e.g. path=...)."""
    cfg = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


@pytest.fixture(scope="module")
def offline():
    """No test may reach a model hub: the environment variable and the hub's own switch."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny(model_cfg("tiny"), tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """(model, tokenizer, model config) of the embedded tiny model; the config is conf/model/tiny.yaml."""
    model, tokenizer = load_model_and_tokenizer(
        model_cfg("tiny", path=str(tiny_dir)), cache_dir=tiny_dir.parent, device="cpu"
    )
    return model, tokenizer, model_cfg("tiny")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: the tiny models' 128-wide matmuls gain nothing from more, and on a busy
    2-core machine OpenMP threads wait on each other (tens of times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def scores_and_gradient(model, score) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probs `score()` gives at its real positions (it returns log-probs and a bool mask of them) and
    the model's parameter gradient of their sum, flattened: what two layouts of one pass must agree on."""
    model.zero_grad()
    lp, real = score()
    lp[real].sum().backward()
    gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    return lp[real].detach(), gradient


def teach(bundle, examples: list[tuple[list[dict[str, str]], str]], steps: int):
    """A copy of the model after `steps` Adam steps (batches of 8) on (chat messages, answer) pairs,
    loss on the answer tokens only, no EOS."""
    model, tokenizer, cfg = bundle
    student = copy.deepcopy(model).train()
    helper = LMPolicy(student, tokenizer, cfg, 0.0, 8, 0)
    rows = [(helper.render(messages), helper.action_ids(answer)) for messages, answer in examples]
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for step in range(steps):
            batch = [rows[(step * 8 + i) % len(rows)] for i in range(8)]
            ids, mask, width_p = helper.pack([b[0] for b in batch], [b[1] for b in batch])
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :width_p] = -100
            loss = student(
                input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), labels=labels
            ).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return student.eval(), tokenizer, cfg


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every tensor a transformers cache holds, layer by layer (keys, values, states, lengths)."""
    out = []
    for layer in cache.layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(value, dict):
                out += [v for v in value.values() if isinstance(v, torch.Tensor)]
    return out


class Tracing:
    """A graph backend for the CPU (`sepo.lm.graph_decoding`): the forward traced once into aten operations and
    replayed. Like a CUDA graph it freezes every Python-side value; unlike one, tracing runs the forward, so the
    cache is put back."""

    def eager(self, run):
        return run()

    def capture(self, forward, cache):
        from torch.fx.experimental.proxy_tensor import make_fx

        saved = [t.clone() for t in cache_tensors(cache)]
        traced = make_fx(forward)()
        for tensor, value in zip(cache_tensors(cache), saved, strict=True):
            tensor.copy_(value)
        return traced


@pytest.fixture(scope="module")
def gemma4_dir(tiny_dir, tmp_path_factory):
    """A tiny random Gemma 4 (text, vision and audio towers, KV sharing) saved like a checkpoint: the GPU
    benchmark's tiny shape, without its final-logit softcapping (Gemma4TextConfig's default)."""
    from transformers import Gemma4ForConditionalGeneration, GenerationConfig

    out = tmp_path_factory.mktemp("gemma4")
    tok = chat_tokenizer("gemma4", tiny_dir)
    eos, pad = tok.convert_tokens_to_ids("<turn|>"), tok.pad_token_id
    config = tiny_config("gemma4", padded_vocab(tok), pad, eos)
    config.text_config.final_logit_softcapping = None
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=pad)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def qwen_dir(tiny_dir, tmp_path_factory):
    """A tiny random Qwen 3.5 (hybrid linear/full attention, with a vision tower) saved as the hub has it:
    a Qwen3_5ForConditionalGeneration checkpoint around the GPU benchmark's tiny text shape."""
    from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5VisionConfig

    out = tmp_path_factory.mktemp("qwen")
    tok = chat_tokenizer("qwen", tiny_dir)
    eos, pad = tok.convert_tokens_to_ids(IM_END), tok.pad_token_id
    text = tiny_config("qwen", padded_vocab(tok), pad, eos)
    vision = Qwen3_5VisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def arch_dirs(tiny_dir, gemma4_dir, qwen_dir):
    return {"tiny": tiny_dir, "gemma4": gemma4_dir, "qwen": qwen_dir}
