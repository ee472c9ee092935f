"""What the arena asks an agent, and what it gets back.

The arena collects one `DecisionRequest` per episode that is waiting for the agent and hands the
whole list to `Policy.act_batch` at once: a language model turns it into one batched generate call,
a scripted strategy answers each from its observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from sepo.games.base import Game, GameState

if TYPE_CHECKING:
    import torch


@dataclass
class DecisionRequest:
    game: Game
    state: GameState
    player: int
    legal: list[str]
    rng: np.random.Generator  # the episode's own stream for this player's randomness

    @cached_property
    def observation(self) -> dict[str, Any]:
        return self.game.observation(self.state, self.player)

    @cached_property
    def messages(self) -> list[dict[str, str]]:
        return self.game.render_prompt(self.state, self.player)


@dataclass
class TokenTrace:
    """The tokens of one sampled answer, kept for training (`LMPolicy.act_batch(return_logprobs=True)`):
    the update re-scores exactly these tokens, and the behaviour log-probs are its ratio's denominator."""

    prompt_ids: torch.Tensor  # the rendered prompt (the first ask, never the fallback's re-ask)
    gen_ids: torch.Tensor  # the sampled answer's tokens, as generated
    logprobs: torch.Tensor  # behaviour log-prob of each generated token, at logprob_temperature
    logprob_temperature: float  # the temperature the answer was sampled (and scored) at
    fallback: bool  # True when the action came from the constrained fallback, not from the answer


@dataclass
class Demonstration:
    """A demonstrator's decision as the SFT data records it (`sepo.training.sft_data`)."""

    strategy: str  # the demonstrator that answered
    observation: dict[str, Any]  # what it saw
    messages: list[dict[str, str]]  # the chat prompt, then the demonstrator's answer as the assistant turn


@dataclass
class Decision:
    action: str
    text: str | None = None  # the free-form answer, for language models
    parsed: bool = True  # False when the action came from the constrained fallback
    tokens: TokenTrace | None = None  # a language model's answer tokens, when training asked for them
    demonstration: Demonstration | None = None  # a demonstrator's record, when generating SFT data


class Policy(Protocol):
    """Answers a batch of decision requests. A policy that keeps state per episode between its decisions
    (a language model's encoded prompts) may also define `episodes_over()`, which the arena calls once
    every episode of a `play` has ended, so that state does not outlive the episodes."""

    name: str

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]: ...
