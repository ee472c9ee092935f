"""Decode steps replayed as graphs (`sepo.lm.graph_decoding`, `model.decode_graphs`) and their GPU benchmark
(`benchmarks/gpu/graph_decode.py`), on tiny random models of Gemma 4 and Qwen 3.5.

A CUDA graph runs the kernels it recorded and none of the Python around them: whatever Python-side value a
forward reads (a column count, a mask size) is frozen at the capture. On a CPU the same freezing comes from
tracing the forward once with `make_fx` and replaying the trace (`Tracing`), so the whole path is
checked here against plain `generate`, and a test shows the check sees a frozen value. The `gpu` tests
capture real CUDA graphs.
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache, GenerationConfig, StaticCache

import sepo.lm.graph_decoding as graph_decoding_module
from benchmarks.gpu import full_size
from benchmarks.gpu import graph_decode as bench
from sepo.builders import load_model_and_tokenizer
from sepo.errors import ConfigError
from sepo.games import make_game
from sepo.lm.graph_decoding import graph_decoding
from sepo.models import forward_extras
from sepo.policies.base import DecisionRequest
from sepo.policies.lm import LMPolicy

from .conftest import CONF, Tracing, model_cfg

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
    pytest.mark.usefixtures("one_thread"),
]

ARCHS = ("gemma4", "qwen")
VOCAB = 512
CUDA = torch.cuda.is_available()


class Uncaptured:
    """A graph backend that captures nothing: every step reruns the forward on the fixed buffers, and puts back
    the Python-side counts the rerun moved (a replay moves none; `GraphedForward` advances them). The same
    steps as CUDA graphs replay (rings, buffers), so on a GPU the graphs must give its results bit for bit."""

    COUNTS = ("cumulative_length_int", "ring_writes")

    def eager(self, run):
        return run()

    def capture(self, forward, cache):
        def rerun():
            saved = [{k: vars(layer)[k] for k in self.COUNTS if k in vars(layer)} for layer in cache.layers]
            logits = forward()
            for layer, counts in zip(cache.layers, saved, strict=True):
                vars(layer).update(counts)
            return logits

        return rerun


def tiny_model(arch: str):
    return full_size.build_model(arch, full_size.tiny_config(arch, VOCAB), "cpu", torch.float32)


def left_padded_prompts(rows: int = 3, width: int = 10, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (rows, width), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    return ids, mask


def greedy(model, arch, ids, mask, new_tokens, cache=None):
    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=[2]
    )
    extras = forward_extras(model, OmegaConf.create({"token_type_ids": arch == "gemma4"}), ids)
    cache_kwargs = {"past_key_values": cache} if cache is not None else {}
    return model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **extras, **cache_kwargs)


# --------------------------------------------------------------------------- generate
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_replayed_steps_equals_plain_generate(arch):
    """Left-padded rows; Gemma 4's sliding windows (16 columns) fill during decoding, so its steps need two
    graphs (window filling, window full). Tokens equal transformers' dynamic cache's."""
    model = tiny_model(arch)
    ids, mask = left_padded_prompts()
    plain = greedy(model, arch, ids, mask, 14)
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + 14)
    with graph_decoding(model, Tracing) as graphed:
        replayed = greedy(model, arch, ids, mask, 14, cache)
    assert torch.equal(replayed, plain)
    assert len(graphed.graphs) == (2 if arch == "gemma4" else 1)
    assert graphed.replays == 13 - len(graphed.graphs)  # 13 decode steps after the prefill; one eager per graph


def test_a_frozen_window_count_is_seen(monkeypatch):
    """The check is not blind: replays that leave the sliding windows' Python-side count where the capture
    found it never see a window fill, and write past its end (on a GPU, a device-side assert)."""
    model = tiny_model("gemma4")
    ids, mask = left_padded_prompts()
    monkeypatch.setattr(graph_decoding_module, "advance_windows", lambda sliding: None)
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + 14)
    with graph_decoding(model, Tracing), pytest.raises(IndexError, match="out of bounds"):
        greedy(model, "gemma4", ids, mask, 14, cache)


def test_a_dynamic_cache_decodes_as_without_graphs():
    """Only a static cache has fixed addresses to replay on; generate on any other decodes as it always does."""
    model = tiny_model("qwen")
    ids, mask = left_padded_prompts()
    plain = greedy(model, "qwen", ids, mask, 6)
    with graph_decoding(model, Tracing) as graphed:
        dynamic = greedy(model, "qwen", ids, mask, 6, DynamicCache(config=model.config))
    assert torch.equal(dynamic, plain) and graphed.replays == 0 and not graphed.seen


def test_the_model_is_left_as_it_was():
    model = tiny_model("qwen")
    with graph_decoding(model, Tracing):
        assert "get_compiled_call" in vars(model)
    assert "get_compiled_call" not in vars(model) and "_valid_auto_compile_criteria" not in vars(model)


# --------------------------------------------------------------------------- the policy
def ipd_requests(rounds: int = 6) -> list[DecisionRequest]:
    """The agent's decision after 0 .. rounds-1 rounds of IPD: prompts of different lengths, left-padded."""
    game = make_game(OmegaConf.load(CONF / "game" / "ipd.yaml"))
    out = []
    for k in range(rounds):
        state = game.reset(k)
        for r in range(k):
            game.step(state, {0: "COOPERATE", 1: ("DEFECT", "COOPERATE")[r % 2]})
        out.append(DecisionRequest(game, state, 0, game.legal_actions(state, 0), np.random.default_rng([0, k])))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("backend", [Tracing, Uncaptured])
def test_a_policy_with_decode_graphs_plays_what_the_plain_cache_plays(
    arch, temperature, backend, arch_dirs, monkeypatch
):
    """`model.decode_graphs` through LMPolicy (chat prompts of different lengths, sampling, the stopping rule):
    answers and log-probs equal those of transformers' dynamic cache, and steps were replayed."""
    cfg = model_cfg(arch, path=str(arch_dirs[arch]), dtype="float32")
    model, tokenizer = load_model_and_tokenizer(cfg, arch_dirs[arch], device="cpu")
    plain = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, {"static_cache": False}), temperature, 12, 0)
    graphed = LMPolicy(
        model, tokenizer, OmegaConf.merge(cfg, {"static_cache": True, "decode_graphs": True}), temperature, 12, 0
    )
    graphed.graph_backend = backend
    replays = []
    original = graph_decoding_module.graph_decoding

    @contextlib.contextmanager
    def counting(model, backend):
        with original(model, backend) as forward:
            yield forward
        replays.append(forward.replays)

    monkeypatch.setattr("sepo.policies.lm.graph_decoding", counting)
    a = graphed.act_batch(ipd_requests(), return_logprobs=True)
    b = plain.act_batch(ipd_requests(), return_logprobs=True)
    assert sum(replays) > 0
    assert [d.text for d in a] == [d.text for d in b]
    for x, y in zip(a, b):
        assert torch.equal(x.tokens.gen_ids, y.tokens.gen_ids)
        torch.testing.assert_close(x.tokens.logprobs, y.tokens.logprobs, atol=1e-5, rtol=0)


def test_decode_graphs_on_a_cpu_are_a_no_op(arch_dirs):
    cfg = model_cfg("qwen", path=str(arch_dirs["qwen"]), static_cache=True, decode_graphs=True)
    model, tokenizer = load_model_and_tokenizer(cfg, arch_dirs["qwen"], device="cpu")
    assert isinstance(LMPolicy(model, tokenizer, cfg, 1.0, 8, 0).graphs(), contextlib.nullcontext)


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["model.decode_graphs=true", "model.static_cache=false"], "model.static_cache=true"),
        (
            ["model.decode_graphs=true", "model.prefix_cache=true", "model.cascade_attention=true"],
            "model.cascade_attention",
        ),
    ],
)
def test_decode_graphs_without_what_they_need_is_one_line_naming_the_keys(compose_cfg, overrides, named):
    from sepo.run.config import validate

    with pytest.raises(ConfigError, match=named):
        validate(compose_cfg("model=tiny", *overrides))


# --------------------------------------------------------------------------- the benchmark's step
class HostTraffic(TorchDispatchMode):
    """Operations a CUDA capture cannot hold: a tensor made from host data, a device value read on the host."""

    FORBIDDEN = ("aten.lift_fresh", "aten._local_scalar_dense", "aten.nonzero")

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.FORBIDDEN):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_benchmark_step_decodes_what_generate_decodes(arch):
    model = tiny_model(arch)
    prompt = torch.randint(3, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
    plain = greedy(model, arch, prompt, torch.ones_like(prompt), 9)[:, 24:]
    step = bench.StaticStep(model, arch, prompt, 9)
    snapshot = bench.CacheSnapshot(step)
    first = bench.decode(step, step, 8, 0)["tokens"]
    snapshot.restore()
    again = bench.decode(step, step, 8, 0)["tokens"]
    snapshot.restore()
    traced = make_fx(step)()
    snapshot.restore()
    replayed = bench.decode(traced, step, 8, 0)["tokens"]
    assert torch.equal(first, plain[:, 1:])
    assert torch.equal(again, first) and torch.equal(replayed, first)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_benchmark_step_takes_nothing_from_the_host(arch):
    model = tiny_model(arch)
    prompt = torch.randint(3, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
    step = bench.StaticStep(model, arch, prompt, 4)
    with HostTraffic() as traffic:
        step()
    assert traffic.seen == []
    if arch == "gemma4":  # transformers' own full-window update builds its index from host data
        step = bench.StaticStep(model, arch, prompt, 4)
        for layer in step.cache.layers:
            vars(layer).pop("update", None)
        with HostTraffic() as traffic:
            step()
        assert "aten.lift_fresh.default" in traffic.seen


def test_the_benchmark_refuses_a_prompt_that_leaves_a_window_unfilled():
    with pytest.raises(ValueError, match="--prompt-tokens 12"):
        bench.StaticStep(tiny_model("gemma4"), "gemma4", torch.randint(3, VOCAB, (2, 12)), 4)


def test_the_benchmark_runs_its_eager_arm_on_a_cpu():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = bench.run(
        parser.parse_args(
            ["--model", "gemma4", "--tiny", "--device", "cpu", "--batch", "2", "--prompt-tokens", "20", "--steps", "3"]
        )
    )
    row = out["batches"][0]
    assert "error" not in row, row
    assert row["eager"]["ms_per_step"] > 0 and 0 < row["eager"]["floor_fraction"]
    assert "graph" not in row  # a CPU has no CUDA graphs


# --------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cuda_graphs_decode_what_the_same_steps_decode_uncaptured(arch, temperature, arch_dirs):
    """Real CUDA graphs through LMPolicy in bfloat16: the same kernels replayed, so the same tokens and log-probs,
    bit for bit (so it was on 2026-11-28, H200, before the rings, against transformers' own static cache). The
    uncaptured arm must not be torch.compiled by transformers, which it does on a static cache on a GPU unless
    told not to (LMPolicy passes disable_compile): its fused kernels round otherwise."""
    cfg = model_cfg(arch, path=str(arch_dirs[arch]), dtype="bfloat16", static_cache=True, decode_graphs=True)
    model, tokenizer = load_model_and_tokenizer(cfg, arch_dirs[arch], device="cuda")
    uncaptured = LMPolicy(model, tokenizer, cfg, temperature, 12, 0)
    uncaptured.graph_backend = Uncaptured
    graphed = LMPolicy(model, tokenizer, cfg, temperature, 12, 0)
    a = graphed.act_batch(ipd_requests(), return_logprobs=True)
    b = uncaptured.act_batch(ipd_requests(), return_logprobs=True)
    assert [d.text for d in a] == [d.text for d in b]
    for x, y in zip(a, b):
        assert torch.equal(x.tokens.gen_ids, y.tokens.gen_ids) and torch.equal(x.tokens.logprobs, y.tokens.logprobs)
