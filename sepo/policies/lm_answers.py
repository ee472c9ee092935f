"""What a language-model agent's generate call leaves: its answers, what it encoded, and when a row stops.

`LMPolicy` (sepo/policies/lm.py) samples; these are the records it reads its actions from, the cache the
constrained fallback continues from, and the stopping rule that ends a row at its first legal action line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sepo.games.base import Game, holds_action, think_open  # noqa: F401  (the stopping rule; re-exported)
from sepo.lm.batching import MIN_SHARED_PREFIX, common_prefix, end_of_turn_ids, score_passes  # noqa: F401  (re-exported)
from sepo.lm.row_dropping import RowsDecoded, held_rows_cache
from sepo.lm.stopping import StopWhen
from sepo.policies.base import DecisionRequest

#: Above this many legal actions the fallback question shows the game's format hint instead.
MAX_LISTED_ACTIONS = 10


@dataclass
class Answer:
    """One generated answer: prompt ids, generated ids (cut at the stop), their behaviour
    log-probs, the decoded text and the text as parsing sees it (`answer_view`)."""

    prompt: list[int]
    generated: list[int]
    logprobs: torch.Tensor
    text: str
    view: str


@dataclass
class Encoded:
    """What a generate call left encoded: its KV cache and, per row, the tokens its columns hold (the prompt,
    then the answer up to the last token fed back), marked in `columns` (bool [rows, cache columns]) in order.
    The constrained fallback asks its question after them (`LMPolicy._fallback`)."""

    cache: Any
    columns: torch.Tensor
    tokens: list[list[int]]
    #: the cache row of each request row it holds, where it holds only some (`model.drop_stopped_rows` keeps those
    #: that left without an action); None: every request row, in order
    rows: dict[int, int] | None = None

    def row(self, request_row: int) -> int | None:
        """The cache row holding request row `request_row`'s tokens, or None where none does."""
        return request_row if self.rows is None else self.rows.get(request_row)


def answer_view(prompt_text: str, answer: str) -> str:
    """The answer as parsing must see it: with "<think>" in front when the prompt opened the block.

    Some chat templates (the tiny model's and Qwen's with thinking on) end the generation prompt
    with "<think>", so the model's answer holds only the closing tag; an action line written before
    it is still reasoning.
    """
    return "<think>" + answer if think_open(prompt_text) else answer


def encoded_by_generation(cache: Any, prompt_mask: torch.Tensor, answers: list[Answer], steps: int) -> Encoded:
    """`Encoded` of a generate call that ran `steps` steps after prompts laid out as `prompt_mask` says: a row's
    answer tokens sit in the columns after the prompts', up to the last token fed back (the last sampled
    token of the call never is, nor are the padding tokens fed to rows already stopped)."""
    rows, width_p = prompt_mask.shape
    columns = torch.zeros((rows, width_p + max(steps - 1, 0)), dtype=torch.bool, device=prompt_mask.device)
    columns[:, :width_p] = prompt_mask.bool()
    tokens = []
    for i, answer in enumerate(answers):
        fed = min(len(answer.generated), max(steps - 1, 0))
        columns[i, width_p : width_p + fed] = True
        tokens.append(list(answer.prompt) + list(answer.generated[:fed]))
    return Encoded(cache, columns, tokens)


def encoded_by_dropping(model: Any, prompts: Sequence[Sequence[int]], decoded: RowsDecoded) -> Encoded | None:
    """`Encoded` of a decoding that let rows go as they stopped: the rows that left without an action, each with
    its prompt and the answer tokens it fed back (None when every row stopped on an action)."""
    if not decoded.held:
        return None
    cache, columns, order = held_rows_cache(model, decoded.held)
    tokens = [list(prompts[r]) + decoded.tokens[r][: decoded.fed(r)] for r in order]
    return Encoded(cache, columns, tokens, {r: i for i, r in enumerate(order)})


class ActionStoppingCriteria(StopWhen):
    """Stops each row of a batch once its answer so far holds a legal action (`StopWhen`); a row whose
    prompt opened a <think> block (`think_prefix`) is read as `answer_view` reads it."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_length: int,
        requests: Sequence[DecisionRequest],
        think_prefix: Sequence[bool] | None = None,
    ):
        think = list(think_prefix or [False] * len(requests))

        def holds(i: int, text: str) -> bool:
            return holds_action("<think>" + text if think[i] else text, requests[i].game, requests[i].legal)

        super().__init__(tokenizer, prompt_length, len(requests), holds)


def fallback_question(game: Game, legal: list[str]) -> str:
    """The user turn of the constrained fallback, listing the legal actions when they are few."""
    options = "/".join(legal) if len(legal) <= MAX_LISTED_ACTIONS else (game.action_hint or "/".join(legal))
    return f"State your final action ({options}):"
