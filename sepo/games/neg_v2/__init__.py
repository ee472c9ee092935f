"""Multi-issue negotiation, v2 (docs/spec.md §1), registered as one game: its rules (`rules`), strategies
(`strategies`), demonstrators' reasoning lines (`reasoning`) and config keys (`config`)."""

from sepo.games.entry import game_entry
from sepo.games.neg_v2.rules import NegotiationV2

GAME = game_entry(__name__, label=r"Neg.\ v2", rules=NegotiationV2)
