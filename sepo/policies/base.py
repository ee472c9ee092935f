"""What the arena asks an agent, and what it gets back.

The arena collects one `DecisionRequest` per episode that is waiting for the agent and hands the
whole list to `Policy.act_batch` at once: a language model turns it into one batched generate call,
a scripted strategy answers each from its observation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from sepo.games.base import Game, GameState


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
class Decision:
    action: str
    text: str | None = None  # the free-form answer, for language models
    parsed: bool = True  # False when the action came from the constrained fallback
    extras: dict[str, Any] = field(default_factory=dict)  # token ids, log-probs (training)


class Policy(Protocol):
    name: str

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]: ...
