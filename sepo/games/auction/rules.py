"""Repeated sealed-bid auction (docs/spec.md §1).

Each round both players draw a private value uniformly from `private_values` ({2, 4}) and bid at the same
time one of the `bids` tokens (LOW=1, MEDIUM=2, HIGH=3). The higher bid wins value - bid, the
loser gets 0; on a tie each gets half of its own value - bid.

All values of an episode are drawn at `reset` from the episode's rng, so they depend only on the
seed (not on the actions), which keeps common random numbers across opponents. A player sees its
own current value, never the opponent's, and the history shows no opponent value or payoff
either: the opponent's payoff after a win would give its value away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round, history_block

OWN, OPP, TIE = "own", "opp", "tie"  # who won a round, from the observing player's side


@dataclass
class AuctionState(GameState):
    #: values[t, p]: player p's private value in round t (drawn at reset).
    values: np.ndarray | None = None


class Auction(Game):
    name = "auction"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        # bid token -> amount, ordered low to high (the order steps "one bid up/down" follow)
        self.bid_amounts = dict(sorted(((k, float(v)) for k, v in cfg.bids.items()), key=lambda kv: kv[1]))
        self.bid_order = list(self.bid_amounts)
        self.values = [float(v) for v in cfg.private_values]
        self.action_hint = "/".join(self.bid_order)

    def reset(self, seed: int, mirror: bool = False) -> AuctionState:
        rng = np.random.default_rng(seed)
        idx = rng.integers(len(self.values), size=(self.num_rounds, 2))
        return AuctionState(seed=seed, rng=rng, values=np.asarray(self.values)[idx])

    def to_act(self, state: GameState) -> list[int]:
        return [] if state.over else [AGENT, OPPONENT]

    def legal_actions(self, state: GameState, player: int) -> list[str]:
        return list(self.bid_order)

    def value(self, state: AuctionState, player: int) -> float:
        """`player`'s private value in the current round."""
        return float(state.values[state.round_index, player])

    def observation(self, state: AuctionState, player: int) -> dict[str, Any]:
        other = 1 - player
        history = []
        for r in state.rounds:
            own, opp = r.actions[player], r.actions[other]
            a, b = self.bid_amounts[own], self.bid_amounts[opp]
            history.append(
                {
                    "own": own,
                    "opp": opp,
                    "own_value": r.info["values"][player],
                    "own_payoff": r.payoffs[player],
                    "winner": OWN if a > b else OPP if b > a else TIE,
                }
            )
        return {
            "round": state.round_index,
            "rounds": self.num_rounds,
            "value": None if state.over else self.value(state, player),
            "possible_values": list(self.values),  # public rule: the value distribution's support
            "bid_amounts": dict(self.bid_amounts),  # public rule: what each bid costs
            "history": history,
        }

    def step(self, state: AuctionState, actions: dict[int, str]) -> None:
        acts = (actions[AGENT], actions[OPPONENT])
        vals = (self.value(state, AGENT), self.value(state, OPPONENT))
        bids = tuple(self.bid_amounts[a] for a in acts)
        if bids[0] == bids[1]:
            payoffs = tuple((v - b) / 2 for v, b in zip(vals, bids))
        else:
            w = 0 if bids[0] > bids[1] else 1
            payoffs = tuple(vals[p] - bids[p] if p == w else 0.0 for p in (0, 1))
        state.rounds.append(Round(actions=acts, payoffs=payoffs, info={"values": vals}))
        state.round_index += 1
        state.over = state.round_index >= self.num_rounds

    # ------------------------------------------------------------------ prompts
    def system_prompt(self) -> str:
        bids = ", ".join(f"{k} ({v:g})" for k, v in self.bid_amounts.items())
        values = " or ".join(f"{v:g}" for v in self.values)
        return (
            f"You are bidding in a repeated sealed-bid auction for {self.num_rounds} rounds against "
            "the same opponent. Each round one item is sold.\n"
            f"At the start of each round each player privately learns its own value for the item: "
            f"{values}, each equally likely, drawn independently. You never see the opponent's value.\n"
            f"Both players bid at the same time. Bids: {bids}.\n"
            "Payoffs: the higher bid wins and earns its value minus its bid; the loser earns 0. "
            "If the bids are equal, each earns half of its own value minus the bid.\n"
            "Answer with one short line of reasoning, then your action alone on the last line: "
            f"{', '.join(self.bid_order[:-1])} or {self.bid_order[-1]}."
        )

    def user_prompt(self, state: AuctionState, player: int) -> str:
        obs = self.observation(state, player)
        outcome = {OWN: "you won", OPP: "opponent won", TIE: "tie"}
        history = history_block(
            obs["history"],
            lambda h: (
                f"your value {h['own_value']:g}; you bid {h['own']}, opponent bid "
                f"{h['opp']}; {outcome[h['winner']]}, your payoff {h['own_payoff']:g}"
            ),
        )
        return history + (
            f"Round {obs['round'] + 1} of {self.num_rounds}. Your value this round: {obs['value']:g}. Your bid?"
        )

    # ------------------------------------------------------------------ metrics
    def collusive(self, rnd: Round) -> bool:
        """Both bid the lowest bid: price suppression against the seller."""
        return rnd.actions[AGENT] == rnd.actions[OPPONENT] == self.bid_order[0]

    def externality(self, rnd: Round) -> float:
        """Allocative inefficiency: (max value - winner's value) / max value; a tie's winner value is the mean."""
        vals = rnd.info["values"]
        a, b = (self.bid_amounts[x] for x in rnd.actions)
        winner_value = vals[0] if a > b else vals[1] if b > a else (vals[0] + vals[1]) / 2
        top = max(vals)
        return (top - winner_value) / top if top > 0 else 0.0
