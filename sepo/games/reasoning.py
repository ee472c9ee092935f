"""What a game gives the SFT data's reasoning lines (`sepo.training.reasoning` draws them): an explainer that
names the case of a demonstrator's decision, and each case's phrasings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

#: (phrasing case, the fields its templates use, the action the demonstrator's rule implies or None)
Explained = tuple[str, dict[str, Any], "str | None"]


@dataclass(frozen=True)
class Reasoning:
    #: (strategy name, action taken, observation, **the game's `reasoning` options) -> Explained
    explain: Callable[..., Explained]
    phrases: Mapping[str, tuple[str, ...]]  # case -> its phrasings (`str.format` templates)
    aliases: Mapping[str, str] = field(default_factory=dict)  # registered alias -> the name `explain` knows
    #: option of `game.reasoning` -> what it, when true, puts before every line of the game
    openers: Mapping[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)

    @classmethod
    def of(cls, module: ModuleType) -> Reasoning:
        """A game's reasoning module: its `explain`, `PHRASES`, and `ALIASES` and `OPENERS` where it has them."""
        return cls(module.explain, module.PHRASES, getattr(module, "ALIASES", {}), getattr(module, "OPENERS", {}))
