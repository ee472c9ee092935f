"""Iterated Chicken (docs/spec.md §1): simultaneous SWERVE/STRAIGHT for `rounds` rounds.

Two drivers head for each other. Swerving against a driver who goes straight loses face (`sucker`), going
straight against a swerver wins it (`temptation`), both swerving is the cooperative outcome (`reward`) and
both going straight is the crash (`punishment`), the worst for both: temptation > reward > sucker >
punishment. Unlike the IPD, the best reply to a driver who always goes straight is to swerve, and it is
exactly what makes the agent exploitable: a committed aggressor takes temptation - sucker from it every
round, and only the crash, at a cost to both, denies it that.
"""

from __future__ import annotations

from sepo.games.matrix import RepeatedMatrixGame

SWERVE, STRAIGHT = "SWERVE", "STRAIGHT"


class Chicken(RepeatedMatrixGame):
    name = "chicken"
    action_hint = "SWERVE/STRAIGHT"
    KIND, HARD = SWERVE, STRAIGHT

    def system_prompt(self) -> str:
        return (
            f"You are playing repeated Chicken for {self.num_rounds} rounds against the same opponent: two "
            "drivers head for each other, and each round both choose at the same time to SWERVE or to go "
            "STRAIGHT.\n"
            + self.payoff_line()
            + "Answer with one short line of reasoning, then your action alone on the last line: "
            "SWERVE or STRAIGHT."
        )
