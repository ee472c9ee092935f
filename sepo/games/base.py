"""The Game interface every game module implements.

A game is pure data plus functions: no model code, no strategy code. The arena drives it through
`reset` / `to_act` / `legal_actions` / `observation` / `step`, strategies read `observation`,
language models read `render_prompt` and are read back through `parse_action`.

Player indices are roles, not seats: player 0 is always the agent being evaluated or trained,
player 1 the rule-based opponent. Games with seats (Kuhn poker) keep the seat in the state.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

AGENT, OPPONENT = 0, 1


@dataclass
class Round:
    """One finished round (a hand in Kuhn poker), from the agent's point of view.

    `actions[p]` is player p's action (for Kuhn, the tuple of that player's actions in the hand),
    `payoffs[p]` its payoff in raw game units, `info` the game's private state of the round
    (auction values, negotiation pool and valuations, Kuhn cards and seats) used by metrics.
    """

    actions: tuple[Any, Any]
    payoffs: tuple[float, float]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class GameState:
    """Mutable state of one episode. Games subclass it to add their own fields."""

    seed: int
    rng: np.random.Generator
    rounds: list[Round] = field(default_factory=list)
    round_index: int = 0
    over: bool = False


class Game(ABC):
    """Base class of the five games (docs/spec.md §1)."""

    name: str = ""
    #: Short description of the action format used in prompts and in the fallback question.
    action_hint: str = ""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.num_rounds: int = cfg.rounds
        self.max_payoff: float = cfg.max_payoff

    # ----------------------------------------------------------------- episode dynamics
    @abstractmethod
    def reset(self, seed: int, mirror: bool = False) -> GameState:
        """A fresh episode. `mirror` swaps the agent's seats (only Kuhn poker has seats)."""

    @abstractmethod
    def to_act(self, state: GameState) -> list[int]:
        """Players who must act now: [0, 1] for simultaneous moves, [p] for sequential ones."""

    @abstractmethod
    def legal_actions(self, state: GameState, player: int) -> list[str]:
        """The action strings `player` may choose now, in a fixed order."""

    @abstractmethod
    def observation(self, state: GameState, player: int) -> dict[str, Any]:
        """Everything `player` may see now and nothing more (no opponent private values/cards)."""

    @abstractmethod
    def step(self, state: GameState, actions: dict[int, str]) -> None:
        """Apply the actions of the players in `to_act(state)`; mutates `state`."""

    def is_over(self, state: GameState) -> bool:
        return state.over

    # ----------------------------------------------------------------- language interface
    @abstractmethod
    def system_prompt(self) -> str:
        """Rules and the answer format, shared by every decision of the game."""

    @abstractmethod
    def user_prompt(self, state: GameState, player: int) -> str:
        """History so far and the current state, only what `player` may see."""

    def render_prompt(self, state: GameState, player: int) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": self.user_prompt(state, player)},
        ]

    def parse_action(self, text: str, legal: list[str]) -> str | None:
        """The action written alone on the last non-empty line of `text`, or None.

        Tolerates an `Action:` prefix, markdown emphasis, quotes and a trailing full stop, and
        ignores a `<think>...</think>` block; anything else on the line makes it unparseable.
        """
        line = last_nonempty_line(strip_think(text))
        if line is None:
            return None
        candidate = normalise_action_line(line)
        for action in legal:
            if candidate == normalise_action_line(action):
                return action
        return None

    # ----------------------------------------------------------------- metrics hooks
    @abstractmethod
    def collusive(self, rnd: Round) -> bool:
        """Whether the agent's behaviour in this round counts as collusion (docs/spec.md §3, c)."""

    @abstractmethod
    def externality(self, rnd: Round) -> float:
        """The round's externality cost in [0, 1] (docs/spec.md §3, x)."""


# --------------------------------------------------------------------- parsing helpers
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_PREFIX = re.compile(r"^(final\s+)?(action|answer|decision|demand|bid|move)\s*[:=]\s*", re.IGNORECASE)


def think_open(text: str) -> bool:
    """Whether `text` has a `<think>` without a later `</think>` (the model is still reasoning)."""
    return text.rfind("<think>") > text.rfind("</think>")


def holds_action(text: str, game: Game, legal: list[str]) -> bool:
    """The stopping rule of docs/spec.md §5: a legal action on the last non-empty line, think closed."""
    return not think_open(text) and game.parse_action(text, legal) is not None


def strip_think(text: str) -> str:
    """Drop closed <think> blocks; an unclosed one hides everything after it."""
    text = _THINK.sub("", text)
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text


def last_nonempty_line(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return None


def normalise_action_line(line: str) -> str:
    """Canonical form of an action line: no prefix, emphasis, quotes, spaces; upper case."""
    s = line.strip().strip("*_`\"' ")
    s = _PREFIX.sub("", s)
    s = s.strip().strip("*_`\"' ").rstrip(".!")
    return re.sub(r"\s+", "", s).upper()


def format_history_line(index: int, text: str) -> str:
    return f"Round {index + 1}: {text}"


def history_block(history: list[dict[str, Any]], describe) -> str:
    """The prompt's "History:" lines (one per past round, `describe(entry)`) and the running total."""
    lines = [format_history_line(i, describe(h)) for i, h in enumerate(history)]
    text = "\n".join(lines) if lines else "No rounds played yet."
    total = sum(h["own_payoff"] for h in history)
    return f"History:\n{text}\nYour total so far: {total:g}.\n"
