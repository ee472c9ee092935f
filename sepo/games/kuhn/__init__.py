"""Kuhn poker (docs/spec.md §1), registered as one game: its rules (`rules`; the exact analysis in `exact`), strategies
(`strategies`), demonstrators' reasoning lines (`reasoning`) and config keys (`config`)."""

from sepo.games.entry import game_entry
from sepo.games.kuhn.rules import KuhnPoker

GAME = game_entry(__name__, label="Kuhn", rules=KuhnPoker)
