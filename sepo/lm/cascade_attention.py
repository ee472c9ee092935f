"""Decoding attention that reads a prefix every row shares once for the whole batch (cascade attention).

A decoding step of a 135M model on 2 cores is bound by memory traffic, and at 32 rows or more most of it
is the KV cache: every row reads its own copy of the game's rules (the prefix `start_cache` expanded into
every row), ~230 KB per row and layer for a 300-token Kuhn prompt. When the first `shared` columns of
every row's cache hold the same keys and values, the step's attention splits exactly in two (softmax over
the union of two key sets = the two partial softmaxes merged by their log-sum-exp): the shared part is one
matrix product of all rows' queries against one copy of the prefix, the rest is each row's own columns.

Registered with transformers as attention implementation `sepo_cascade` (`use_cascade_attention`); every
pass that is not such a decoding step (prompt processing, teacher-forced scoring, training, or no shared
prefix declared) runs transformers' own SDPA unchanged. `shared_prefix(columns)` declares the prefix for
the decoding inside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

NAME = "sepo_cascade"

#: columns [0, n) of every row's KV cache hold the same keys and values (0: nothing declared)
_SHARED_COLUMNS: ContextVar[int] = ContextVar("sepo_shared_columns", default=0)


@contextmanager
def shared_prefix(columns: int) -> Iterator[None]:
    """Within: decoding steps read cache columns [0, `columns`) from the first row, for every row."""
    token = _SHARED_COLUMNS.set(int(columns))
    try:
        yield
    finally:
        _SHARED_COLUMNS.reset(token)


def cascade_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, H, q, d], key/value [B, KV, L, d]; returns [B, q, H, d]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shared = _SHARED_COLUMNS.get()
    if shared <= 0 or query.shape[2] != 1 or module.training or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    own_mask = None if attention_mask is None else attention_mask[:, 0, -1, shared:]
    if own_mask is not None:  # a static cache's columns not written yet: no row attends to them, none is read
        written = written_columns(own_mask)
        own_mask, key, value = own_mask[:, :written], key[:, :, : shared + written], value[:, :, : shared + written]
    out = decode_step_attention(
        query, key[0, :, :shared], value[0, :, :shared], key[:, :, shared:], value[:, :, shared:], own_mask, scale
    )
    return out.transpose(1, 2).contiguous(), None


def written_columns(own_mask: torch.Tensor) -> int:
    """1 + the last own column some row attends to (boolean mask: True; additive: 0)."""
    open_ = own_mask if own_mask.dtype == torch.bool else own_mask == 0
    columns = torch.nonzero(open_.any(dim=0))
    return int(columns.max()) + 1 if len(columns) else 1


def decode_step_attention(
    query: torch.Tensor,
    prefix_keys: torch.Tensor,
    prefix_values: torch.Tensor,
    own_keys: torch.Tensor,
    own_values: torch.Tensor,
    own_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """One query token per row [B, H, 1, d] against a prefix held once [KV, S, d] and each row's own
    columns [B, KV, T, d] (`own_mask` [B, T]: True or 0 where a row may attend, False or -inf where not).
    Scores, softmax and the weighted sums in float32, as SDPA's CPU kernel accumulates; returns [B, H, 1, d]."""
    rows, heads, _, dim = query.shape
    kv_heads, shared = prefix_keys.shape[0], prefix_keys.shape[1]
    groups = heads // kv_heads
    q = query.float().view(rows, kv_heads, groups, dim)
    # every row's queries against the one prefix: [KV, B * groups, d] x [KV, d, S]
    q_by_head = q.transpose(0, 1).reshape(kv_heads, rows * groups, dim)
    prefix_scores = torch.matmul(q_by_head, prefix_keys.float().transpose(1, 2))
    prefix_scores = prefix_scores.view(kv_heads, rows, groups, shared).transpose(0, 1)
    own_scores = torch.matmul(q, own_keys.float().transpose(2, 3))  # [B, KV, groups, T]
    if own_mask is not None:
        own_mask = own_mask[:, None, None, :]
        if own_mask.dtype == torch.bool:
            own_scores = own_scores.masked_fill(~own_mask, float("-inf"))
        else:
            own_scores = own_scores + own_mask.float()
    weights = torch.softmax(torch.cat([prefix_scores, own_scores], dim=-1) * scale, dim=-1)
    prefix_weights = weights[..., :shared].transpose(0, 1).reshape(kv_heads, rows * groups, shared)
    out = torch.matmul(prefix_weights, prefix_values.float()).view(kv_heads, rows, groups, dim).transpose(0, 1)
    out = out + torch.matmul(weights[..., shared:], own_values.float())
    return out.reshape(rows, heads, 1, dim).to(query.dtype)


def use_cascade_attention(model: Any) -> None:
    """Switch `model` to `sepo_cascade`: SDPA everywhere, cascade attention in declared decoding steps."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, cascade_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
