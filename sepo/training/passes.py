"""The teacher-forced passes of a SEPO update: which decisions share a pass, and their answers' log-probs.

A batch's decisions are scored in passes bounded by `sepo.micro_batch` decisions and `sepo.micro_batch_tokens`
positions, grouped by length (or, with `model.prefix_tree`, as runs of the batch's prefix tree); the update,
the reference and the trust region's checks all score in the same layout, so their log-probs round alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from omegaconf import DictConfig

from sepo import distributed
from sepo.lm.logprobs import token_logprobs
from sepo.lm.prefix_tree import EncodedRoot, encode_root, root_length, tree_passes, tree_token_logprobs
from sepo.models import forward_extras
from sepo.policies.base import Decision
from sepo.policies.lm import LMPolicy
from sepo.profiling import section
from sepo.training.rollouts import RolloutBatch


def micro_batches(decisions: list[Decision], size: int, budget: int, shared: int = 0) -> list[list[int]]:
    """Decision indices in passes of at most `size` decisions (`sepo.micro_batch`) and, when `budget` is
    not 0, at most `budget` token positions (`sepo.micro_batch_tokens`), grouped by length (prompt +
    answer tokens).

    A pass holds the activations of every position it encodes for the backward pass, so its memory
    grows with the positions: the token cap bounds it whatever the prompts' length (a long game's late
    rounds get fewer rows per pass). `shared` tokens at the start of every prompt (the rules, with
    `model.prefix_cache`) are encoded once per pass, not once per row, so a pass counts them once and
    each row's own tokens (padded to the pass's longest row) after them. A batch mixes every round of
    every episode (prompts grow by a history line per round), so passes over similar lengths waste
    far less on padding. Every quantity computed per pass is a sum over decisions, so the grouping
    changes nothing else.
    """
    length = [len(d.tokens.prompt_ids) + len(d.tokens.gen_ids) for d in decisions]
    passes: list[list[int]] = []
    for i in sorted(range(len(decisions)), key=length.__getitem__):
        current = passes[-1] if passes else None
        # sorted by length, so row i is the longest of its pass: the pass would encode its prefix once,
        # then (rows + 1) x its own part
        if (
            current is None
            or len(current) >= size
            or (budget and shared + (len(current) + 1) * (length[i] - shared) > budget)
        ):
            passes.append([i])
        else:
            current.append(i)
    return passes


def pass_layout(
    policy: LMPolicy, decisions: list[Decision], s: DictConfig, grad: bool = True, root: EncodedRoot | None = None
) -> list[list[int]]:
    """`micro_batches` with the prefix every decision's prompt shares (what each pass encodes once), or,
    with `model.prefix_tree`, runs of the decisions' prefix tree (`tree_passes`: every token shared
    within a pass once; the batch's `root`, encoded once for all passes, counts in none); a pass
    without gradients keeps no activations, so it takes `sepo.no_grad_micro_batch_tokens` when set
    (`grad=True` gives the update's layout, which the reference takes too)."""
    budget = s.micro_batch_tokens if grad else s.no_grad_micro_batch_tokens or s.micro_batch_tokens
    if policy.prefix_tree:
        skip = root.length if root is not None else 0
        return tree_passes([token_sequence(d)[skip:] for d in decisions], s.micro_batch, budget)
    shared = policy.shared_prefix_length([d.tokens.prompt_ids.tolist() for d in decisions])
    return micro_batches(decisions, s.micro_batch, budget, shared)


def token_sequence(decision: Decision) -> list[int]:
    return decision.tokens.prompt_ids.tolist() + decision.tokens.gen_ids.tolist()


def shared_root(model: Any, policy: LMPolicy, decisions: list[Decision]) -> EncodedRoot | None:
    """With `model.prefix_tree`, the prefix every decision of the batch shares (the game's rules), encoded
    once by `model` as it is now for all the batch's passes (with gradients when they are enabled)."""
    if not policy.prefix_tree or not decisions:
        return None
    sequences = [token_sequence(d) for d in decisions]
    shared = root_length(sequences, [len(d.tokens.prompt_ids) for d in decisions])
    return encode_root(model, sequences[0][:shared]) if shared else None


def policy_logprobs(
    model: Any, policy: LMPolicy, decisions: list[Decision], s: DictConfig, root: EncodedRoot | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[D, L] log-probs of the decisions' generated tokens under `model` as it is now, and their mask
    (`root`: the batch's shared root, `shared_root`, with `model.prefix_tree`)."""
    if policy.prefix_tree:
        starts = [len(d.tokens.prompt_ids) for d in decisions]
        return tree_token_logprobs(
            model, [token_sequence(d) for d in decisions], starts, s.logprob_chunk, s.temperature, root
        )
    prompts = [d.tokens.prompt_ids.tolist() for d in decisions]
    gens = [d.tokens.gen_ids.tolist() for d in decisions]
    shared = policy.shared_prefix_length(prompts)  # the rules, encoded once per pass (model.prefix_cache)
    ids, mask, start = policy.pack_shared(prompts, shared, gens) if shared else policy.pack(prompts, gens)
    lp = token_logprobs(
        model,
        ids,
        mask,
        start,
        chunk=s.logprob_chunk,
        temperature=s.temperature,
        shared_prefix=shared,
        **forward_extras(model, policy.model_cfg, ids),
    )
    return lp, mask[:, start:].to(lp.dtype)


def pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def reference_logprobs(
    model: Any, policy: LMPolicy, batch: RolloutBatch, s: DictConfig, ref_model: Any = None
) -> list[torch.Tensor] | None:
    """log pi_ref of every trained decision's tokens: the same model with the adapter switched off,
    or `ref_model` (the 4-bit copy of `sepo.ref_4bit`) when given.

    Scored in the update's own passes (`like_update`): float sums round by the layout of a pass, and the
    KL term clips max(0, log pi - log pi_ref) per token, so a reference laid out otherwise would leave it
    a floor of rounding where the policy is the reference (Kuhn on smollm2 in bfloat16: 0.0076 at step
    1, where the fresh adapter adds exactly zero; in one layout, exactly 0).

    None when `sepo.beta` is 0: the KL term is then absent, so the pass would be wasted.
    """
    if s.beta == 0.0:
        return None
    out: list[torch.Tensor] = [torch.zeros(0)] * len(batch.decisions)
    scorer = ref_model if ref_model is not None else model
    adapter_off = model.disable_adapter() if ref_model is None else contextlib.nullcontext()
    with torch.no_grad(), adapter_off, section("reference_logprobs"):
        for part, lp, mask in scored_passes(scorer, policy, batch.decisions, s, like_update=True):
            for i, row, m in zip(part, lp, mask):
                out[i] = row[m.bool()]
    return out


def scored_passes(
    scorer: Any, policy: LMPolicy, decisions: list[Decision], s: DictConfig, like_update: bool = False
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Every decision's answer log-probs under `scorer`, pass by pass without gradients, the batch's root
    (the rules) encoded once: (the pass's decision indices, their log-probs, their answer mask). What the
    reference pass and the KL check after an update share; call it under `torch.no_grad()`. `like_update`:
    in the update's passes (`sepo.micro_batch_tokens`), not the wider ones a pass without gradients may
    take (`sepo.no_grad_micro_batch_tokens`)."""
    root = shared_root(scorer, policy, decisions)
    for part in pass_layout(policy, decisions, s, grad=like_update, root=root):
        lp, mask = policy_logprobs(scorer, policy, [decisions[i] for i in part], s, root)
        yield part, lp, mask


def generated_tokens(batch: RolloutBatch) -> int:
    """Tokens generated in the whole batch (summed over processes when data parallel: each holds its share)."""
    return int(distributed.sum_floats(sum(len(d.tokens.gen_ids) for d in batch.decisions))[0])
