"""The SFT model's action agreement: on the head of the validation split it answers each prompt greedily,
as it will play; the parse rate is the share of answers that end with an action the game has, the
agreement the share whose action is the demonstrator's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sepo.lm.batching import end_of_turn_ids, left_pad
from sepo.lm.prompt_cache import encode_prefix
from sepo.models import forward_extras, render_chat
from sepo.training.sft_batching import prefix_groups

log = logging.getLogger(__name__)


def prompt_batches(
    prompts: Sequence[Sequence[int]], batch_size: int, share_prefix: bool, min_shared: int
) -> list[tuple[list[int], int]]:
    """Batches of prompt indices for generation and each batch's shared prefix length (0: none).

    Prompts are grouped by common prefix (`prefix_groups`; every prompt keeps its last token, which
    generation starts from) and sorted by length within a group, so a batch holds one game's
    prompts with little padding; batches never cross groups, so each shares its group's prefix.
    """
    groups = prefix_groups(prompts, [len(p) - 1 for p in prompts], max(int(min_shared), 1))
    out = []
    for members, p in groups:
        members = sorted(members, key=lambda i: (len(prompts[i]), i))
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            out.append((chunk, p if share_prefix and len(chunk) > 1 and p >= min_shared else 0))
    return out


@torch.no_grad()
def greedy_answers(
    model: Any,
    prompts: Sequence[Sequence[int]],
    eos: set[int],
    pad_id: int,
    batch_size: int,
    max_new_tokens: int,
    share_prefix: bool = False,
    min_shared: int = 1,
    extras: Callable[[torch.Tensor], dict[str, torch.Tensor]] = lambda ids: {},
) -> list[list[int]]:
    """Greedy continuations of token-id prompts, cut after the first end-of-turn token, in the
    prompts' order. Batched by `prompt_batches`; a batch's shared prefix runs once and its KV cache
    serves every row (rows laid out [prefix][padding][rest]; generate's position ids follow the
    attention mask, so the padding in the middle changes nothing)."""
    device = next(model.parameters()).device
    answers: list[list[int]] = [[] for _ in prompts]
    for chunk, shared in prompt_batches(prompts, batch_size, share_prefix, min_shared):
        rests = [list(prompts[i][shared:]) for i in chunk]
        ids, mask = left_pad(rests, max(map(len, rests)), pad_id)
        kwargs: dict[str, Any] = {}
        if shared:
            prefix = torch.tensor([list(prompts[chunk[0]][:shared])], dtype=torch.long)
            ids = torch.cat([prefix.expand(len(chunk), -1), ids], dim=1)
            mask = torch.cat([torch.ones(len(chunk), shared, dtype=torch.long), mask], dim=1)
            cache = encode_prefix(model, prefix.to(device), extras)
            cache.batch_repeat_interleave(len(chunk))
            kwargs["past_key_values"] = cache
        ids, mask = ids.to(device), mask.to(device)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            **extras(ids),
            **kwargs,
            do_sample=False,
            temperature=None,
            top_k=None,
            top_p=None,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            eos_token_id=sorted(eos),
        )
        for i, row in zip(chunk, out[:, ids.shape[1] :].tolist()):
            cut = next((j for j, tok in enumerate(row) if tok in eos), len(row))
            answers[i] = row[:cut]
    return answers


def generate_answers(
    model: Any,
    tokenizer: Any,
    model_cfg: Any,
    prompts: list[list[dict[str, str]]],
    batch_size: int,
    max_new_tokens: int,
    share_prefix: bool = False,
    min_shared: int = 16,
) -> list[str]:
    """Greedy answers to chat prompts, cut at the end of turn, in the prompts' order.

    Batched by common prefix and length (`prompt_batches`: little padding); with
    `share_prefix` (needs plain full attention) a batch's shared prefix, a game's rules, runs once.
    """
    eos = end_of_turn_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [
        tokenizer(render_chat(tokenizer, model_cfg, m, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
        for m in prompts
    ]
    was_training = model.training
    model.eval()
    try:
        rows = greedy_answers(
            model,
            ids,
            eos,
            pad,
            batch_size,
            max_new_tokens,
            share_prefix,
            min_shared,
            extras=lambda x: forward_extras(model, model_cfg, x),
        )
    finally:
        model.train(was_training)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def action_agreement(
    model: Any,
    tokenizer: Any,
    model_cfg: Any,
    examples: list[dict[str, Any]],
    actions_by_game: dict[str, list[str]],
    games: dict[str, Any],
    batch_size: int,
    max_new_tokens: int,
    samples: int = 10,
    share_prefix: bool = False,
    min_shared: int = 16,
) -> dict[str, Any]:
    """Parse rate and agreement with the demonstrator of greedy answers to `examples`' prompts.

    An answer parses when the game's `parse_action` finds, on its last non-empty line, one of the
    actions seen for that game in the dataset; it agrees when that action is the demonstrator's.
    """
    answers = generate_answers(
        model,
        tokenizer,
        model_cfg,
        [ex["messages"][:-1] for ex in examples],
        batch_size,
        max_new_tokens,
        share_prefix,
        min_shared,
    )
    per_game: dict[str, dict[str, int]] = {}
    shown = []
    for ex, text in zip(examples, answers):
        action = games[ex["game"]].parse_action(text, actions_by_game[ex["game"]])
        g = per_game.setdefault(ex["game"], {"examples": 0, "parsed": 0, "agree": 0})
        g["examples"] += 1
        g["parsed"] += action is not None
        g["agree"] += action == ex["action"]
        if len(shown) < samples:
            shown.append(
                {"game": ex["game"], "target": ex["messages"][-1]["content"], "answer": text, "parsed": action}
            )
    n = max(len(examples), 1)
    return {
        "examples": len(examples),
        "parse_rate": sum(g["parsed"] for g in per_game.values()) / n,
        "action_agreement": sum(g["agree"] for g in per_game.values()) / n,
        "per_game": {
            k: {**v, "parse_rate": v["parsed"] / v["examples"], "action_agreement": v["agree"] / v["examples"]}
            for k, v in sorted(per_game.items())
        },
        "samples": shown,
    }
