"""Sampling that training can score: pure temperature sampling, each row from its own counter-based stream,
with the log-prob of every drawn token recorded as it is drawn.

Pure temperature (no top-k/top-p, whatever a checkpoint's generation config suggests): the recorded
log-probs are then exactly those of the distribution sampled from. Per-row counter streams: a row's tokens
never depend on the rows beside it, on the batch size or on the order of calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from sepo.errors import NonFiniteLogits
from sepo.profiling import section

#: Logits processors a checkpoint's generation config may switch on (Qwen ships top_k 20, top_p 0.95),
#: switched off: what is sampled is exactly softmax(logits / T), whose log-probs training records.
PLAIN_SAMPLING = dict(
    top_k=None, top_p=None, min_p=None, typical_p=None, repetition_penalty=None, no_repeat_ngram_size=None
)


def counter_uniforms(keys: np.ndarray, step: int) -> np.ndarray:
    """One uniform in [0, 1) per row, a function of (the row's key, the step) alone.

    SplitMix64 of key + (step + 1) * golden ratio: a counter-based stream, so all rows draw in one
    vectorised call and a row's draws never depend on the rows beside it or on the batch's order.
    """
    with np.errstate(over="ignore"):
        z = keys + np.uint64(step + 1) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class RowSampler(LogitsProcessor):
    """Per-row temperature sampling as a logits processor for greedy `generate`, recording log-probs.

    `generate`'s own sampling draws every row from the global RNG, so a row's tokens would depend
    on the rows beside it. Here row i draws from softmax(scores / T) by inverting its CDF at
    `counter_uniforms(keys, step)[i]` (temperature 0: the argmax), and the scores become -inf
    except at the drawn token, which greedy decoding then picks. The log-prob of each drawn token
    under softmax(scores / `logprob_temperature`) is kept per step (`logprobs`), so training needs
    no second teacher-forced pass to know what the behaviour policy's probabilities were.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, logprob_temperature: float):
        self.keys = np.array([int(s) for s in seeds], dtype=np.uint64)
        self.temperature = float(temperature)
        self.logprob_temperature = float(logprob_temperature)
        self.step = 0
        self.logprobs: list[torch.Tensor] = []  # one [B] tensor per generation step
        self.width = len(self.keys)  # the rows at the start, by which every step's log-probs are laid out
        self.rows = np.arange(self.width)  # the row of each current score row (`select`)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        drawn = self.draw(scores)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn[:, None], 0.0)

    def draw(self, scores: torch.Tensor) -> torch.Tensor:
        """The token each current row draws at this step ([rows] long), its log-prob recorded."""
        with section("sampling"):
            logits = scores.float()
            if bool((torch.isnan(logits) | torch.isposinf(logits)).any()):
                raise NonFiniteLogits(
                    f"the model's next-token scores hold NaN or +inf at generation step {self.step}: "
                    "its weights are broken (a diverged update or a damaged checkpoint)"
                )
            if self.temperature > 0:
                logp = torch.log_softmax(logits / self.temperature, dim=-1)
                cdf = logp.exp().cumsum(dim=-1)
                total = cdf[:, -1:]
                u = torch.from_numpy(counter_uniforms(self.keys, self.step)).to(cdf.device)
                target = (u[:, None] * total.double()).to(cdf.dtype)
                target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
                drawn = torch.searchsorted(cdf, target, right=True).squeeze(1)
                if self.logprob_temperature != self.temperature:
                    logp = torch.log_softmax(logits / self.logprob_temperature, dim=-1)
            else:
                drawn = logits.argmax(dim=-1)
                logp = torch.log_softmax(logits / self.logprob_temperature, dim=-1)
            self.logprobs.append(self.by_row(logp.gather(1, drawn[:, None]).squeeze(1).cpu()))
            self.step += 1
            return drawn

    def select(self, keep: np.ndarray) -> None:
        """From the next step on, the score rows are the current ones where `keep` (bool) holds: rows that
        left the batch (`sepo.lm.row_dropping`) keep the log-probs they recorded."""
        self.keys, self.rows = self.keys[keep], self.rows[keep]

    def by_row(self, logprobs: torch.Tensor) -> torch.Tensor:
        """A step's log-probs laid out by row (NaN for the rows no longer drawing)."""
        if len(self.rows) == self.width:
            return logprobs
        full = torch.full((self.width,), float("nan"))
        full[torch.from_numpy(self.rows)] = logprobs
        return full

    def row_logprobs(self, row: int, count: int) -> torch.Tensor:
        """float32 log-probs of row `row`'s first `count` generated tokens."""
        if count == 0:
            return torch.zeros(0)
        return torch.stack([step[row] for step in self.logprobs[:count]]).float()
