"""The penalty terms of SEPO's objective (docs/spec.md §3), one record each.

    J = s*u - sum over terms k of lambda_k * s_k * k,    s_k = s for a term in payoff units, else 1

Each term is a per-round quantity of the agent's own episodes against ONE pool, averaged per opponent and then
over the pool's opponents, so its gradient can only flow through the decisions of those episodes (§4.1). That
is all the code needs to know about a term, and everything that names one loops over `terms()`:

- the training rewards and their advantages (`sepo.training.objective`, `sepo.training.rollouts`);
- the batch statistics and the levels `sepo.held_terms` holds (`sepo.training.rollouts`, `held_terms`);
- the metrics of every results.json and their standard errors (`sepo.metrics`);
- the config: `lambdas.{train,eval}.<key>` (`sepo.run.schema`), their ranges and `sepo.held_terms` (`sepo.run.rules`);
- the tables and summaries (`analysis`).

A new term is one `register(PenaltyTerm(...))` in a module that is imported before the run's config is
composed, plus its lambda in every `conf/lambdas/*.yaml` (docs/spec.md §3 says what each lambda means).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sepo.games.base import AGENT, OPPONENT

if TYPE_CHECKING:
    from sepo.arena import EpisodeRecord
    from sepo.games.base import Game, Round

#: the pool whose episodes also carry the payoff u; a term measured there is averaged over its episodes, as u is
TRAIN_POOL = "train"
#: the pool of the hinged exploit term: the opponents that try to take what the agent gives away (a learned
#: exploiter joins it: `sepo.training.learned_exploiters`)
EXPLOIT_POOL = "exploit"


@dataclass(frozen=True)
class PenaltyTerm:
    key: str  # its lambda (`lambdas.train.<key>`, `lambdas.eval.<key>`), its name in `sepo.held_terms` and the logs
    pool: str  # the pool whose episodes measure it, and (in `pooled` mode) the only ones its gradient flows through
    per_round: Callable[[Game, Round], float]  # its value in one round of one episode
    metric: str  # its name in results.json (`metrics`, `se`) and in the tables
    opponent_field: str  # its name in results.json's `per_opponent` records (the value before any hinge)
    payoff_units: bool = False  # in game payoff units, so J scales it by s as it does u
    #: per opponent max(0, mean): an opponent the agent beats adds nothing (the exploit term); in training its
    #: reward is on only while that opponent's running mean is above 0, the gradient of max(0, .)
    hinged: bool = False
    worst_metric: str | None = None  # also report the largest single opponent's value under this name
    spec: str = ""  # the docs/spec.md section that defines it

    def rounds(self, game: Game, records: Sequence[EpisodeRecord]) -> np.ndarray:
        """[n, T] the term's value in every round of n episodes."""
        return np.array([[self.per_round(game, r) for r in ep.rounds] for ep in records], dtype=float)

    def of_opponent(self, game: Game, records: Sequence[EpisodeRecord]) -> float:
        """Its value against one opponent: the mean over that opponent's rounds, hinged where the term is."""
        value = float(self.rounds(game, records).mean())
        return max(0.0, value) if self.hinged else value

    def level(self, game: Game, records_by_opponent: Mapping[str, Sequence[EpisodeRecord]]) -> float:
        """Its value over a set of episodes: per opponent, then the mean over opponents (0 for none)."""
        if not records_by_opponent:
            return 0.0
        return float(np.mean([self.of_opponent(game, eps) for eps in records_by_opponent.values()]))

    def weight(self, lambdas: Mapping[str, float], scale: float) -> float:
        """Its coefficient in J: lambda, times s for a term in payoff units."""
        weight = lambdas[self.key]
        return weight * scale if self.payoff_units else weight


def _advantage(game: Game, r: Round) -> float:
    """The opponent's payoff minus the agent's: an exploiter's gain from playing this agent."""
    return r.payoffs[OPPONENT] - r.payoffs[AGENT]


def _collusive(game: Game, r: Round) -> float:
    return float(game.collusive(r))


def _externality(game: Game, r: Round) -> Any:
    return game.externality(r)


#: key -> term, in the order J, the metrics and the tables list them
_REGISTRY: dict[str, PenaltyTerm] = {}


def register(term: PenaltyTerm) -> PenaltyTerm:
    """Add a term to J everywhere; its key must be new (an existing key is replaced only by `unregister` first)."""
    if term.key in _REGISTRY or term.key == "u":
        raise ValueError(f"a penalty term named {term.key!r} already exists")
    _REGISTRY[term.key] = term
    return term


def unregister(key: str) -> None:
    _REGISTRY.pop(key)


def terms() -> tuple[PenaltyTerm, ...]:
    return tuple(_REGISTRY.values())


def keys() -> tuple[str, ...]:
    """The terms' lambda keys, in J's order."""
    return tuple(_REGISTRY)


def term(key: str) -> PenaltyTerm:
    return _REGISTRY[key]


def of_pool(pool: str) -> tuple[PenaltyTerm, ...]:
    return tuple(t for t in _REGISTRY.values() if t.pool == pool)


def exploit_term() -> PenaltyTerm:
    """The term the exploit pool measures: what a learned exploiter's advantage is read as."""
    (found,) = of_pool(EXPLOIT_POOL)
    return found


def measured_pools() -> tuple[str, ...]:
    """The pools other than the train pool that some term is measured on, in the terms' order: the pools a
    `pooled` batch also plays (and trains on), and the paper's modes play as auxiliary episodes."""
    return tuple(dict.fromkeys(t.pool for t in _REGISTRY.values() if t.pool != TRAIN_POOL))


def trained_pools() -> tuple[str, ...]:
    """The pools whose episodes a `pooled` batch trains on: the train pool and every pool a term is measured on."""
    return (TRAIN_POOL, *measured_pools())


register(PenaltyTerm("e", EXPLOIT_POOL, _advantage, "exploit", "adv", payoff_units=True, hinged=True,
                     worst_metric="exploit_max", spec="§3 Exploit"))  # fmt: skip
register(PenaltyTerm("c", "collusive", _collusive, "collusion", "collusion", spec="§3 Collusion"))
register(PenaltyTerm("x", TRAIN_POOL, _externality, "ext", "ext", spec="§3 Ext"))
