"""Repeated two-action games played at once (the IPD, Chicken): what such games share.

Both players choose, every round, between a kind action (the first of `legal_actions`: COOPERATE, SWERVE)
and a hard one (the second: DEFECT, STRAIGHT), and the payoff table has the four names of the
literature: `reward` (both kind), `punishment` (both hard), `temptation` (hard against kind) and `sucker`
(kind against hard). The order of the four makes the game: the IPD has temptation > reward > punishment >
sucker, Chicken temptation > reward > sucker > punishment.

The reactive strategies here (TFT and its variants, Grim, the unconditional ones) read the two actions
from `legal` in that order, so one definition serves every such game under the names it gives them, and
`explain_reactive` gives their demonstrators' reasoning cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sepo.config_rules import allowed, finite, probability
from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round, history_block
from sepo.games.reasoning import Explained
from sepo.games.strategy import Strategy

PAYOFF_NAMES = ("reward", "punishment", "temptation", "sucker")


@dataclass
class PayoffsSchema:
    """The four payoffs by their names in the literature; any finite numbers (a payoff may be negative)."""

    reward: float = allowed(finite())
    punishment: float = allowed(finite())
    temptation: float = allowed(finite())
    sucker: float = allowed(finite())


class RepeatedMatrixGame(Game):
    """`rounds` rounds of one 2x2 game played at once; subclasses name the two actions and write the rules."""

    KIND = HARD = ""

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        p = cfg.payoffs
        kind, hard = self.KIND, self.HARD
        # payoff[(mine, theirs)] = my payoff
        self.payoff = {
            (kind, kind): float(p.reward),
            (hard, hard): float(p.punishment),
            (hard, kind): float(p.temptation),
            (kind, hard): float(p.sucker),
        }
        self.social_optimum = 2 * float(p.reward)

    def reset(self, seed: int, mirror: bool = False) -> GameState:
        return GameState(seed=seed, rng=np.random.default_rng(seed))

    def to_act(self, state: GameState) -> list[int]:
        return [] if state.over else [AGENT, OPPONENT]

    def legal_actions(self, state: GameState, player: int) -> list[str]:
        return [self.KIND, self.HARD]

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

    def payoff_line(self) -> str:
        """The system prompt's payoff table, as (you, opponent) for each pair of actions."""
        p, kind, hard = self.payoff, self.KIND, self.HARD
        return (
            f"Payoffs (you, opponent): both {kind} {p[(kind, kind)]:g}/{p[(kind, kind)]:g}; "
            f"both {hard} {p[(hard, hard)]:g}/{p[(hard, hard)]:g}; "
            f"you {hard} and they {kind} {p[(hard, kind)]:g}/{p[(kind, hard)]:g}; "
            f"you {kind} and they {hard} {p[(kind, hard)]:g}/{p[(hard, kind)]:g}.\n"
        )

    def user_prompt(self, state: GameState, player: int) -> str:
        obs = self.observation(state, player)
        history = history_block(
            obs["history"],
            lambda h: f"you {h['own']}, opponent {h['opp']} (you {h['own_payoff']:g}, opponent {h['opp_payoff']:g})",
        )
        return history + self.before_question(obs) + f"Round {obs['round'] + 1} of {self.num_rounds}. Your action?"

    def before_question(self, obs: dict[str, Any]) -> str:
        """What a game adds between the history and the question (nothing here)."""
        return ""

    def collusive(self, rnd: Round) -> bool:
        """The agent plays hard against a partner who plays kind (measured against the collusive pool)."""
        return rnd.actions[AGENT] == self.HARD

    def externality(self, rnd: Round) -> float:
        """The welfare shortfall from both playing kind: 1 - joint payoff / (2 x reward)."""
        return 1.0 - sum(rnd.payoffs) / self.social_optimum


# ---------------------------------------------------------------------------------- strategies
def _last_opp(obs: dict[str, Any]) -> str | None:
    return obs["history"][-1]["opp"] if obs["history"] else None


class TitForTat(Strategy):
    """Kind first, then copy the other player's last action."""

    def act(self, obs, legal, rng):
        return _last_opp(obs) or legal[0]


class GenerousTFT(Strategy):
    """TFT that forgives a hard action with probability `forgive` (1/3)."""

    PARAMS = {"forgive": probability()}

    def __init__(self, forgive: float = 1.0 / 3.0):
        self.forgive = forgive

    def act(self, obs, legal, rng):
        kind, hard = legal
        if _last_opp(obs) == hard and rng.random() >= self.forgive:
            return hard
        return kind


class MixedTFT(Strategy):
    """TFT that plays a uniformly random action with probability `noise` (20%)."""

    PARAMS = {"noise": probability()}

    def __init__(self, noise: float = 0.2):
        self.noise = noise

    def act(self, obs, legal, rng):
        if rng.random() < self.noise:
            return legal[int(rng.integers(len(legal)))]
        return _last_opp(obs) or legal[0]


class NoisyTFT(Strategy):
    """TFT whose intended action is flipped with probability `flip` (30%; a robust-pool opponent)."""

    PARAMS = {"flip": probability()}

    def __init__(self, flip: float = 0.3):
        self.flip = flip

    def act(self, obs, legal, rng):
        kind, hard = legal
        intended = _last_opp(obs) or kind
        if rng.random() < self.flip:
            return hard if intended == kind else kind
        return intended


class SuspiciousTFT(Strategy):
    """TFT that opens with the hard action (a robust-pool opponent)."""

    def act(self, obs, legal, rng):
        return _last_opp(obs) or legal[1]


class Grim(Strategy):
    """Kind until the other player plays hard once, then hard for ever."""

    def act(self, obs, legal, rng):
        kind, hard = legal
        return hard if any(h["opp"] == hard for h in obs["history"]) else kind


class AlwaysHard(Strategy):
    def act(self, obs, legal, rng):
        return legal[1]


class AlternateHard(Strategy):
    """Hard, kind, hard, kind, ... by round index."""

    def act(self, obs, legal, rng):
        return legal[1] if obs["round"] % 2 == 0 else legal[0]


class AlwaysKind(Strategy):
    def act(self, obs, legal, rng):
        return legal[0]


class UniformRandom(Strategy):
    def probs(self, obs, legal):
        return {a: 1.0 / len(legal) for a in legal}


# ---------------------------------------------------------------------------------- reasoning
def explain_reactive(name: str, action: str, obs: dict[str, Any], kind: str, hard: str) -> Explained:
    """The case of a reactive demonstrator's decision (`name` as `matrix` calls it: TFT, GenerousTFT, Grim,
    AlwaysHard, AlwaysKind; a game's ALIASES map its own names onto these) and the action its rule implies."""
    hist = obs["history"]
    if name == "AlwaysHard":
        return "always_hard", {}, hard
    if name == "AlwaysKind":
        return "always_kind", {}, kind
    if not hist and name in ("TFT", "GenerousTFT", "Grim"):
        return "open", {}, kind
    last = hist[-1]["opp"] if hist else None
    if name == "Grim":
        first = next((i for i, h in enumerate(hist) if h["opp"] == hard), None)
        if first is None:
            return "trust", {}, kind
        return "punish", {"first": first + 1}, hard
    if name == "TFT":
        return ("reciprocate", {"r": len(hist)}, kind) if last == kind else ("retaliate", {"r": len(hist)}, hard)
    if name == "GenerousTFT":
        if last == kind:
            return "reciprocate", {"r": len(hist)}, kind
        return ("forgive" if action == kind else "retaliate"), {"r": len(hist)}, None
    return "generic", {"verb": action.lower()}, None
