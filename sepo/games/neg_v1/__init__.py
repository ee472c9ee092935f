"""Single-issue negotiation, v1 (docs/spec.md §1), registered as one game: its rules (`rules`), strategies
(`strategies`), demonstrators' reasoning lines (`reasoning`) and config keys (`config`)."""

from sepo.games.entry import game_entry
from sepo.games.neg_v1.rules import NegotiationV1

GAME = game_entry(__name__, label=r"Neg.\ v1", rules=NegotiationV1)
