"""The SFT model's action agreement: on the head of the validation split it answers each prompt greedily,
as it will play; the parse rate is the share of answers that end with an action the game has, the
agreement the share whose action is the demonstrator's.
"""

from __future__ import annotations

from typing import Any

from sepo.lm.batching import end_of_turn_ids
from sepo.models import forward_extras, render_chat
from sepo.training.sft_batching import greedy_answers


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

    Batched by common prefix and length (sepo/training/sft_batching.py:prompt_batches: little padding); with
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
