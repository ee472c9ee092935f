"""Rule-based opponents and demonstrators, registered by game and name (docs/spec.md §2)."""

from sepo.strategies.base import Strategy, get_strategy, known_strategies, make_strategy, register, responds_to_agent

__all__ = ["Strategy", "get_strategy", "known_strategies", "make_strategy", "register", "responds_to_agent"]
