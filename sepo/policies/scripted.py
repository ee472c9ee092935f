"""A registered strategy playing as the agent (`model=scripted`): checks metrics without a model."""

from __future__ import annotations

from sepo.games.strategy import Strategy
from sepo.policies.base import Decision, DecisionRequest
from sepo.policies.played import ActionEstimate, exact_estimate


class ScriptedPolicy:
    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.name = f"scripted:{strategy.name}"

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        return [Decision(self.strategy.act(r.observation, r.legal, r.rng)) for r in requests]

    def action_probabilities(
        self, requests: list[DecisionRequest], samples: int | None = None, seed: int | None = None
    ) -> list[ActionEstimate]:
        """The strategy's exact distribution over each request's legal actions (standard errors 0;
        `samples` and `seed` are for sampled policies). Only strategies that define `probs` (all
        Kuhn strategies) can answer this.
        """
        return [exact_estimate(self.strategy.probs(r.observation, r.legal)) for r in requests]
