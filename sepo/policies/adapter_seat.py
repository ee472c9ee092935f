"""A seat of the arena played by one adapter of a model that several players share (`sepo.lm.adapters`)."""

from __future__ import annotations

from typing import Any

from sepo.lm.adapters import adapter_active
from sepo.policies.base import Decision, DecisionRequest


class AdapterSeat:
    """A language-model policy that plays one adapter of a shared model (None: the base with adapters off).

    It answers like the policy it wraps (and is that policy for everything else: its settings, its workers);
    only its calls run with its adapter active."""

    def __init__(self, policy: Any, adapter: str | None, name: str | None = None):
        self.policy, self.adapter = policy, adapter
        self.name = name or f"{policy.name}[{adapter or 'base'}]"

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.policy, attr)

    def act_batch(self, requests: list[DecisionRequest], **kwargs: Any) -> list[Decision]:
        with adapter_active(self.policy.model, self.adapter):
            return self.policy.act_batch(requests, **kwargs)

    def action_probabilities(self, requests: list[DecisionRequest], *args: Any, **kwargs: Any) -> Any:
        with adapter_active(self.policy.model, self.adapter):
            return self.policy.action_probabilities(requests, *args, **kwargs)
