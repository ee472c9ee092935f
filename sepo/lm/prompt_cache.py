"""Prompt tokens encoded once: the KV cache a decoding starts from.

Two reuses, both exact (the same keys and values a full pass computes; position ids follow the attention
mask, so the padding between a cached region and the rest changes nothing):
- a prefix shared by every row of a batch (a game's rules) is encoded once, as a batch of one
  (`encode_prefix`), and serves every row: the policy's decoding and SFT's greedy answers;
- each episode's previous prompt, kept with its keys and values (`EncodedPrompt`, `PromptCache`), serves
  the part its next prompt shares with it (the rules and the earlier history), so only the new history
  lines are encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sepo.lm import batching
from sepo.lm.batching import MIN_SHARED_PREFIX, common_prefix


def prompt_columns(t: torch.Tensor, row: int, shared: int, width_a: int, own: int, width_p: int) -> torch.Tensor:
    """Row `row`'s prompt in a cache laid out [shared part | own part]: the last `shared` columns of the
    first `width_a`, then the last `own` of the first `width_p` (both parts are left-padded)."""
    return torch.cat([t[row, :, width_a - shared : width_a], t[row, :, width_p - own : width_p]], dim=1)


@dataclass
class EncodedPrompt:
    """An episode's last prompt and its keys and values per layer ([heads, tokens, head dim]).

    Holding the episode's state object keeps its id from being reused by another object while the
    entry lives. The entry is valid only for the weights that computed it: the arena never changes
    weights in the middle of an episode, and every new episode has a new state.
    """

    state: Any
    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def common_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading tokens `prompt` shares with this entry's prompt."""
        return common_prefix(self.ids, prompt)


class PromptCache:
    """Each episode's encoded last prompt, by id of its state, for its next decision.

    A lockstep round of decisions reads the entries of the round before (`plan`) and writes its own
    (`keep`); `round_over` makes them the ones to read: only the episodes that just acted can act next,
    so the entries of the others (over) go. `clear` drops everything (every episode over): kept, they
    would hold one KV cache per episode through whatever runs next, such as SEPO's update.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.held: dict[int, EncodedPrompt] = {}
        self.written: dict[int, EncodedPrompt] = {}

    def clear(self) -> None:
        self.held, self.written = {}, {}

    def round_over(self) -> None:
        self.held, self.written = self.written, {}

    def plan(
        self, states: Sequence[Any], prompts: Sequence[Sequence[int]]
    ) -> tuple[list[EncodedPrompt | None], list[int]]:
        """Per decision: its episode's encoded earlier prompt and how many of its leading tokens the
        new prompt shares (at least `MIN_SHARED_PREFIX`, leaving one token to encode), or (None, 0)."""
        reused: list[EncodedPrompt | None] = []
        split: list[int] = []
        for state, prompt in zip(states, prompts):
            entry = self.held.get(id(state)) if self.enabled else None
            k = entry.common_prefix(prompt) if entry is not None and entry.state is state else 0
            k = min(k, len(prompt) - 1)
            reused.append(entry if k >= MIN_SHARED_PREFIX else None)
            split.append(k if k >= MIN_SHARED_PREFIX else 0)
        return reused, split

    def release(self, states: Sequence[Any], reused: Sequence[EncodedPrompt | None]) -> None:
        """Drop the entries copied into a cache: their episodes' next entries replace them (`keep`)."""
        for state, entry in zip(states, reused):
            if entry is not None:
                del self.held[id(state)]

    def keep(
        self,
        states: Sequence[Any],
        prompts: Sequence[Sequence[int]],
        cache: Any,
        split: Sequence[int],
        width_a: int,
        width_p: int,
    ) -> None:
        """Keep each row's encoded prompt (its columns of the cache) for its episode's next decision."""
        for i, (state, prompt) in enumerate(zip(states, prompts)):
            shared, own = split[i], len(prompt) - split[i]
            self.written[id(state)] = EncodedPrompt(
                state,
                list(prompt),
                [prompt_columns(layer.keys, i, shared, width_a, own, width_p) for layer in cache.layers],
                [prompt_columns(layer.values, i, shared, width_a, own, width_p) for layer in cache.layers],
            )


def prefix_pass(
    model: Any, prefix: torch.Tensor, extras: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None
) -> Any:
    """The KV cache of one pass over `prefix` ([1, tokens]), with gradients as the caller has them enabled:
    SFT's and SEPO's passes train through it (its backward sums what every row that reads it leaves)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(
        input_ids=prefix,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,  # only the cache is wanted: not [tokens, vocabulary] logits
        **(extras(prefix) if extras is not None else {}),
    )
    return cache


@torch.no_grad()
def continued_next_token_logits(
    model: Any,
    cache: Any,
    columns: torch.Tensor,
    rows: Sequence[int],
    kept: Sequence[int],
    suffixes: Sequence[Sequence[int]],
    pad_id: int,
    extras: Callable[[torch.Tensor], dict[str, torch.Tensor]],
) -> torch.Tensor:
    """Float32 logits [len(rows), V] of the token after row `rows[k]`'s first `kept[k]` encoded tokens
    followed by `suffixes[k]`: a question asked after an answer the cache already holds (the constrained
    fallback), so only the question is encoded.

    `cache` is a generation's (every layer's keys [rows, heads, columns, dim]); `columns` (bool [rows,
    columns]) marks the columns holding each row's tokens, in order. The kept columns and the suffix (left-
    padded) form one pass; position ids count the row's tokens, so the padding in between changes nothing.
    """
    from transformers import DynamicCache

    index = torch.tensor(list(rows), dtype=torch.long, device=columns.device)
    valid = columns[index]
    keep = valid & (valid.long().cumsum(1) <= torch.tensor(list(kept), device=valid.device)[:, None])
    width = int(keep.any(0).nonzero().max()) + 1 if bool(keep.any()) else 0
    keep = keep[:, :width]
    ids, mask = batching.left_pad([list(s) for s in suffixes], max(map(len, suffixes)), pad_id)
    device = keep.device
    ids, mask = ids.to(device), mask.to(device)
    positions = torch.tensor(list(kept), device=device)[:, None] + (mask.cumsum(1) - 1).clamp(min=0)
    past = DynamicCache(config=model.config)
    for number, layer in enumerate(cache.layers):
        past.update(layer.keys[index, :, :width], layer.values[index, :, :width], number)
    out = model(
        input_ids=ids,
        attention_mask=torch.cat([keep.long(), mask], dim=1),
        position_ids=positions,
        past_key_values=past,
        use_cache=True,
        logits_to_keep=1,
        **extras(ids),
    )
    return out.logits[:, -1].float()


def repeated_cache(model: Any, prefix: Any, rows: int) -> Any:
    """A fresh cache holding `prefix`'s keys and values (a `prefix_pass`) for `rows` rows: several passes
    can extend one prefix, each its own copy, and gradients flow back into the prefix's one pass."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for index, layer in enumerate(prefix.layers):
        cache.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), index)
    return cache


@torch.no_grad()
def encode_prefix(model: Any, prefix: torch.Tensor, extras: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> Any:
    """`prefix_pass` without gradients: a prefix every row of a batch shares, for decoding."""
    return prefix_pass(model, prefix, extras)


def start_cache(
    model: Any,
    ids: torch.Tensor,
    width_a: int,
    shared: int,
    reused: Sequence[EncodedPrompt | None],
    split: Sequence[int],
    static_tokens: int | None,
    extras: Callable[[torch.Tensor], dict[str, torch.Tensor]],
) -> Any:
    """The KV cache `generate` starts from, holding the first `width_a` columns of `ids`.

    With a shared prefix (`shared` > 0), one pass over it (`encode_prefix`) fills the cache for every
    row; otherwise row i gets the first `split[i]` positions of its episode's earlier prompt
    (`reused[i]`), right-aligned. With `static_tokens` (the answer budget) the cache is preallocated for
    the prompt and the whole answer and written in place: a dynamic cache concatenates (copies) every
    layer's keys and values at every decoding step.
    """
    from transformers import DynamicCache, StaticCache

    rows = ids.shape[0]
    cache = (
        StaticCache(config=model.config, max_cache_len=ids.shape[1] + static_tokens)
        if static_tokens is not None
        else DynamicCache(config=model.config)
    )
    if shared:
        prefix = encode_prefix(model, ids[:1, :shared], extras)
        for index, layer in enumerate(prefix.layers):
            cache.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), index)
    elif width_a:
        first = next(e for e in reused if e is not None)
        for index in range(len(first.keys)):
            keys = first.keys[index].new_zeros((rows, first.keys[index].shape[0], width_a, first.keys[index].shape[2]))
            values = first.values[index].new_zeros(
                (rows, first.values[index].shape[0], width_a, first.values[index].shape[2])
            )
            for i, (entry, k) in enumerate(zip(reused, split)):
                if entry is not None and k:
                    keys[i, :, width_a - k :] = entry.keys[index][:, :k]
                    values[i, :, width_a - k :] = entry.values[index][:, :k]
            cache.update(keys, values, index)
    return cache
