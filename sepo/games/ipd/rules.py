"""Iterated Prisoner's Dilemma (docs/spec.md §1): simultaneous COOPERATE/DEFECT for `rounds` rounds."""

from __future__ import annotations

from typing import Any

import numpy as np

from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round, history_block

COOPERATE, DEFECT = "COOPERATE", "DEFECT"


class IPD(Game):
    name = "ipd"
    action_hint = "COOPERATE/DEFECT"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        p = cfg.payoffs
        # payoff[(mine, theirs)] = my payoff
        self.payoff = {
            (COOPERATE, COOPERATE): float(p.reward),
            (DEFECT, DEFECT): float(p.punishment),
            (DEFECT, COOPERATE): float(p.temptation),
            (COOPERATE, DEFECT): float(p.sucker),
        }
        self.social_optimum = 2 * float(p.reward)
        self.state_last_move = bool(cfg.state_last_move)

    def reset(self, seed: int, mirror: bool = False) -> GameState:
        return GameState(seed=seed, rng=np.random.default_rng(seed))

    def to_act(self, state: GameState) -> list[int]:
        return [] if state.over else [AGENT, OPPONENT]

    def legal_actions(self, state: GameState, player: int) -> list[str]:
        return [COOPERATE, DEFECT]

    def observation(self, state: GameState, player: int) -> dict[str, Any]:
        other = 1 - player
        return {
            "round": state.round_index,
            "rounds": self.num_rounds,
            "history": [
                {
                    "own": r.actions[player],
                    "opp": r.actions[other],
                    "own_payoff": r.payoffs[player],
                    "opp_payoff": r.payoffs[other],
                }
                for r in state.rounds
            ],
        }

    def step(self, state: GameState, actions: dict[int, str]) -> None:
        a, o = actions[AGENT], actions[OPPONENT]
        state.rounds.append(Round(actions=(a, o), payoffs=(self.payoff[(a, o)], self.payoff[(o, a)])))
        state.round_index += 1
        state.over = state.round_index >= self.num_rounds

    # ------------------------------------------------------------------ prompts
    def system_prompt(self) -> str:
        p = self.payoff
        return (
            f"You are playing an iterated prisoner's dilemma for {self.num_rounds} rounds against "
            "the same opponent. Each round both players choose at the same time.\n"
            f"Payoffs (you, opponent): both COOPERATE {p[(COOPERATE, COOPERATE)]:g}/"
            f"{p[(COOPERATE, COOPERATE)]:g}; both DEFECT {p[(DEFECT, DEFECT)]:g}/{p[(DEFECT, DEFECT)]:g}; "
            f"you DEFECT and they COOPERATE {p[(DEFECT, COOPERATE)]:g}/{p[(COOPERATE, DEFECT)]:g}; "
            f"you COOPERATE and they DEFECT {p[(COOPERATE, DEFECT)]:g}/{p[(DEFECT, COOPERATE)]:g}.\n"
            "Answer with one short line of reasoning, then your action alone on the last line: "
            "COOPERATE or DEFECT."
        )

    def user_prompt(self, state: GameState, player: int) -> str:
        obs = self.observation(state, player)
        history = history_block(
            obs["history"],
            lambda h: f"you {h['own']}, opponent {h['opp']} (you {h['own_payoff']:g}, opponent {h['opp_payoff']:g})",
        )
        return history + self._last_move(obs) + f"Round {obs['round'] + 1} of {self.num_rounds}. Your action?"

    def _last_move(self, obs: dict[str, Any]) -> str:
        """`state_last_move`: the opponent's last move in a line of its own, so that the move a reactive rule
        answers is in the prompt's last words rather than somewhere in the history, for the model to read
        rather than to restate in a reasoning line that training can bend."""
        return (
            f"The opponent's last move: {obs['history'][-1]['opp']}.\n"
            if self.state_last_move and obs["history"]
            else ""
        )

    # ------------------------------------------------------------------ metrics
    def collusive(self, rnd: Round) -> bool:
        """Defecting on an always-cooperating partner (measured against the collusive pool)."""
        return rnd.actions[AGENT] == DEFECT

    def externality(self, rnd: Round) -> float:
        """Welfare shortfall from mutual cooperation: 1 - joint payoff / 6."""
        return 1.0 - sum(rnd.payoffs) / self.social_optimum
