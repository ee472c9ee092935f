"""Games by config name. `make_game(cfg.game)` builds the one a run asks for."""

from __future__ import annotations

import importlib
from typing import Any

from sepo.errors import ConfigError
from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round

#: config name -> "module:Class"; modules are imported lazily so one broken game cannot block others.
GAME_CLASSES = {
    "ipd": "sepo.games.ipd:IPD",
    "auction": "sepo.games.auction:Auction",
    "neg_v1": "sepo.games.neg_v1:NegotiationV1",
    "neg_v2": "sepo.games.neg_v2:NegotiationV2",
    "kuhn": "sepo.games.kuhn:KuhnPoker",
}


def make_game(game_cfg: Any) -> Game:
    name = game_cfg.name
    if name not in GAME_CLASSES:
        raise ConfigError(f"game.name={name!r} is not a known game; allowed: {', '.join(sorted(GAME_CLASSES))}")
    module, cls = GAME_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)(game_cfg)


__all__ = ["AGENT", "OPPONENT", "Game", "GameState", "Round", "make_game", "GAME_CLASSES"]
