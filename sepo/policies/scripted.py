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

    def action_probabilities(self, requests: list[DecisionRequest]) -> list[dict[str, float]]:
        """The strategy's exact distribution over each request's legal actions (exact exploitability).

        Only strategies that define `probs` (all Kuhn strategies) can answer this.
        """
        return [self.strategy.probs(r.observation, r.legal) for r in requests]
