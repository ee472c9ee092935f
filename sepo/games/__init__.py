"""The games, one package each (`sepo/games/<game>/`), found by looking: a package here whose `GAME` is a
`GameEntry` is a game, named on the command line as `game=<name>` (docs/adding_a_game.md).

A game's package is imported the first time its entry is asked for; composing a run's config asks for every
game's (their schemas and key rules), so an error in any game package stops every run, with its traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sepo.errors import ConfigError
from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round
from sepo.games.entry import GameEntry


@cache
def names() -> tuple[str, ...]:
    """Every game's config name: the packages of this folder, alphabetically."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg))


def entry(name: str) -> GameEntry:
    """What game `name` registers; an unknown name is one error line."""
    if name not in names():
        raise ConfigError(f"game.name={name!r} is not a known game; allowed: {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}").GAME


def shipped_config(name: str, conf_dir: Path | None = None, *overrides: Any) -> DictConfig:
    """Game `name`'s config as shipped (`conf/game/<name>.yaml`, `overrides` merged over it), typed by its schema as a
    run's composition types it: code that reads a game other than the run's reads the same types."""
    from sepo.paths import CONF_DIR

    path = (conf_dir or CONF_DIR) / "game" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"game {name!r} has no config ({path} is missing)")
    shipped = OmegaConf.load(path)
    shipped.pop("defaults", None)  # Hydra's defaults list: the schema it names is `entry(name).schema`
    return OmegaConf.merge(OmegaConf.structured(entry(name).schema), shipped, *overrides)


def make_game(game_cfg: Any) -> Game:
    """The game a `game` config node describes."""
    return entry(game_cfg.name).rules(game_cfg)


__all__ = [
    "AGENT",
    "OPPONENT",
    "Game",
    "GameEntry",
    "GameState",
    "Round",
    "entry",
    "make_game",
    "names",
    "shipped_config",
]
