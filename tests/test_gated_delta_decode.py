"""Qwen 3.5's Gated DeltaNet decode step in five passes (`sepo.lm.gated_delta_decode`, `model.lean_delta_decode`):
the same arithmetic as transformers' reference, to float rounding, on the state in place, and only where the
reference would run its single-token step."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, StaticCache
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

from benchmarks.gpu import full_size
from sepo.lm import gated_delta_decode
from sepo.lm.gated_delta_decode import lean_recurrent_step, use_lean_delta_decode
from sepo.lm.graph_decoding import graph_decoding

from .conftest import Tracing

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
    pytest.mark.usefixtures("one_thread"),
]


@pytest.fixture
def reference(monkeypatch):
    """transformers' own step, in the module for the test (a model loaded earlier in this process may have
    installed the lean one); the module is put back as it was after the test."""
    current = qwen.torch_recurrent_gated_delta_rule
    monkeypatch.setattr(qwen, "torch_recurrent_gated_delta_rule", getattr(current, "reference", current))
    return qwen.torch_recurrent_gated_delta_rule


def one_token(batch=3, k_heads=2, v_heads=4, k_dim=8, v_dim=6, tokens=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, tokens, k_heads, k_dim, generator=g) for _ in range(2))
    v = torch.randn(batch, tokens, v_heads, v_dim, generator=g)
    decay, beta = -torch.rand(batch, tokens, v_heads, generator=g), torch.rand(batch, tokens, v_heads, generator=g)
    state = torch.randn(batch, v_heads, k_dim, v_dim, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("l2norm", [True, False])
@pytest.mark.parametrize("k_heads", [2, 4])  # grouped value heads, and one key head per value head
def test_the_lean_step_is_the_reference_step(reference, l2norm, k_heads):
    q, k, v, decay, beta, state = one_token(k_heads=k_heads)
    kwargs = {"g": decay, "beta": beta, "output_final_state": True, "use_qk_l2norm_in_kernel": l2norm}
    with torch.no_grad():
        want_out, want_state = reference(q, k, v, initial_state=state.clone(), **kwargs)
        buffer = state.clone()
        out, new_state = lean_recurrent_step(reference)(q, k, v, initial_state=buffer, **kwargs)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_state, want_state, atol=1e-5, rtol=1e-5)
    assert new_state.data_ptr() == buffer.data_ptr()  # updated in place: the cache's copy back is a no-op


@pytest.mark.parametrize("case", ["prompt", "gradients", "no state"])
def test_everything_but_a_decode_step_goes_to_the_reference(reference, case):
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    q, k, v, decay, beta, state = one_token(tokens=3 if case == "prompt" else 1)
    lean = lean_recurrent_step(counting)
    with torch.set_grad_enabled(case == "gradients"):
        lean(q, k, v, g=decay, beta=beta, initial_state=None if case == "no state" else state)
    assert calls == [1]


def test_a_fast_kernel_is_left_in_place(monkeypatch):
    def fast_kernel(*args, **kwargs):  # what flash-linear-attention's binding looks like from here: no fallback flag
        raise AssertionError("not called")

    monkeypatch.setattr(qwen, "torch_recurrent_gated_delta_rule", fast_kernel)
    assert use_lean_delta_decode() is False
    assert qwen.torch_recurrent_gated_delta_rule is fast_kernel


def test_installing_twice_wraps_once(reference):
    assert use_lean_delta_decode() is True
    first = qwen.torch_recurrent_gated_delta_rule
    assert use_lean_delta_decode() is True and qwen.torch_recurrent_gated_delta_rule is first
    assert getattr(first, gated_delta_decode._PATCHED)


@pytest.mark.parametrize("graphs", [False, True])
def test_a_tiny_qwen_decodes_the_reference_tokens(reference, graphs):
    """Whole generations of a tiny random Qwen 3.5, greedy, left-padded: the lean step's tokens are the
    reference's, also inside replayed graphs (traced on the CPU: the state is written in place)."""
    model = full_size.build_model("qwen", full_size.tiny_config("qwen", 512), "cpu", torch.float32)
    ids = torch.randint(3, 512, (3, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    config = GenerationConfig(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=[2])
    want = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    use_lean_delta_decode()
    if graphs:
        with graph_decoding(model, Tracing) as graphed:
            cache = StaticCache(config=model.config, max_cache_len=22)
            got = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, past_key_values=cache)
        assert graphed.replays > 0
    else:
        got = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device")
def test_the_lean_step_is_the_reference_step_on_cuda(reference):
    """Qwen3.5-4B's layer shape at 8 rows on the GPU (the batched products there are cuBLAS's, in fp32)."""
    q, k, v, decay, beta, state = (x.cuda() for x in one_token(batch=8, k_heads=16, v_heads=32, k_dim=128, v_dim=128))
    kwargs = {"g": decay, "beta": beta, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    with torch.no_grad():
        want_out, want_state = reference(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), initial_state=state.clone(), **kwargs
        )
        out, new_state = lean_recurrent_step(reference)(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), initial_state=state, **kwargs
        )
    torch.testing.assert_close(new_state, want_state, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.float(), want_out.float(), atol=2e-2, rtol=2e-2)
