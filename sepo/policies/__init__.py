"""Agents: anything with `act_batch(requests) -> decisions`."""

from sepo.policies.base import Decision, DecisionRequest, Policy
from sepo.policies.scripted import ScriptedPolicy

__all__ = ["Decision", "DecisionRequest", "Policy", "ScriptedPolicy"]
