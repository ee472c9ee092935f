"""Iterated Prisoner's Dilemma (docs/spec.md §1): simultaneous COOPERATE/DEFECT for `rounds` rounds."""

from __future__ import annotations

from typing import Any

from sepo.games.matrix import RepeatedMatrixGame

COOPERATE, DEFECT = "COOPERATE", "DEFECT"


class IPD(RepeatedMatrixGame):
    name = "ipd"
    action_hint = "COOPERATE/DEFECT"
    KIND, HARD = COOPERATE, DEFECT

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.state_last_move = cfg.state_last_move

    def system_prompt(self) -> str:
        return (
            f"You are playing an iterated prisoner's dilemma for {self.num_rounds} rounds against "
            "the same opponent. Each round both players choose at the same time.\n"
            + self.payoff_line()
            + "Answer with one short line of reasoning, then your action alone on the last line: "
            "COOPERATE or DEFECT."
        )

    def before_question(self, obs: dict[str, Any]) -> str:
        """`state_last_move`: the opponent's last move in a line of its own, so that the move a reactive rule
        answers is in the prompt's last words rather than somewhere in the history, for the model to read
        rather than to restate in a reasoning line that training can bend."""
        return (
            f"The opponent's last move: {obs['history'][-1]['opp']}.\n"
            if self.state_last_move and obs["history"]
            else ""
        )
