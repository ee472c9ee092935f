"""The one padding layout of the project: prompts left-padded to a common width, continuations right-padded
after them. It is `generate`'s own output layout, so sampling, teacher-forced scoring and SFT's greedy
answers all put a continuation's token t at column P + t of every row, and a pass over the prompts'
shared prefix (`shared_prefix_length`) sits in the same columns of every row.

Position ids follow the attention mask (`sepo.lm.logprobs.position_ids_from_mask`), so padding inside a
row (between a cached region and the rest) changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: A prompt prefix shared by every row is computed once only when it is at least this long: below it the
#: extra forward pass costs more than it saves.
MIN_SHARED_PREFIX = 16


def left_pad(seqs: Sequence[Sequence[int]], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows right-aligned in `width` columns: input ids and attention mask (CPU tensors)."""
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        if s:
            ids[r, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[r, width - len(s) :] = 1
    return ids, mask


def pack(
    prompts: Sequence[Sequence[int]], pad: int, continuations: Sequence[Sequence[int]] | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Prompts left-padded to a common width P, continuations right-padded after them: input ids,
    attention mask (CPU tensors) and P."""
    continuations = continuations or [[] for _ in prompts]
    width_p = max(len(p) for p in prompts)
    prompt_ids, prompt_mask = left_pad(prompts, width_p, pad)
    width_c = max(len(c) for c in continuations)
    cont_ids = torch.full((len(prompts), width_c), pad, dtype=torch.long)
    cont_mask = torch.zeros_like(cont_ids)
    for i, c in enumerate(continuations):
        cont_ids[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
        cont_mask[i, : len(c)] = 1
    return torch.cat([prompt_ids, cont_ids], dim=1), torch.cat([prompt_mask, cont_mask], dim=1), width_p


def pack_split(
    prompts: Sequence[Sequence[int]],
    split: Sequence[int],
    pad: int,
    continuations: Sequence[Sequence[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Rows laid out as [padding][prompt[:split]] [padding][prompt[split:]][continuation][padding].

    The first region (width A) holds what a cache serves: a prefix shared by every row, or each
    episode's earlier prompt; the second is encoded now. A continuation's token t sits at column P + t
    in every row, as in `pack`. Returns input ids, attention mask (CPU tensors), the prompts' width P
    and the first region's width A.
    """
    heads = [list(p[:k]) for p, k in zip(prompts, split)]
    width_a = max(map(len, heads), default=0)
    ids, mask, width = pack([list(p[k:]) for p, k in zip(prompts, split)], pad, continuations)
    if width_a == 0:
        return ids, mask, width, 0
    head_ids, head_mask = left_pad(heads, width_a, pad)
    return torch.cat([head_ids, ids], dim=1), torch.cat([head_mask, mask], dim=1), width_a + width, width_a


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def common_prefix_length(sequences: Sequence[Sequence[int]], limit: int) -> int:
    """How many leading tokens every one of `sequences` shares, at most `limit` (<= the first's length)."""
    first = sequences[0]
    return min([limit] + [common_prefix(first, other) for other in sequences[1:]])


def shared_prefix_length(prompts: Sequence[Sequence[int]], minimum: int = MIN_SHARED_PREFIX) -> int:
    """Tokens at the start of every prompt that one cached pass can serve for all rows (0: none): at
    least `minimum` long, and leaving every row at least one token of its own (generate needs a new
    token per row to start from)."""
    if len(prompts) < 2:
        return 0
    length = common_prefix_length(prompts, min(len(p) for p in prompts) - 1)
    return length if length >= minimum else 0


def score_passes(candidates: Sequence[int], batch: int) -> list[range]:
    """Pair indices (prompt by prompt, `candidates[i]` pairs each) in passes of at most `batch`: prompts
    with few candidates share a pass, and a prompt whose candidates do not fit into the current pass
    starts its own passes, so no pass holds part of one prompt's candidates beside another prompt's."""
    passes: list[range] = []
    start, open_to_more = 0, False  # open_to_more: the last pass holds whole prompts only
    for count in candidates:
        if count == 0:
            continue
        if open_to_more and len(passes[-1]) + count <= batch:
            passes[-1] = range(passes[-1].start, start + count)
        else:
            passes += [range(k, min(k + batch, start + count)) for k in range(start, start + count, batch)]
            open_to_more = count <= batch
        start += count
    return passes


def end_of_turn_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end an assistant turn: the generation config's EOS ids and the tokenizer's. Sampling
    keeps the first one an answer writes and drops what follows; SFT trains the answer up to it."""
    gen = getattr(model, "generation_config", None)
    eos = gen.eos_token_id if gen is not None else None
    ids = {eos} if isinstance(eos, int) else set(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
