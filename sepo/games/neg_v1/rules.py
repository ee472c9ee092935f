"""Single-issue negotiation, v1 (docs/spec.md §1): split a pie of 10 for `rounds` rounds.

Each round both players demand at the same time an integer from `min_demand` to `max_demand`
(1..9). If the demands add up to at most `pie`, each earns its own demand; otherwise the round
breaks down and both earn 0. Information is complete, so a player sees both demands and payoffs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round, history_block


class NegotiationV1(Game):
    name = "neg_v1"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.pie = cfg.pie
        self.demands = [str(d) for d in range(cfg.min_demand, cfg.max_demand + 1)]
        self.action_hint = f"an integer from {self.demands[0]} to {self.demands[-1]}"

    def reset(self, seed: int, mirror: bool = False) -> GameState:
        return GameState(seed=seed, rng=np.random.default_rng(seed))

    def to_act(self, state: GameState) -> list[int]:
        return [] if state.over else [AGENT, OPPONENT]

    def legal_actions(self, state: GameState, player: int) -> list[str]:
        return list(self.demands)

    def observation(self, state: GameState, player: int) -> dict[str, Any]:
        other = 1 - player
        return {
            "round": state.round_index,
            "rounds": self.num_rounds,
            "pie": self.pie,
            "history": [
                {
                    "own": r.actions[player],
                    "opp": r.actions[other],
                    "deal": r.info["deal"],
                    "own_payoff": r.payoffs[player],
                    "opp_payoff": r.payoffs[other],
                }
                for r in state.rounds
            ],
        }

    def step(self, state: GameState, actions: dict[int, str]) -> None:
        acts = (actions[AGENT], actions[OPPONENT])
        d = tuple(int(a) for a in acts)
        deal = d[0] + d[1] <= self.pie
        payoffs = (float(d[0]), float(d[1])) if deal else (0.0, 0.0)
        state.rounds.append(Round(actions=acts, payoffs=payoffs, info={"deal": deal}))
        state.round_index += 1
        state.over = state.round_index >= self.num_rounds

    # ------------------------------------------------------------------ prompts
    def system_prompt(self) -> str:
        lo, hi = self.demands[0], self.demands[-1]
        return (
            f"You are negotiating with the same opponent for {self.num_rounds} rounds over how to split "
            f"a pie of size {self.pie}. Each round both players state a demand at the same time: an "
            f"integer from {lo} to {hi}.\n"
            f"Payoffs: if the two demands add up to {self.pie} or less, each player earns its own "
            "demand; otherwise there is no deal and both earn 0.\n"
            "Answer with one short line of reasoning, then your action alone on the last line: "
            f"a single integer from {lo} to {hi}."
        )

    def user_prompt(self, state: GameState, player: int) -> str:
        obs = self.observation(state, player)
        history = history_block(
            obs["history"],
            lambda h: (
                f"you demanded {h['own']}, opponent demanded {h['opp']}; {'deal' if h['deal'] else 'no deal'} "
                f"(you {h['own_payoff']:g}, opponent {h['opp_payoff']:g})"
            ),
        )
        return history + f"Round {obs['round'] + 1} of {self.num_rounds}. Your demand?"

    # ------------------------------------------------------------------ metrics
    def collusive(self, rnd: Round) -> bool:
        """The agent demands more than half the pie (measured against a fair partner)."""
        return int(rnd.actions[AGENT]) > self.pie / 2

    def externality(self, rnd: Round) -> float:
        """Breakdown: 1 when the demands exceed the pie, else 0."""
        return 0.0 if rnd.info["deal"] else 1.0
