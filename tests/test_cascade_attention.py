"""Cascade attention (sepo/lm/cascade_attention.py): a decoding step that reads the rows' shared prefix once
gives SDPA's attention (a policy decoding with it: tests/test_lm_policy.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sepo.lm.cascade_attention as cascade
from sepo.lm.cascade_attention import decode_step_attention, shared_prefix

pytestmark = pytest.mark.usefixtures("one_thread")


def shared_cache(rows: int, kv_heads: int, shared: int, own: int, dim: int, seed: int = 0):
    """Keys and values whose first `shared` columns are the same in every row, as `start_cache` expands them."""
    g = torch.Generator().manual_seed(seed)
    prefix_k, prefix_v = (torch.randn(kv_heads, shared, dim, generator=g) for _ in range(2))
    own_k, own_v = (torch.randn(rows, kv_heads, own, dim, generator=g) for _ in range(2))
    keys = torch.cat([prefix_k.expand(rows, -1, -1, -1), own_k], dim=2)
    values = torch.cat([prefix_v.expand(rows, -1, -1, -1), own_v], dim=2)
    return keys, values


@pytest.mark.parametrize("mask_kind", ["bool", "additive", None])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4)])
def test_one_decoding_step_equals_sdpa_over_the_whole_cache(mask_kind, heads, kv_heads):
    rows, shared, own, dim = 5, 17, 11, 8
    keys, values = shared_cache(rows, kv_heads, shared, own, dim)
    query = torch.randn(rows, heads, 1, dim, generator=torch.Generator().manual_seed(1))
    allowed = torch.ones(rows, shared + own, dtype=torch.bool)
    allowed[:, -4:] = False  # columns not written yet
    allowed[0, shared : shared + 3] = False  # a row's padding
    mask = {"bool": allowed, "additive": torch.where(allowed, 0.0, torch.finfo(torch.float32).min), None: None}[
        mask_kind
    ]
    full = None if mask is None else mask[:, None, None, :]
    want = F.scaled_dot_product_attention(query, keys, values, attn_mask=full, enable_gqa=True)
    own_mask = None if mask is None else mask[:, shared:]
    got = decode_step_attention(
        query,
        keys[0, :, :shared],
        values[0, :, :shared],
        keys[:, :, shared:],
        values[:, :, shared:],
        own_mask,
        dim**-0.5,
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_outside_a_declared_prefix_it_is_sdpa_itself(monkeypatch):
    """No prefix declared, a pass of several tokens, or training: transformers' SDPA, untouched."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    keys, values = shared_cache(2, 3, 6, 4, 8)
    for q_len, declared, training in ((1, 0, False), (3, 6, False), (1, 6, True)):
        module.train(training)
        query = torch.randn(2, 9, q_len, 8, generator=torch.Generator().manual_seed(q_len))
        mask = torch.ones(2, 1, q_len, 10, dtype=torch.bool).tril(diagonal=10 - q_len)
        with shared_prefix(declared):
            got, _ = cascade.cascade_attention_forward(module, query, keys, values, mask)
        want, _ = sdpa_attention_forward(module, query, keys, values, mask)
        assert torch.equal(got, want)
