"""Per-row stopping inside one `generate` call: a row stops as soon as its answer so far meets a rule (the
policy's: its last non-empty line holds a legal action), so short answers do not wait for long ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import StoppingCriteria

from sepo.lm.decoding import IncrementalText
from sepo.profiling import section


class StopWhen(StoppingCriteria):
    """Stops each row of a batch once `done(row, answer so far)` holds (transformers 5 API).

    Rows are independent: the returned bool tensor has one entry per row. `stop_at[i]` records how
    many tokens row i had generated when it first stopped, so the caller can cut what `generate`
    appended afterwards (padding, or more tokens where no EOS criterion pads finished rows). Each
    open row's text grows by the tokens it did not see yet (`IncrementalText`: inside `generate`,
    the newest one), and a row is checked only when they added text.
    """

    def __init__(self, tokenizer: Any, prompt_length: int, rows: int, done: Callable[[int, str], bool]):
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.done = done
        self.stop_at: list[int | None] = [None] * rows
        self.texts = [IncrementalText(tokenizer) for _ in range(rows)]
        self.seen = 0  # generated columns already pushed into `texts`

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        length = input_ids.shape[1] - self.prompt_length
        # the columns not seen yet: one per call inside generate, all of them on a first call
        fresh = input_ids[:, self.prompt_length + self.seen :].tolist()
        self.seen = length
        self.observe(range(len(self.stop_at)), fresh, length)
        done = [s is not None for s in self.stop_at]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def observe(self, rows: Sequence[int], fresh: Sequence[Sequence[int]], length: int) -> None:
        """Rows `rows` have `length` tokens each, the last ones `fresh` (one list per row): record where a rule
        first holds. A decoding loop of its own calls this directly (`sepo.lm.row_dropping`)."""
        with section("stopping"):
            for i, tokens in zip(rows, fresh):
                if self.stop_at[i] is not None or not "".join([self.texts[i].push(t) for t in tokens]):
                    continue
                if self.done(i, self.texts[i].text):
                    self.stop_at[i] = length
