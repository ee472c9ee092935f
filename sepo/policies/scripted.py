"""A registered strategy playing as the agent (`model=scripted`): checks metrics without a model."""

from __future__ import annotations

from sepo.policies.base import Decision, DecisionRequest
from sepo.strategies import Strategy


class ScriptedPolicy:
    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.name = f"scripted:{strategy.name}"

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        return [Decision(self.strategy.act(r.observation, r.legal, r.rng)) for r in requests]
