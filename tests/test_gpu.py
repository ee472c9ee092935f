"""The GPU benchmark (benchmarks/gpu/full_size.py) and the real architectures in bfloat16 on CUDA.

Without a GPU the benchmark cannot run, so the CPU tests check what does not need one: the
one-line refusal, the bandwidth-floor arithmetic, the full-size configs against the published
parameter counts (built on the `meta` device: no memory), and the tiny random models of both
architectures through the project's log-prob code. The `gpu` tests run on a CUDA machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import full_size as gpu_bench
from sepo.lm.logprobs import token_logprobs, token_logprobs_reference
from sepo.models import forward_extras, load_pretrained, quantized_reference

from .conftest import ROOT, model_cfg

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
    pytest.mark.usefixtures("one_thread"),
]

CUDA = torch.cuda.is_available()
ARCHS = ("gemma4", "qwen")
VOCAB = 256


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    gpu_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def left_padded(vocab: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of random tokens, the second left-padded by three: the layout of a generate batch."""
    ids = torch.randint(3, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids.to(device), mask.to(device)


# --------------------------------------------------------------------------- without a GPU
def test_run_without_cuda_is_one_line_naming_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as err:
        gpu_bench.run(bench_args())
    message = str(err.value.code)
    assert "CUDA" in message
    assert "\n" not in message


def test_command_line_without_cuda_exits_without_traceback():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device visible, even on a GPU machine
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "gpu", "--model", "qwen"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "CUDA" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_bandwidth_floor_fraction():
    # 8 GB of weights at 2 TB/s: a 4 ms floor; a step of 8 ms reaches half of it
    assert gpu_bench.bandwidth_floor_fraction(8e9, 2e12, 8e-3) == pytest.approx(0.5)
    assert gpu_bench.bandwidth_floor_fraction(8e9, 2e12, 4e-3) == pytest.approx(1.0)
    assert gpu_bench.bandwidth_floor_fraction(0, 2e12, 1e-3) == 0.0
    for bad in ((8e9, 0, 1e-3), (8e9, 2e12, 0), (-1, 2e12, 1e-3)):
        with pytest.raises(ValueError):
            gpu_bench.bandwidth_floor_fraction(*bad)


def test_sizes_default_to_full_or_tiny_and_the_command_line_wins():
    full = gpu_bench.resolved_sizes(bench_args())
    assert full["batch_sizes"] == [32, 128, 256]
    assert full["prompt_tokens"] == 600
    tiny = gpu_bench.resolved_sizes(bench_args("--tiny", "--device", "cpu"))
    assert max(tiny["batch_sizes"]) <= 8
    assert tiny["prompt_tokens"] < 100
    assert gpu_bench.resolved_sizes(bench_args("--tiny", "--batch-sizes", "3"))["batch_sizes"] == [3]


def test_full_size_configs_match_the_published_parameter_counts():
    """Built on the meta device: the shapes are real, no memory is allocated."""
    gemma = gpu_bench.build_model("gemma4", gpu_bench.gemma4_config("e4b"), "meta", torch.bfloat16)
    text = gemma.config.text_config
    assert (text.num_hidden_layers, text.hidden_size, text.num_kv_shared_layers) == (42, 2560, 18)
    assert text.layer_types.count("full_attention") == 7
    assert text.final_logit_softcapping == 30.0
    counts = gpu_bench.parameter_counts(gemma)
    assert 7.5e9 <= counts["total"] <= 8.5e9, counts  # "8B with embeddings"
    assert 3.5e9 <= counts["language_model_without_embeddings"] <= 4.6e9, counts  # "4.5B effective" incl. towers
    assert counts["total"] - counts["language_model"] > 3e8  # the vision and audio towers are there
    # a decode step reads the decoder layers and the (tied) head, not the per-layer embedding table
    assert 8.5e9 <= gpu_bench.decode_weight_bytes(gemma) <= 1.0e10

    qwen = gpu_bench.build_model("qwen", gpu_bench.qwen35_config(), "meta", torch.bfloat16)
    assert type(qwen).__name__ == "Qwen3_5ForCausalLM"
    assert qwen.config.layer_types.count("linear_attention") == 24
    counts = gpu_bench.parameter_counts(qwen)
    assert 3.8e9 <= counts["total"] <= 4.6e9, counts  # "4B"
    assert gpu_bench.decode_weight_bytes(qwen) == 2 * counts["total"]  # tied head: every weight, once

    default = gpu_bench.build_model("gemma4", gpu_bench.gemma4_config("default", towers=False), "meta")
    assert default.config.text_config.num_hidden_layers != 42  # the other preset really is another shape


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_score_tokens_on_cpu(arch):
    torch.manual_seed(0)
    model = gpu_bench.build_model(arch, gpu_bench.tiny_config(arch, VOCAB), "cpu", torch.float32)
    ids, mask = left_padded(VOCAB)
    extras = forward_extras(model, model_cfg(arch), ids)
    assert set(extras) == ({"mm_token_type_ids"} if arch == "gemma4" else set())
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, start=6, chunk=4, **extras)
        ref = token_logprobs_reference(model, ids, mask, start=6, **extras)
    assert lp.shape == (2, 6)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    assert gpu_bench.finite_logits(model, model_cfg(arch), "cpu")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_static_cache_decode_measures_the_same_steps_as_the_dynamic_one(arch, monkeypatch):
    """`--decode-cache static` (the compiled decode of a GPU session) runs the same greedy generate on a
    preallocated cache: the same tokens as the dynamic cache, and a figure per batch size."""
    torch.manual_seed(0)
    model = gpu_bench.build_model(arch, gpu_bench.tiny_config(arch, VOCAB), "cpu", torch.float32)
    ids, _ = left_padded(VOCAB)
    extras = forward_extras(model, model_cfg(arch), ids)
    _, dynamic = gpu_bench._time_generate(model, ids, extras, 4, 0, [2, 0], "cpu")
    _, static = gpu_bench._time_generate(model, ids, extras, 4, 0, [2, 0], "cpu", cache="static")
    assert type(static.past_key_values).__name__ == "StaticCache"
    assert torch.equal(static.sequences, dynamic.sequences)
    generated = []
    original = gpu_bench._time_generate

    def recording(*args, **kwargs):
        """Records the cache each generate used; its seconds are set (10 ms a token), so the figures follow."""
        generated.append(args[7] if len(args) > 7 else kwargs.get("cache", "dynamic"))
        _, result = original(*args, **kwargs)
        return 0.01 * args[3], result

    monkeypatch.setattr(gpu_bench, "_time_generate", recording)
    out = gpu_bench.decode_benchmark(
        model, model_cfg(arch), [2, 3], 8, 2, 1e6, "cpu", pad_id=0, eos_ids=[2, 0], cache="static"
    )
    assert generated == ["static"] * 8, "every generate of every batch size on the static cache"
    assert [row["batch"] for row in out["batches"]] == [2, 3]
    for row in out["batches"]:
        assert row["ms_per_step"] == pytest.approx(10.0)  # (t(1 + 2 tokens) - t(1 token)) / 2 steps
        assert row["tokens_per_s"] == pytest.approx(100.0 * row["batch"])
        # transformers compiles generate's forward on a GPU only: on a CPU the static cache runs eagerly
        assert row["compiled_graphs_in_all"] == 0


def test_compiled_graphs_counts_each_graph_torch_compile_builds():
    """The static-cache figure's `compiled_graphs_*` fields say whether generate ran compiled."""
    before = gpu_bench.compiled_graphs()
    doubled = torch.compile(lambda x: x * 2, backend="eager")
    doubled(torch.ones(2))
    doubled(torch.ones(2))  # the same shapes: the graph is reused, not built again
    assert gpu_bench.compiled_graphs() == before + 1


def timed_at(monkeypatch, seconds_per_token: float) -> None:
    """Every timed generate takes `seconds_per_token` x its tokens, so the benchmark's figures follow exactly."""
    original = gpu_bench._time_generate

    def fixed(*args, **kwargs):
        _, result = original(*args, **kwargs)
        return seconds_per_token * args[3], result

    monkeypatch.setattr(gpu_bench, "_time_generate", fixed)


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_benchmark_and_cache_size_on_a_tiny_model(arch, monkeypatch):
    torch.manual_seed(0)
    model = gpu_bench.build_model(arch, gpu_bench.tiny_config(arch, VOCAB), "cpu", torch.float32)
    timed_at(monkeypatch, 0.004)
    out = gpu_bench.decode_benchmark(
        model,
        model_cfg(arch),
        [2],
        prompt_tokens=8,
        decode_steps=2,
        bandwidth=1e6,
        device="cpu",
        pad_id=0,
        eos_ids=[2, 0],
    )
    (row,) = out["batches"]
    assert out["weight_bytes"] == gpu_bench.decode_weight_bytes(model)
    assert out["weight_bytes"] > 0
    assert row["steps_per_s"] == pytest.approx(250.0)  # 4 ms a step
    assert row["floor_fraction"] == pytest.approx(
        gpu_bench.bandwidth_floor_fraction(out["weight_bytes"], 1e6, 0.004), rel=1e-3
    )
    assert row["floor_fraction"] < row["floor_fraction_with_cache"]  # the cache is read every step too
    # the cache holds every layer kind: KV (and, in Qwen 3.5, the linear layers' conv/recurrent states)
    ids, _ = left_padded(VOCAB)
    _, result = gpu_bench._time_generate(model, ids, forward_extras(model, model_cfg(arch), ids), 3, 0, [2, 0], "cpu")
    cache = result.past_key_values
    kv_only = sum(
        layer.keys.numel() * layer.keys.element_size() * 2
        for layer in cache.layers
        if getattr(layer, "keys", None) is not None and layer.keys.numel()
    )
    assert gpu_bench.cache_bytes(cache) > (kv_only if arch == "qwen" else 0)


def test_decode_steps_lost_in_timing_noise_are_an_error_row_not_a_figure(monkeypatch):
    torch.manual_seed(0)
    model = gpu_bench.build_model("qwen", gpu_bench.tiny_config("qwen", VOCAB), "cpu", torch.float32)
    original = gpu_bench._time_generate
    monkeypatch.setattr(gpu_bench, "_time_generate", lambda *a, **k: (0.5, original(*a, **k)[1]))  # equal times
    out = gpu_bench.decode_benchmark(model, model_cfg("qwen"), [2], 8, 2, 1e6, "cpu", pad_id=0, eos_ids=[2, 0])
    (row,) = out["batches"]
    assert "steps_per_s" not in row
    assert "decode steps took no measurable time" in row["error"]


def test_a_random_gemma4_samples_what_its_teacher_forced_pass_scores_only_once_tempered():
    """As transformers initialises it, a random Gemma 4 at E4B depth attends nearly one-hot (q . k unscaled,
    norms at 1): bfloat16 rounding changes its log-probs by tenths, so its sampler and its teacher-forced
    pass disagree, as SEPO's first ratios did on an H200 (86% clipped). With the attention logits tempered,
    both agree within rounding, as they do for Qwen 3.5."""
    from benchmarks.gpu import logprob_agreement

    args = "--shape narrow --device cpu --rows 2 --prompt-tokens 96 --new-tokens 16 --model gemma4".split()
    raw, tempered = logprob_agreement.main(args)
    assert raw["bf16_vs_fp32"]["mean_abs"] > 0.1
    assert raw["sampled_vs_forced"]["clipped"] > 0  # of 32 tokens: 2 on an AVX2 CPU, more elsewhere
    assert tempered["bf16_vs_fp32"]["mean_abs"] < 0.02
    assert tempered["sampled_vs_forced"]["clipped"] == 0
    assert tempered["sampled_vs_forced"]["mean_abs"] < 0.02


def test_tempering_scales_every_text_attention_norm_and_nothing_else():
    model = gpu_bench.build_model("gemma4", gpu_bench.tiny_config("gemma4", VOCAB), "cpu", temper=False)
    before = {n: p.clone() for n, p in model.named_parameters()}
    changed = gpu_bench.temper_attention_logits(model)
    text = model.config.text_config
    assert changed == 2 * text.num_hidden_layers - text.num_kv_shared_layers  # shared layers have no k norm
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("language_model" in n and n.endswith(("q_norm.weight", "k_norm.weight")) for n in moved)
    assert len(moved) == changed
    for n in moved:
        weight = dict(model.named_parameters())[n]
        assert torch.allclose(weight, torch.full_like(weight, weight.shape[0] ** -0.25))


def test_linear_attention_path_is_reported():
    info = gpu_bench.linear_attention_kernels()
    assert set(info["paths"]) == {
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "causal_conv1d_fn",
        "causal_conv1d_update",
    }
    assert info["fast"] == all(p != "torch" for p in info["paths"].values())
    if not info["fast"]:
        assert info["missing"]
        assert set(info["missing"]) <= {"flash-linear-attention", "causal-conv1d"}
        assert "install" in info["note"]


def test_bitsandbytes_status_says_why_when_missing():
    status = gpu_bench.bitsandbytes_status()
    assert status["available"] or "bitsandbytes" in status["reason"]


def test_quantized_reference_shares_all_but_the_linears():
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = gpu_bench.build_model("qwen", gpu_bench.tiny_config("qwen", VOCAB), "cpu", torch.float32)
    peft = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=r".*self_attn\.q_proj"))
    ref = quantized_reference(peft)
    kinds = {type(m).__name__ for m in ref.modules()}
    assert "Linear4bit" in kinds
    assert "Linear" not in {type(m).__name__ for m in ref.model.layers.modules()}
    assert not any("lora" in n for n, _ in ref.named_modules())
    assert ref.model.embed_tokens.weight is model.model.embed_tokens.weight  # shared, not copied
    ids, mask = left_padded(VOCAB)
    with torch.no_grad():
        a = token_logprobs(ref, ids, mask, start=6)
        b = token_logprobs(model, ids, mask, start=6)
    assert (a - b).abs().max() < 0.5  # 4-bit weights, the same model


@pytest.mark.slow
def test_whole_flow_on_tiny_models_on_cpu(tmp_path):
    out = gpu_bench.run(bench_args("--tiny", "--device", "cpu", "--cache-dir", str(tmp_path)))
    assert set(out["models"]) == set(ARCHS)
    assert out["bandwidth"]["bytes_per_s"] > 0
    for arch, m in out["models"].items():
        assert all("steps_per_s" in row for row in m["decode"]["batches"]), arch
        assert m["sft"]["tokens_per_s"] > 0
        plain, quantized = m["sepo_step"]
        assert m["sepo_settings"]["game"] == "ipd"  # --sepo-game's default
        assert plain["decisions"] > 0
        assert not plain["skipped"]
        assert "step_s" in quantized or "skipped" in quantized


def test_a_part_that_breaks_leaves_the_others_figures(monkeypatch, tmp_path):
    """On the first GPU run, fla refused Qwen 3.5's backward pass in the SFT part and the whole JSON, the
    decode figures included, was lost."""

    def refuses(*args, **kwargs):
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results")

    monkeypatch.setattr(gpu_bench, "sft_benchmark", refuses)
    out = gpu_bench.run(
        bench_args("--tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--model", "qwen", "--decode-steps", "2")
    )
    qwen = out["models"]["qwen"]
    assert all("steps_per_s" in row for row in qwen["decode"]["batches"])
    assert qwen["sft"] == {
        "error": "RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results"
    }
    assert "skipped" in qwen["sepo_step"][0]  # the model may still carry the failed part's adapter


@pytest.mark.parametrize("arch", ARCHS)
def test_a_saved_random_checkpoint_runs_through_main_py(arch, cli, tmp_path):
    """What a GPU session without downloads does at full size (benchmarks/gpu/session.sh), on the tiny shapes:
    the real class saved with the tiny tokenizer in the model's own chat format, then a stage of main.py on it."""
    saved = gpu_bench.run(
        bench_args(
            "--tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--model", arch, "--save-to", str(tmp_path)
        )
    )
    assert saved == {arch: str(tmp_path / arch)}
    proc = cli(
        "stage=eval",
        "game=kuhn",
        f"model={arch}",
        f"model.path={tmp_path / arch}",
        "model.dtype=float32",
        "logger=none",
        "eval.episodes_per_opponent=2",
        "eval.max_new_tokens=8",
        "eval.action_samples=4",
        "eval.progress=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.cache_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["model"].startswith(arch)
    assert result["episodes"] > 0


# --------------------------------------------------------------------------- on a GPU
@pytest.fixture(scope="module")
def cuda_models():
    models = {}
    for arch in ARCHS:
        torch.manual_seed(0)
        models[arch] = gpu_bench.build_model(arch, gpu_bench.tiny_config(arch, VOCAB), "cuda", torch.bfloat16)
    return models


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_bf16_generation_on_cuda(arch, cuda_models):
    model = cuda_models[arch]
    assert model.dtype == torch.bfloat16
    assert next(model.parameters()).is_cuda
    ids, mask = left_padded(VOCAB, "cuda")
    extras = forward_extras(model, model_cfg(arch), ids)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            min_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=[2],
            **extras,
        )
        logits = model(input_ids=ids, attention_mask=mask, **extras).logits
    assert out.shape == (2, ids.shape[1] + 6)
    assert torch.equal(out[:, : ids.shape[1]], ids)
    assert torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_bf16_logprobs_on_cuda_match_the_reference(arch, cuda_models):
    model = cuda_models[arch]
    ids, mask = left_padded(VOCAB, "cuda")
    extras = forward_extras(model, model_cfg(arch), ids)
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, start=6, chunk=4, **extras)
        ref = token_logprobs_reference(model, ids, mask, start=6, **extras)
    assert lp.dtype == torch.float32
    assert torch.isfinite(lp).all()
    # bf16 logits: the chunked head and the model's own head round differently, within bf16 precision
    torch.testing.assert_close(lp, ref, atol=0.1, rtol=0.02)
    assert (lp - ref).abs().mean() < 0.02


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_sepo_step_and_whole_flow_on_cuda(tmp_path):
    out = gpu_bench.run(bench_args("--tiny", "--cache-dir", str(tmp_path)))
    assert out["device"] != "cpu"
    assert out["bandwidth"]["gb_per_s"] > 10
    for arch, m in out["models"].items():
        assert m["dtype"] == "bfloat16", arch
        assert m["logits_finite"], arch
        assert all("steps_per_s" in row and row["peak_mib"] > 0 for row in m["decode"]["batches"]), arch
        assert m["sft"]["tokens_per_s"] > 0
        assert m["sft"]["peak_mib"] > 0
        plain, quantized = m["sepo_step"]
        assert m["sepo_settings"]["game"] == "ipd"  # --sepo-game's default
        assert plain["decisions"] > 0, plain
        assert plain["peak_mib"] > 0, plain
        assert not plain["skipped"], plain
        if gpu_bench.bitsandbytes_status()["available"]:
            assert quantized["step_s"] > 0, quantized
            assert quantized["peak_mib"] > 0, quantized
        else:
            assert "bitsandbytes" in quantized["skipped"]


class ToyDecoderLayer(torch.nn.Module):
    """One trainable projection: autograd keeps exactly its input for the weight's gradient."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        return self.proj(x)


class ToyLM(torch.nn.Module):
    def __init__(self, vocab: int, width: int, layers: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width).requires_grad_(False)
        self.layers = torch.nn.ModuleList(ToyDecoderLayer(width) for _ in range(layers))

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


def test_saved_activations_counts_what_each_layer_keeps_and_no_weight():
    """Each toy layer keeps its [1, T, width] float32 input and nothing else; the weights autograd also
    saves (for the input's gradient) are not counted, the input embedding's output is not kept (frozen)."""
    from benchmarks.gpu.saved_activations import saved_bytes_by_layer

    tokens, width = 5, 8
    totals = saved_bytes_by_layer(ToyLM(vocab=11, width=width, layers=2), ["first", "second"], tokens, seed=0)
    assert totals == {"first": tokens * width * 4, "second": tokens * width * 4}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_model_loaded_on_cuda_trains_without_cudnn_attention(arch, tmp_path):
    """cuDNN's attention backward returned NaN in SEPO's update on an H200 (docs/speed.md §4e): a model
    loaded for a run leaves that kernel out, and its left-padded teacher-forced pass has finite gradients."""
    gpu_bench.run(
        bench_args(
            "--tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--model", arch, "--save-to", str(tmp_path)
        )
    )
    torch.backends.cuda.enable_cudnn_sdp(True)
    model, _ = load_pretrained(tmp_path / arch, model_cfg(arch), device="cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    ids, mask = left_padded(model.config.get_text_config().vocab_size, "cuda")
    extras = forward_extras(model, model_cfg(arch), ids)
    model.train()
    lp = token_logprobs(model, ids, mask, start=6, chunk=4, **extras)
    torch.where(mask[:, 6:].bool(), lp, torch.zeros_like(lp)).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
