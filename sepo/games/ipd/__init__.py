"""Iterated Prisoner's Dilemma (docs/spec.md §1), registered as one game: its rules (`rules`), strategies
(`strategies`), demonstrators' reasoning lines (`reasoning`) and config keys (`config`)."""

from sepo.games.entry import game_entry
from sepo.games.ipd.rules import IPD

GAME = game_entry(__name__, label="IPD", rules=IPD)
