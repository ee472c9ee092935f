"""Rule-based strategies and their registry.

A strategy is stateless: everything it needs (its own and the other player's past actions, its
private values or card) is in the observation the game gives it, so one instance serves every
episode of a batch. Randomised strategies draw from the `rng` the arena passes per episode, which
keeps episodes reproducible and independent of batch composition.

Strategies register under a game and a name (the names of docs/spec.md §2, used in
`conf/game/*.yaml`). A demonstrator that the spec says "is" an opponent is registered as an alias.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from omegaconf import DictConfig, OmegaConf

from sepo.config_rules import Rule
from sepo.errors import ConfigError


class Strategy:
    """Base class. Subclasses override `act`, or `probs` for a mixed strategy."""

    name: str = ""
    #: constructor parameter -> its allowed values, checked where a game's `strategy_params` sets it
    PARAMS: ClassVar[dict[str, Rule]] = {}

    @classmethod
    def param_rules(cls, game_cfg: Any) -> dict[str, Rule]:
        """The rules of the parameters; a strategy whose allowed values come from the game's rules (an
        auction's bid names) overrides this."""
        return cls.PARAMS

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
        if not cls.name:
            cls.name = names[0]
        return cls

    return wrap


def _ensure_loaded(game: str) -> None:
    """Import the game's package, whose strategies register themselves (an unknown game has none)."""
    from sepo import games

    if game in games.names():
        games.entry(game)


def known_strategies(game: str) -> list[str]:
    _ensure_loaded(game)
    return sorted(_REGISTRY.get(game, {}))


def get_strategy(
    game: str, name: str, key: str = "strategy", params: dict[str, Any] | None = None, game_cfg: Any = None
) -> Strategy:
    """Instantiate a registered strategy; `key` names the config key for the error message.

    `params` are constructor arguments (a game's `strategy_params.<name>` in its config), checked against
    the strategy's rules (with `game_cfg`, the game's config, where the rules depend on the game's).
    """
    _ensure_loaded(game)
    table = _REGISTRY.get(game, {})
    if name not in table:
        raise ConfigError(f"{key}: unknown {game} strategy {name!r}; allowed: {', '.join(sorted(table)) or '(none)'}")
    cls = table[name]
    check_params(cls, name, params or {}, game_cfg)
    strategy = cls(**(params or {}))
    strategy.name = name
    return strategy


def check_params(cls: type[Strategy], name: str, params: dict[str, Any], game_cfg: Any) -> None:
    """Every parameter is one the strategy takes, with an allowed value: `game.strategy_params.Mixed.noise=2`
    would otherwise play a TFT that is never random, and report on it."""
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    rules = cls.param_rules(game_cfg) if game_cfg is not None else cls.PARAMS
    for param, value in params.items():
        key = f"game.strategy_params.{name}.{param}"
        if param not in accepted:
            raise ConfigError(
                f"{key} is not a parameter of {name}; allowed: {', '.join(accepted) or 'none (it takes no parameters)'}"
            )
        rule = rules.get(param)
        if rule is not None and not rule.ok(value):
            raise ConfigError(
                f"{key}={value if rule.as_typed else repr(value)} is not allowed; allowed: {rule.allowed}"
            )


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
    return get_strategy(game_cfg.name, name, key=key, params=params, game_cfg=game_cfg)
