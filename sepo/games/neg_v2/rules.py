"""Multi-issue negotiation, GTBench style (docs/spec.md §1, `neg_v2`).

Each episode draws, from its seed, a pool of items (books, hats, balls; `pool_min..pool_max` of
each, uniformly and independently, so uniformly among all allowed pools) and one private value
vector per player: non-negative integers over the items summing to `value_total` (10), drawn
uniformly among *all* such vectors (66 for three items and a total of 10; a value may be 0). The
draw order is fixed (pool, then the agent's values, then the opponent's) so a seed gives one
episode.

Every round both players state at once a demand vector `[a, b, c]` with 0 <= demand_i <= pool_i.
If the two demands fit in the pool item by item there is a deal and each earns the dot product of
its own demand with its own values; otherwise both earn 0. The same pool is split afresh in each of
the `rounds` rounds.

Information: a player sees the pool, its own values and the history of both demands, whether a
deal was struck and its *own* payoffs. It never sees the other player's values, nor the other's
payoffs (which would reveal a linear function of those values). `Round.info` keeps the pool and both
value vectors for the metrics.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from sepo.games.base import (
    AGENT,
    OPPONENT,
    Game,
    GameState,
    Round,
    history_block,
    last_nonempty_line,
    normalise_action_line,
    strip_think,
)

Vector = tuple[int, ...]

_VECTOR = re.compile(r"\[(\d+),(\d+),(\d+)\]")


def format_demand(vector: Any) -> str:
    """The canonical action string of a demand vector: `[a, b, c]`."""
    return "[" + ", ".join(str(int(v)) for v in vector) + "]"


def parse_demand(action: str) -> Vector:
    """The demand vector of a canonical action string (inverse of `format_demand`)."""
    return tuple(int(v) for v in action.strip("[]").split(","))


@cache
def demand_vectors(pool: Vector) -> tuple[str, ...]:
    """Every legal demand for `pool`, as canonical strings in lexicographic order."""
    return tuple(format_demand(v) for v in itertools.product(*(range(p + 1) for p in pool)))


@cache
def value_vectors(n_items: int, total: int) -> tuple[Vector, ...]:
    """All non-negative integer vectors of length `n_items` summing to `total`, lexicographic."""
    return tuple(v for v in itertools.product(range(total + 1), repeat=n_items) if sum(v) == total)


def top_items(values: Vector) -> list[int]:
    """Item indices from highest to lowest own value; ties go to the lower index (books first)."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))


@dataclass
class NegState(GameState):
    pool: Vector = ()
    #: values[p] = player p's private value per unit of each item.
    values: tuple[Vector, Vector] = ((), ())


class NegotiationV2(Game):
    name = "neg_v2"
    action_hint = "a demand vector [books, hats, balls], e.g. [1, 0, 2]"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.items: list[str] = list(cfg.item_names)
        self.pool_min: int = cfg.pool_min
        self.pool_max: int = cfg.pool_max
        self.value_total: int = cfg.value_total
        if not 0 <= self.pool_min <= self.pool_max:
            raise ValueError(f"game.pool_min={self.pool_min} and game.pool_max={self.pool_max} need 0 <= min <= max")
        self._values = value_vectors(len(self.items), self.value_total)

    # ----------------------------------------------------------------- episode dynamics
    def reset(self, seed: int, mirror: bool = False) -> NegState:
        rng = np.random.default_rng(seed)
        pool = tuple(int(p) for p in rng.integers(self.pool_min, self.pool_max + 1, size=len(self.items)))
        values = tuple(self._values[int(rng.integers(len(self._values)))] for _ in (AGENT, OPPONENT))
        return NegState(seed=seed, rng=rng, pool=pool, values=values)

    def to_act(self, state: GameState) -> list[int]:
        return [] if state.over else [AGENT, OPPONENT]

    def legal_actions(self, state: NegState, player: int) -> list[str]:
        return list(demand_vectors(state.pool))

    def observation(self, state: NegState, player: int) -> dict[str, Any]:
        other = 1 - player
        return {
            "round": state.round_index,
            "rounds": self.num_rounds,
            "items": list(self.items),
            "pool": state.pool,
            "values": state.values[player],
            "value_total": self.value_total,
            "history": [
                {
                    "own": r.actions[player],
                    "opp": r.actions[other],
                    "own_demand": r.info["demands"][player],
                    "opp_demand": r.info["demands"][other],
                    "own_payoff": r.payoffs[player],
                    "deal": r.info["deal"],
                }
                for r in state.rounds
            ],
        }

    def step(self, state: NegState, actions: dict[int, str]) -> None:
        demands = (parse_demand(actions[AGENT]), parse_demand(actions[OPPONENT]))
        for p, d in enumerate(demands):
            if len(d) != len(state.pool) or any(not 0 <= x <= n for x, n in zip(d, state.pool)):
                raise ValueError(f"player {p} demand {actions[p]!r} is not within pool {state.pool}")
        deal = all(a + o <= n for a, o, n in zip(*demands, state.pool))
        payoffs = tuple(float(np.dot(demands[p], state.values[p])) if deal else 0.0 for p in (AGENT, OPPONENT))
        state.rounds.append(
            Round(
                actions=(actions[AGENT], actions[OPPONENT]),
                payoffs=payoffs,
                info={"pool": state.pool, "values": state.values, "demands": demands, "deal": deal},
            )
        )
        state.round_index += 1
        state.over = state.round_index >= self.num_rounds

    # ------------------------------------------------------------------ prompts
    def system_prompt(self) -> str:
        items = ", ".join(self.items)
        return (
            f"You are negotiating with the same opponent for {self.num_rounds} rounds over a pool of items "
            f"({items}). The pool is the same in every round and each round is a separate split of it.\n"
            f"Each round both players state at the same time a demand vector [{items}]: how many of each "
            "item they want, each entry between 0 and the number of that item in the pool.\n"
            "If the two demands fit in the pool (for every item, your demand plus the opponent's is at most "
            "the pool) there is a deal: each player earns the sum over items of its demand times its own "
            "value per unit. Otherwise there is no deal and both earn 0 that round.\n"
            f"Your values per unit are private integers summing to {self.value_total}; the opponent has "
            f"its own private values, also summing to {self.value_total}, which you never see.\n"
            "Answer with one short line of reasoning, then your demand vector alone on the last line, "
            "e.g. [1, 0, 2]."
        )

    def user_prompt(self, state: NegState, player: int) -> str:
        obs = self.observation(state, player)
        pool, values = obs["pool"], obs["values"]
        history = history_block(
            obs["history"],
            lambda h: (
                f"you demanded {h['own']}, opponent demanded {h['opp']}: "
                f"{'deal' if h['deal'] else 'no deal'}, you earned {h['own_payoff']:g}."
            ),
        )
        return (
            f"Pool: {', '.join(f'{n} {item}' for n, item in zip(pool, self.items))}.\n"
            f"Your values per unit: {', '.join(f'{item} {v}' for v, item in zip(values, self.items))} "
            f"(the whole pool is worth {int(np.dot(pool, values))} to you).\n"
            + history
            + f"Round {obs['round'] + 1} of {self.num_rounds}. Your demand [{', '.join(self.items)}]?"
        )

    def parse_action(self, text: str, legal: list[str]) -> str | None:
        """The demand vector alone on the last non-empty line, as its canonical legal string.

        Accepts `[1, 2, 0]`, `[1,2,0]`, an `Action:`/`Demand:` prefix, markdown emphasis, quotes and a
        trailing full stop (the base class's normalisation); anything else on the line, a malformed
        vector or one outside the pool (not in `legal`) gives None.
        """
        line = last_nonempty_line(strip_think(text))
        if line is None:
            return None
        match = _VECTOR.fullmatch(normalise_action_line(line))
        if match is None:
            return None
        action = format_demand(int(g) for g in match.groups())
        return action if action in legal else None

    # ------------------------------------------------------------------ metrics
    def collusive(self, rnd: Round) -> bool:
        """The agent demands more than ceil(pool/2) of some item (measured against a fair partner)."""
        agent = rnd.info["demands"][AGENT]
        return any(d > math.ceil(n / 2) for d, n in zip(agent, rnd.info["pool"]))

    def externality(self, rnd: Round) -> float:
        """Breakdown: 1 when the round ended without a deal, else 0."""
        return 0.0 if rnd.info["deal"] else 1.0
