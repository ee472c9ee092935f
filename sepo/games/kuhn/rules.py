"""Kuhn poker (docs/spec.md §1), played as `rounds` hands with seats alternating hand by hand.

The rules match OpenSpiel's `kuhn_poker` so that exact exploitability can be checked against it:
three cards J < Q < K, both players ante `ante`, one private card each. The first player PASSes or
BETs `bet`; after PASS the second player PASSes (showdown) or BETs, and then the first player CALLs
or FOLDs; after BET the second player CALLs (showdown) or FOLDs. Facing a bet the actions are
CALL/FOLD, otherwise PASS/BET.

Seats: the agent is the first player in even hands and the second in odd hands; `mirror=True`
swaps every hand's seats. All hands' cards are dealt by seat at `reset` from the episode's rng, so
a mirrored episode gets exactly the same deal and the agent holds the card the opponent held
(docs/spec.md §1: mirrored pairs).

A Round is one hand: `actions` are each player's tuple of actions in the hand, `payoffs` the
zero-sum chip result, `info` the cards, the agent's seat, the betting sequence and whether the hand
went to showdown. A player's observation never holds the other's card, except for previous hands
that went to showdown (a fold hides it, as at a real table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round
from sepo.games.kuhn.exact import (
    first_seat_payoff,
)

PASS, BET, CALL, FOLD = "PASS", "BET", "CALL", "FOLD"
CARDS = ("J", "Q", "K")  # index = rank, as OpenSpiel's card numbers 0, 1, 2
SEATS = ("first", "second")
#: OpenSpiel's action index of each action string: 0 = pass/fold, 1 = bet/call.
ACTION_INDEX = {PASS: 0, FOLD: 0, BET: 1, CALL: 1}


@dataclass
class KuhnState(GameState):
    mirror: bool = False
    #: per hand, the card index held by (first seat, second seat)
    deals: list[tuple[int, int]] = field(default_factory=list)
    #: actions taken so far in the current hand, in order (first seat acts at even positions)
    betting: list[str] = field(default_factory=list)


def node_of(betting: list[str] | tuple[str, ...]) -> str:
    """OpenSpiel's public history letters: 'p' for PASS/FOLD, 'b' for BET/CALL ('', 'p', 'b', 'pb')."""
    return "".join("b" if ACTION_INDEX[a] else "p" for a in betting)


def facing_bet(betting: list[str] | tuple[str, ...]) -> bool:
    return bool(betting) and betting[-1] == BET


def is_terminal(betting: list[str] | tuple[str, ...]) -> bool:
    """PASS PASS, BET CALL/FOLD and PASS BET CALL/FOLD end a hand."""
    return len(betting) >= 2 and betting[-1] != BET


class KuhnPoker(Game):
    name = "kuhn"
    action_hint = "PASS/BET/CALL/FOLD"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.ante = float(cfg.ante)
        self.bet = float(cfg.bet)

    # ------------------------------------------------------------------ seats and cards
    @staticmethod
    def agent_seat(state: KuhnState, hand: int | None = None) -> int:
        """0 when the agent is the first player of `hand` (default: the current hand), else 1."""
        hand = state.round_index if hand is None else hand
        return (hand + int(state.mirror)) % 2

    def seat_of(self, state: KuhnState, player: int, hand: int | None = None) -> int:
        seat = self.agent_seat(state, hand)
        return seat if player == AGENT else 1 - seat

    def card_of(self, state: KuhnState, player: int, hand: int | None = None) -> int:
        hand = state.round_index if hand is None else hand
        return state.deals[hand][self.seat_of(state, player, hand)]

    # ------------------------------------------------------------------ payoffs
    def first_seat_payoff(self, betting: list[str] | tuple[str, ...], first_card: int, second_card: int) -> float:
        """The first player's chips won in a finished hand (the second player gets the negative)."""
        return first_seat_payoff(node_of(betting), first_card, second_card, self.ante, self.bet)

    # ------------------------------------------------------------------ episode dynamics
    def reset(self, seed: int, mirror: bool = False) -> KuhnState:
        rng = np.random.default_rng(seed)
        deals = [tuple(int(c) for c in rng.choice(len(CARDS), size=2, replace=False)) for _ in range(self.num_rounds)]
        return KuhnState(seed=seed, rng=rng, mirror=mirror, deals=deals)

    def state_at(self, card: int, seat: int, betting: list[str] | tuple[str, ...]) -> KuhnState:
        """A first-hand state where the agent holds `card` in `seat` after `betting`.

        Used to ask a policy about one information set (exact exploitability). The opponent gets
        the lowest other card; it is hidden from the agent, so any other card would do.
        """
        other = min(c for c in range(len(CARDS)) if c != card)
        deal = (card, other) if seat == 0 else (other, card)
        state = self.reset(0, mirror=seat == 1)
        state.deals[0] = deal
        state.betting = list(betting)
        return state

    def to_act(self, state: KuhnState) -> list[int]:
        if state.over:
            return []
        mover_seat = len(state.betting) % 2
        return [AGENT if mover_seat == self.agent_seat(state) else OPPONENT]

    def legal_actions(self, state: KuhnState, player: int) -> list[str]:
        if state.over or player not in self.to_act(state):
            return []
        return [CALL, FOLD] if facing_bet(state.betting) else [PASS, BET]

    def observation(self, state: KuhnState, player: int) -> dict[str, Any]:
        hand = min(state.round_index, self.num_rounds - 1)
        obs: dict[str, Any] = {
            "hand": state.round_index,
            "hands": self.num_rounds,
            "history": [self._past_hand(state, player, i, r) for i, r in enumerate(state.rounds)],
        }
        if not state.over:
            obs.update(
                card=CARDS[self.card_of(state, player, hand)],
                seat=SEATS[self.seat_of(state, player, hand)],
                betting=list(state.betting),
            )
        return obs

    def _past_hand(self, state: KuhnState, player: int, hand: int, rnd: Round) -> dict[str, Any]:
        showdown = rnd.info["showdown"]
        return {
            "card": CARDS[self.card_of(state, player, hand)],
            "seat": SEATS[self.seat_of(state, player, hand)],
            "betting": list(rnd.info["betting"]),
            "payoff": rnd.payoffs[player],
            "showdown": showdown,
            "opp_card": CARDS[self.card_of(state, 1 - player, hand)] if showdown else None,
        }

    def step(self, state: KuhnState, actions: dict[int, str]) -> None:
        (player,) = self.to_act(state)
        action = actions[player]
        if action not in self.legal_actions(state, player):
            raise ValueError(f"illegal Kuhn action {action!r} after {state.betting}")
        state.betting.append(action)
        if is_terminal(state.betting):
            self._finish_hand(state)

    def _finish_hand(self, state: KuhnState) -> None:
        hand, betting = state.round_index, tuple(state.betting)
        first, second = state.deals[hand]
        v = self.first_seat_payoff(betting, first, second)
        seat = self.agent_seat(state)
        agent_pay = v if seat == 0 else -v
        own = lambda s: tuple(a for i, a in enumerate(betting) if i % 2 == s)  # noqa: E731
        state.rounds.append(
            Round(
                actions=(own(seat), own(1 - seat)),
                payoffs=(agent_pay, -agent_pay),
                info={
                    "agent_card": CARDS[self.card_of(state, AGENT)],
                    "opponent_card": CARDS[self.card_of(state, OPPONENT)],
                    "agent_seat": SEATS[seat],
                    "betting": betting,
                    "showdown": betting[-1] != FOLD,
                },
            )
        )
        state.betting = []
        state.round_index += 1
        state.over = state.round_index >= self.num_rounds

    # ------------------------------------------------------------------ prompts
    def system_prompt(self) -> str:
        a, b = self.ante, self.bet
        return (
            f"You are playing Kuhn poker against the same opponent for {self.num_rounds} hands. "
            "The deck has three cards, J < Q < K. Each hand both players ante "
            f"{a:g} chip{'s' if a != 1 else ''} and get one private card; the seats alternate every hand.\n"
            f"The first player may PASS or BET {b:g}. After a PASS the second player may PASS (showdown: "
            f"the higher card wins {a:g}) or BET {b:g}; then the first player may CALL (showdown for "
            f"{a + b:g}) or FOLD (losing {a:g}). After a BET the second player may CALL (showdown for "
            f"{a + b:g}) or FOLD (losing {a:g}). Facing a bet you may only CALL or FOLD; otherwise only "
            "PASS or BET. You see the opponent's card only after a showdown.\n"
            "Answer with one short line of reasoning, then your action alone on the last line: "
            "PASS, BET, CALL or FOLD."
        )

    @staticmethod
    def _betting_text(betting: list[str], own_seat: int) -> str:
        if not betting:
            return "none"
        return ", ".join(f"{'you' if i % 2 == own_seat else 'opponent'} {a}" for i, a in enumerate(betting))

    def user_prompt(self, state: KuhnState, player: int) -> str:
        obs = self.observation(state, player)
        lines = []
        for i, h in enumerate(obs["history"]):
            seat = SEATS.index(h["seat"])
            reveal = (
                f"showdown, opponent had {h['opp_card']}" if h["showdown"] else "no showdown, opponent's card not shown"
            )
            lines.append(
                f"Hand {i + 1}: you were the {h['seat']} player with {h['card']}; "
                f"betting: {self._betting_text(h['betting'], seat)}; {reveal}; "
                f"you {'won' if h['payoff'] >= 0 else 'lost'} {abs(h['payoff']):g}."
            )
        history = "\n".join(lines) if lines else "none"
        total = sum(h["payoff"] for h in obs["history"])
        seat = SEATS.index(obs["seat"])
        legal = self.legal_actions(state, player)
        return (
            f"Previous hands:\n{history}\n"
            f"Your total so far: {total:+g}.\n"
            f"Hand {obs['hand'] + 1} of {self.num_rounds}.\n"
            f"Your card: {obs['card']}.\n"
            f"Your seat: {obs['seat']} player ({'you act first' if seat == 0 else 'the opponent acts first'}).\n"
            f"Betting so far: {self._betting_text(obs['betting'], seat)}.\n"
            f"Legal actions: {', '.join(legal)}.\n"
            "Your action?"
        )

    # ------------------------------------------------------------------ metrics
    def collusive(self, rnd: Round) -> bool:
        """Kuhn poker has no collusion measure (docs/spec.md §3)."""
        return False

    def externality(self, rnd: Round) -> float:
        """Zero-sum: no externality (docs/spec.md §3)."""
        return 0.0
