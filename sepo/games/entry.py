"""What a game registers (`GAME` in `sepo/games/<game>/__init__.py`): everything the rest of the code needs
to know of it, beside its two YAML files (conf/game/<game>.yaml, conf/lambdas/<game>.yaml)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sepo.games.base import Game
from sepo.games.reasoning import Reasoning


def no_rule_between_keys(game_cfg: Any) -> str | None:
    return None


@dataclass(frozen=True)
class GameEntry:
    name: str  # the config name: `game=<name>`, conf/game/<name>.yaml, conf/lambdas/<name>.yaml
    label: str  # its name in the tables (LaTeX)
    rules: type[Game]  # the game itself, built from the `game` config node
    #: the `game` node's schema (a `sepo.games.schema.GameSchema`: its keys' types and allowed values), registered
    #: as `game/schema_<name>`
    schema: type
    reasoning: Reasoning  # the demonstrators' reasoning lines in the SFT data
    #: the rules between its keys: the error line of the first one the config breaks, or None
    check: Callable[[Any], str | None] = no_rule_between_keys


def game_entry(package: str, label: str, rules: type[Game]) -> GameEntry:
    """The entry of the game in `package` (`sepo.games.<name>`), from its modules: `config` (`SCHEMA`,
    and `check` where its keys have rules between them) and `reasoning`; importing its `strategies` registers them."""
    config, reasoning = (importlib.import_module(f"{package}.{module}") for module in ("config", "reasoning"))
    importlib.import_module(f"{package}.strategies")
    return GameEntry(
        name=package.rsplit(".", 1)[-1],
        label=label,
        rules=rules,
        schema=config.SCHEMA,
        reasoning=Reasoning.of(reasoning),
        check=getattr(config, "check", no_rule_between_keys),
    )
