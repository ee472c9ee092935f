"""Agents: anything with `act_batch(requests) -> decisions`.

`LMPolicy` is exported lazily (PEP 562) so that importing this package, as every stage does, never
loads torch or transformers: `stage=datagen` and scripted evaluation stay light.
"""

from typing import Any

from sepo.policies.base import Decision, DecisionRequest, Policy
from sepo.policies.scripted import ScriptedPolicy

__all__ = ["Decision", "DecisionRequest", "LMPolicy", "Policy", "ScriptedPolicy"]


def __getattr__(name: str) -> Any:
    if name == "LMPolicy":
        from sepo.policies.lm import LMPolicy

        return LMPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
