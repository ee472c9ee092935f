"""Decoding that lets each row go once it has stopped, instead of carrying it to the batch's last stop.

transformers' `generate` keeps every row of a batch until the last one stops, feeding padding to the rows
already done, so one rambling answer holds a whole batch to the token budget. On a CPU a decoding step's
cost grows with its rows (smollm2, one thread, ~350 cached columns: 70 ms at 4 rows, 148 ms at 24, 239 ms
at 48), and an evaluation of smollm2's SFT model on Kuhn decoded 25,315 row-steps for 14,426 sampled tokens:
43% of its decoding went to rows that had already stopped (docs/speed.md §5m).

`decode_dropping_stopped` is generate's greedy loop over the policy's own sampler and stopping rule, with one
change: once the rows still open fall to `compact_at` of the rows the cache holds, the stopped ones leave
it, in one copy of the cache's rows (`select_rows`; copying at every stop would cost more than it saves).
What each row samples is unchanged: its stream is keyed by row (`RowSampler`), its position ids and cache
columns are those generate gives it, so only the float sums of a batch of another size differ.

The prompts are encoded the same way: rows that repeat a prompt (K samples of one state) share one pass over
it, and the cache rows are copied out to them before the first token is drawn (`encode_prompts`).

Only plain full-attention caches (every layer `DynamicLayer` or `StaticLayer`) can drop rows this way; the
caller declares it with `model.prefix_cache` (`model.drop_stopped_rows` needs it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sepo.lm.logprobs import position_ids_from_mask
from sepo.lm.sampling import RowSampler
from sepo.lm.stopping import StopWhen
from sepo.profiling import section


@dataclass
class HeldRow:
    """A row's cache columns as it left the batch (keys and values per layer, [heads, columns, dim]) and which
    of them hold its tokens (`columns`, bool), for a question asked after its answer (the fallback)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    columns: torch.Tensor


@dataclass
class RowsDecoded:
    """Each row's sampled tokens up to where it left (its stop, an end-of-turn token or the budget), and the cache
    of every row that left without its stopping rule firing (`held`: the rows the constrained fallback may ask
    again)."""

    tokens: list[list[int]]
    held: dict[int, HeldRow] = field(default_factory=dict)

    def fed(self, row: int) -> int:
        """How many of row `row`'s tokens were fed back (their keys and values are in its cache columns): all but
        the last, which stopped it or met the budget."""
        return max(len(self.tokens[row]) - 1, 0)


def select_rows(cache: Any, keep: torch.Tensor) -> None:
    """Keep only rows `keep` of every layer of a plain full-attention cache, in place (one copy per layer)."""
    from transformers.cache_utils import DynamicLayer, StaticLayer

    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, StaticLayer):
            raise TypeError(
                f"model.drop_stopped_rows needs plain full-attention cache layers, not {type(layer).__name__}; "
                "allowed: model.drop_stopped_rows=0 for this model"
            )
        if not layer.is_initialized:
            continue
        layer.keys = layer.keys.index_select(0, keep)
        layer.values = layer.values.index_select(0, keep)
        if isinstance(layer, StaticLayer):
            layer.batch_size = len(keep)


def hold_row(cache: Any, row: int, mask_row: torch.Tensor, width_p: int, fed: int) -> HeldRow:
    """A copy of cache row `row`'s columns holding its tokens: its prompt's (marked in `mask_row`'s first
    `width_p`), then its `fed` answer tokens."""
    columns = mask_row[: width_p + fed].bool().clone()
    columns[width_p:] = True
    return HeldRow(
        [layer.keys[row, :, : len(columns)].clone() for layer in cache.layers],
        [layer.values[row, :, : len(columns)].clone() for layer in cache.layers],
        columns,
    )


@torch.no_grad()
def decode_dropping_stopped(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    width_a: int,
    cache: Any,
    sampler: RowSampler,
    stop: StopWhen,
    eos_ids: set[int],
    max_new_tokens: int,
    compact_at: float,
    pad_id: int,
    extras: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    after_prompts: Callable[[Any], None] = lambda cache: None,
) -> RowsDecoded:
    """Sample up to `max_new_tokens` tokens after each left-padded prompt of `ids` (its first `width_a` columns
    already in `cache`); `after_prompts(cache)` sees the cache while it still holds every row's prompt."""
    rows, width_p = ids.shape
    positions = position_ids_from_mask(mask)  # the forwards' time is billed by `sepo.profiling.time_model_forwards`
    logits = encode_prompts(model, ids, mask, positions, width_a, cache, extras)
    after_prompts(cache)
    open_rows = np.arange(rows)  # the request row of each cache row
    done = np.zeros(rows, dtype=bool)
    decoded = RowsDecoded([[] for _ in range(rows)])
    next_position = positions[:, -1:] + 1
    for step in range(max_new_tokens):
        drawn = sampler.draw(logits).tolist()
        left = record_step(decoded, stop, eos_ids, open_rows, done, drawn, step + 1)
        if done[open_rows].all() or step + 1 == max_new_tokens:
            break
        if left:
            mask, next_position, drawn, open_rows = compact(
                decoded, cache, sampler, stop, open_rows, done, mask, next_position, drawn, width_p, compact_at
            )
        fed = torch.tensor([t if not done[r] else pad_id for t, r in zip(drawn, open_rows)], device=ids.device)
        mask = torch.cat([mask, mask.new_ones((len(open_rows), 1))], dim=1)
        logits = forward_last(model, fed[:, None], mask, next_position, cache, extras)
        next_position = next_position + 1
    for cache_row, r in enumerate(open_rows):  # the rows still in the cache at the end
        if stop.stop_at[r] is None and decoded.tokens[r]:
            decoded.held[int(r)] = hold_row(cache, cache_row, mask[cache_row], width_p, decoded.fed(r))
    return decoded


def encode_prompts(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    width_a: int,
    cache: Any,
    extras: Callable[[torch.Tensor], dict[str, torch.Tensor]],
) -> torch.Tensor:
    """The next-token logits after each prompt, every distinct prompt encoded once and its cache rows copied to
    the rows that repeat it. K samples of one state share their prompt (`sepo.policies.played`: the exact-value
    batch and the read of Kuhn's table ask each information set 16 or 32 times), and encoding each copy was a
    fifth of a SmolLM2 Kuhn SEPO step."""
    repeats = repeated_rows(ids, mask)
    if repeats is None:
        return forward_last(model, ids[:, width_a:], mask, positions[:, width_a:], cache, extras)
    first, inverse = repeats
    select_rows(cache, first)
    logits = forward_last(model, ids[first, width_a:], mask[first], positions[first, width_a:], cache, extras)
    select_rows(cache, inverse)
    return logits[inverse]


def repeated_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the first row of each distinct prompt, each row's index among those), or None where no row repeats
    another: rows are the same prompt when their tokens and their mask (the same padding) are."""
    rows = torch.cat([ids, mask.to(ids.dtype)], dim=1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if len(distinct) == len(rows):
        return None
    first = torch.full((len(distinct),), len(rows), dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(len(rows), device=ids.device), "amin")
    return first, inverse


def forward_last(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: Any,
    extras: Callable[[torch.Tensor], dict[str, torch.Tensor]],
) -> torch.Tensor:
    """Float32 next-token logits [rows, V] after `ids`, appended to `cache`."""
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
        **extras(ids),
    )
    return out.logits[:, -1].float()


def record_step(
    decoded: RowsDecoded,
    stop: StopWhen,
    eos_ids: set[int],
    open_rows: np.ndarray,
    done: np.ndarray,
    drawn: Sequence[int],
    length: int,
) -> bool:
    """Append each open row's drawn token, run the stopping rule on them and mark the rows that stopped or ended
    their turn; True when some row stopped at this step."""
    live = [(r, t) for r, t in zip(open_rows, drawn) if not done[r]]
    for r, t in live:
        decoded.tokens[r].append(t)
    stop.observe([r for r, _ in live], [[t] for _, t in live], length)
    stopped = False
    for r, t in live:
        if stop.stop_at[r] is not None or t in eos_ids:
            done[r] = stopped = True
    return stopped


def compact(
    decoded: RowsDecoded,
    cache: Any,
    sampler: RowSampler,
    stop: StopWhen,
    open_rows: np.ndarray,
    done: np.ndarray,
    mask: torch.Tensor,
    next_position: torch.Tensor,
    drawn: list[int],
    width_p: int,
    compact_at: float,
) -> tuple[torch.Tensor, torch.Tensor, list[int], np.ndarray]:
    """Drop the stopped rows from the cache once the open ones are at most `compact_at` of its rows; a row that
    leaves without its stopping rule firing (it ended its turn without an action) keeps a copy of its cache."""
    still = ~done[open_rows]
    if still.sum() > compact_at * len(open_rows):
        return mask, next_position, drawn, open_rows
    with section("drop_rows"):
        for cache_row in np.flatnonzero(~still):
            r = int(open_rows[cache_row])
            if stop.stop_at[r] is None:
                decoded.held[r] = hold_row(cache, int(cache_row), mask[cache_row], width_p, decoded.fed(r))
        keep = torch.from_numpy(np.flatnonzero(still)).to(mask.device)
        select_rows(cache, keep)
        sampler.select(still)
    return (
        mask.index_select(0, keep),
        next_position.index_select(0, keep),
        [t for t, s in zip(drawn, still) if s],
        open_rows[still],
    )


def held_rows_cache(model: Any, held: dict[int, HeldRow]) -> tuple[Any, torch.Tensor, list[int]]:
    """The held rows as one cache (`DynamicCache`, rows in order of their request row, right-padded to the widest),
    the columns holding each one's tokens (bool [rows, columns]) and the request row of each."""
    from transformers import DynamicCache

    order = sorted(held)
    width = max(len(held[r].columns) for r in order)
    columns = torch.zeros((len(order), width), dtype=torch.bool, device=held[order[0]].columns.device)
    for i, r in enumerate(order):
        columns[i, : len(held[r].columns)] = held[r].columns
    cache = DynamicCache(config=model.config)
    for number in range(len(held[order[0]].keys)):
        cache.update(
            padded_stack([held[r].keys[number] for r in order], width),
            padded_stack([held[r].values[number] for r in order], width),
            number,
        )
    return cache, columns, order


def padded_stack(parts: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """[heads, columns, dim] tensors stacked into [len(parts), heads, width, dim], zeros after each one's columns."""
    out = parts[0].new_zeros((len(parts), parts[0].shape[0], width, parts[0].shape[2]))
    for i, part in enumerate(parts):
        out[i, :, : part.shape[1]] = part
    return out
