"""Rule-based strategies and their registry.

A strategy is stateless: everything it needs (its own and the other player's past actions, its
private values or card) is in the observation the game gives it, so one instance serves every
episode of a batch. Randomised strategies draw from the `rng` the arena passes per episode, which
keeps episodes reproducible and independent of batch composition.

Strategies register under a game and a name (the names of docs/spec.md §2, used in
`conf/game/*.yaml`). A demonstrator that the spec says "is" an opponent is registered as an alias.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from sepo.errors import ConfigError


class Strategy:
    """Base class. Subclasses override `act`, or `probs` for a mixed strategy."""

    name: str = ""
    game: str = ""

    def probs(self, obs: dict[str, Any], legal: list[str]) -> dict[str, float]:
        """Action distribution at this observation. Deterministic strategies need not override."""
        raise NotImplementedError(f"{self.name} is not defined as a distribution")

    def act(self, obs: dict[str, Any], legal: list[str], rng: np.random.Generator) -> str:
        dist = self.probs(obs, legal)
        actions = list(dist)
        p = np.array([dist[a] for a in actions], dtype=float)
        return actions[int(rng.choice(len(actions), p=p / p.sum()))]


_REGISTRY: dict[str, dict[str, Callable[[], Strategy]]] = {}


def register(game: str, *names: str):
    """Class decorator: register a strategy class for `game` under one or more names."""

    def wrap(cls):
        for name in names:
            _REGISTRY.setdefault(game, {})[name] = cls
        cls.game = game
        if not cls.name:
            cls.name = names[0]
        return cls

    return wrap


def _ensure_loaded(game: str) -> None:
    import importlib

    try:
        importlib.import_module(f"sepo.strategies.{game}")
    except ModuleNotFoundError as err:  # a game without strategies yet
        if err.name != f"sepo.strategies.{game}":
            raise


def known_strategies(game: str) -> list[str]:
    _ensure_loaded(game)
    return sorted(_REGISTRY.get(game, {}))


def get_strategy(game: str, name: str, key: str = "strategy", params: dict[str, Any] | None = None) -> Strategy:
    """Instantiate a registered strategy; `key` names the config key for the error message.

    `params` are constructor arguments (a game's `strategy_params.<name>` in its config).
    """
    _ensure_loaded(game)
    table = _REGISTRY.get(game, {})
    if name not in table:
        raise ConfigError(f"{key}: unknown {game} strategy {name!r}; allowed: {', '.join(sorted(table)) or '(none)'}")
    try:
        strategy = table[name](**(params or {}))
    except TypeError as err:
        raise ConfigError(f"game.strategy_params.{name}: {err}") from None
    strategy.name = name
    return strategy


def responds_to_agent(game: str, name: str) -> bool:
    """Whether strategy `name` plays against the agent's own table (`BestResponse`): it can sit in
    an opponent pool only, never be a demonstrator, a datagen opponent or the agent."""
    _ensure_loaded(game)
    return bool(getattr(_REGISTRY.get(game, {}).get(name), "responds_to_agent", False))


def make_strategy(game_cfg: Any, name: str, key: str = "strategy") -> Strategy:
    """A strategy of the game in `game_cfg`, built with its `strategy_params.<name>` from the config.

    Parameters are looked up by the name used, so an alias (FairSplit for Fair) has its own entry.
    """
    params = (game_cfg.get("strategy_params") or {}).get(name) or {}
    if isinstance(params, DictConfig):
        params = OmegaConf.to_container(params, resolve=True)
    return get_strategy(game_cfg.name, name, key=key, params=params)
