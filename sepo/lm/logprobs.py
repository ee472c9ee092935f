"""Per-token log-probabilities of given tokens, with bounded memory (docs/spec.md §4, item 6).

A full-vocabulary log-softmax over every position costs `positions x vocab` floats: for Gemma 4
(vocab 262,144) and 512 generated tokens that is half a gigabyte per sequence, twice over once the
log-softmax output exists. Here the model's final hidden states are taken once and the output head
plus log-softmax is applied `chunk` positions at a time; each chunk is reduced to the one gathered
value per position and dropped before the next, so peak memory does not grow with the generation
length. With gradients on, each chunk is recomputed in the backward pass (activation checkpointing)
so that training keeps the same bound.

`token_logprobs_reference` is the plain unchunked computation, for tests and the benchmark.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from sepo.lm.prompt_cache import prefix_pass

Head = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


def position_ids_from_mask(attention_mask: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Positions that skip left padding, exactly as `generate` builds them, counted from `start` (the
    length of a prefix already in the KV cache); 0 on padding.

    Passing them explicitly keeps teacher-forced passes over left-padded batches consistent with
    what the model saw while sampling (and a padded row consistent with the same row alone).
    """
    pos = attention_mask.long().cumsum(-1) - 1 + start
    return pos.masked_fill(attention_mask == 0, 0)


def densely_strided(t: torch.Tensor) -> torch.Tensor:
    """`t` with row-major strides, copied only when it has others.

    `contiguous()` is not enough: a [1, 1, H] slice of [1, T, H] counts as contiguous (a size-one
    dimension's stride is ignored) yet keeps the stride T x H, and `torch.matmul` then cannot fold it
    into one matrix product: it expands the other operand per row and runs a batched product. Before an
    output head that means a copy of the [vocabulary, width] weight per row: 43 ms instead of 2 ms for
    SmolLM2's head on this CPU (76 ms for 2 rows), and for Gemma 4 (262,144 x 2,560) 1.3 GB per row.
    """
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= size
    return t if t.stride() == tuple(reversed(expected)) else t.clone(memory_format=torch.contiguous_format)


def _softcap(model: torch.nn.Module) -> float | None:
    """Gemma-style final logit soft-capping, which the model applies after its head."""
    cfg = model.config
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(text_cfg, "final_logit_softcapping", None)


def _logits(hidden: torch.Tensor, head: Head, temperature: float, softcap: float | None) -> torch.Tensor:
    hidden = densely_strided(hidden)  # a strided slice of positions would make matmul copy the head per row
    logits = hidden @ head.T if isinstance(head, torch.Tensor) else head(hidden)
    logits = logits.float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def _chunk_logprobs(
    hidden: torch.Tensor, head: Head, targets: torch.Tensor, temperature: float, softcap: float | None
) -> torch.Tensor:
    logp = F.log_softmax(_logits(hidden, head, temperature, softcap), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def chunked_logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: Head,
    targets: torch.Tensor,
    chunk: int = 32,
    temperature: float = 1.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """log softmax(head(hidden[:, t]))[targets[:, t]] for every t, `chunk` positions at a time.

    hidden: [B, T, H] (the states that predict `targets`), lm_head_weight: a [V, H] weight or the
    head module itself, targets: [B, T]. Returns float32 [B, T].
    """
    out = []
    for s in range(0, hidden.shape[1], chunk):
        h, y = hidden[:, s : s + chunk], targets[:, s : s + chunk]
        if torch.is_grad_enabled() and h.requires_grad:
            out.append(checkpoint(_chunk_logprobs, h, lm_head_weight, y, temperature, softcap, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(h, lm_head_weight, y, temperature, softcap))
    if not out:
        return hidden.new_zeros(targets.shape, dtype=torch.float32)
    return torch.cat(out, dim=1)


def logprobs_from_hidden_reference(
    hidden: torch.Tensor,
    lm_head_weight: Head,
    targets: torch.Tensor,
    temperature: float = 1.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """The same as `chunked_logprobs_from_hidden` in one piece (memory grows with T)."""
    return _chunk_logprobs(hidden, lm_head_weight, targets, temperature, softcap)


def forward_inputs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, **forward_kwargs: Any
) -> dict[str, Any]:
    """Keyword arguments of a forward pass over a (left- or right-)padded batch."""
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wrappers
    if "position_ids" not in kwargs and "position_ids" in inspect.signature(base.forward).parameters:
        kwargs["position_ids"] = position_ids_from_mask(attention_mask)
    return kwargs


@contextmanager
def head_inputs(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """The hidden states handed to the output head while the block runs (appended to the yielded list);
    the head itself gets the last position only, so no [B, T, V] logits are computed."""
    captured: list[torch.Tensor] = []

    def grab(_module: torch.nn.Module, args: tuple) -> tuple:
        captured.append(args[0])
        return (densely_strided(args[0][:, -1:]),) + tuple(args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(grab)
    try:
        yield captured
    finally:
        handle.remove()


def final_hidden_states(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    shared_prefix: int = 0,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """The hidden states the output head would read, [B, T, H], without computing [B, T, V] logits.

    A pre-hook on the output embeddings records its input and hands the head a single position, so
    this works unchanged for any causal LM, multimodal wrapper or PEFT model whatever its final norm,
    KV sharing or adapters (and with `disable_adapter()` for a reference model).

    `shared_prefix` = P > 0: the first P tokens are the same in every row (and unmasked), so they are
    run once, as a batch of one, and their KV cache is repeated for the batch; the rows' own tokens
    then attend to it. Gradients flow through the cache (the adapter acts on the prefix too).
    Returns the states of positions P..T-1 only, [B, T - P, H].
    """
    with head_inputs(model) as captured:
        if shared_prefix:
            if forward_kwargs:
                raise ValueError("shared_prefix works with plain input ids only (no extra model inputs)")
            cache = prefix_pass(model, input_ids[:1, :shared_prefix])
            cache.batch_repeat_interleave(input_ids.shape[0])
            kwargs = forward_inputs(model, input_ids, attention_mask)
            kwargs["input_ids"] = input_ids[:, shared_prefix:]
            if "position_ids" in kwargs:
                kwargs["position_ids"] = kwargs["position_ids"][:, shared_prefix:]
            model(**kwargs, past_key_values=cache, use_cache=True)
        else:
            model(**forward_inputs(model, input_ids, attention_mask, **forward_kwargs), use_cache=False)
    return captured[-1]


def next_token_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, **forward_kwargs: Any
) -> torch.Tensor:
    """Float32 logits [B, V] of the token after each (left-padded) row, soft-capped like the model's."""
    hidden = final_hidden_states(model, input_ids, attention_mask, **forward_kwargs)
    return _logits(hidden[:, -1], model.get_output_embeddings(), 1.0, _softcap(model))


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    start: int,
    chunk: int = 32,
    temperature: float = 1.0,
    shared_prefix: int = 0,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, <t]) for t in [start, T), as float32 [B, T - start].

    `start` >= 1 is the first scored position (the length of the left-padded prompt). Positions
    whose attention mask is 0 (right padding) get values that callers must mask out.
    `temperature` divides the logits first: the log-probs of the distribution sampled from.
    `shared_prefix` (< `start`): tokens common to every row, run once (`final_hidden_states`).
    """
    if shared_prefix >= start:
        raise ValueError(f"shared_prefix={shared_prefix} must end before the first scored position ({start})")
    hidden = final_hidden_states(model, input_ids, attention_mask, shared_prefix, **forward_kwargs)
    return chunked_logprobs_from_hidden(
        hidden[:, start - 1 - shared_prefix : -1],
        model.get_output_embeddings(),
        input_ids[:, start:],
        chunk,
        temperature,
        _softcap(model),
    )


def token_logprobs_reference(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    start: int,
    temperature: float = 1.0,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """Unchunked `token_logprobs`: the model's own full logits, one log-softmax over everything."""
    logits = model(**forward_inputs(model, input_ids, attention_mask, **forward_kwargs), use_cache=False).logits
    logp = F.log_softmax(logits[:, start - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)
