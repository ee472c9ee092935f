"""Iterated Chicken (Hawk-Dove; docs/spec.md §1), registered as one game: its rules (`rules`), strategies
(`strategies`), demonstrators' reasoning lines (`reasoning`) and config keys (`config`)."""

from sepo.games.chicken.rules import Chicken
from sepo.games.entry import game_entry

GAME = game_entry(__name__, label="Chicken", rules=Chicken)
