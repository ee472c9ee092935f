"""The rollout policy of SEPO: the language-model agent, with every decision's training trace kept."""

from __future__ import annotations

from sepo.policies.base import Decision, DecisionRequest
from sepo.policies.lm import LMPolicy
from sepo.policies.played import ActionEstimate, estimates_from_answers


class RecordingPolicy:
    """Lets the arena drive an LMPolicy while keeping token ids and behaviour log-probs."""

    def __init__(self, policy: LMPolicy):
        self.policy, self.name = policy, policy.name

    @property
    def workers(self) -> int:
        """The policy's forked workers: the episodes' traces come back from them whole."""
        return self.policy.workers

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        return self.policy.act_batch(requests, return_logprobs=True)

    def read_answers(self, copies: list[DecisionRequest], samples: int) -> tuple[list[Decision], list[ActionEstimate]]:
        """`samples` answers to each request (`sample_requests`' copies), with their training traces, and the
        estimate of the policy's action probabilities read from those very answers (Rao-Blackwellised): what
        an exact-value batch (`sepo.training.exact_values`) trains on and values."""
        answers, decisions = self.policy.answer(copies, return_logprobs=True)
        return decisions, estimates_from_answers(self.policy, copies, answers, decisions, samples)

    def episodes_over(self) -> None:
        self.policy.episodes_over()
