"""One SEPO rollout batch: which episodes to play, and the advantage of every decision (docs/spec.md §4.2).

`BatchBuilder.collect` = `plan` (the episodes) -> `play_matches` (the arena, all in lockstep: one
agent call per decision point) -> `assemble` (rewards, credit, baseline, weights, scale).
It takes any policy whose `act_batch` answers `DecisionRequest`s, so the language-model loop
(`sepo.stages.sepo_loop`) and the gradient check's parametric agents (`benchmarks.estimator.finite_differences`) build their batches
with the same code.

Groups. `pooled` (default): one group per opponent of the train, exploit and collusive pools (each
name once per pool). The paper's modes (`per_rollout`, `shared`): one group per train opponent, plus
auxiliary episodes against the exploit and collusive pools that are never trained on. A group's n
rollouts share their chance events (deal, cards, values, seats) and the opponent's random stream:
they differ only by the policy's own sampling, so comparing them measures the policy's choices,
not luck (Kuhn poker: the same cards and seat, never a mirrored pair). Every group has its own
stream family (tag), and each batch its own seed, so groups and batches get fresh chance events.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sepo import distributed, penalties
from sepo.arena import EpisodeRecord, Match, episode_seed, play_matches
from sepo.games import Game
from sepo.games.base import AGENT
from sepo.games.strategy import make_strategy
from sepo.metrics import pools_of, term_level_se
from sepo.policies.base import Decision, Policy
from sepo.training.objective import (
    EstimatorState,
    group_advantages,
    paper_terms,
    payoffs,
    pooled_terms,
    term_keys,
)
from sepo.training.options import rollouts_per_group


@dataclass
class GroupPlan:
    pool: str
    opponent: str
    matches: list[int]  # rollout r is matches[r] (an index into BatchPlan.matches)
    #: paper modes: per rollout, {pool: {opp: [match indices]}} for every pool a term is measured on
    aux: list[dict[str, dict[str, list[int]]]] | None = None


@dataclass
class BatchPlan:
    seed: int
    matches: list[Match]
    groups: list[GroupPlan]


@dataclass
class Group:
    """n rollouts against one opponent, and what the estimator made of them."""

    pool: str
    opponent: str
    records: list[EpisodeRecord]
    terms: dict[str, np.ndarray]  # term -> [n, T] per-round rewards f
    weight: float  # 1 / (|pool| * n * T)
    advantages: np.ndarray  # [n, T] A before weight and scale
    term_advantages: dict[str, np.ndarray] = field(default_factory=dict)  # per term (linear modes only)
    hinge_on: bool = True  # a hinged term of its pool is on (`EstimatorState.exploit_on`)


@dataclass
class RolloutBatch:
    groups: list[Group]
    decisions: list[Decision]  # every trained decision, in group, rollout, round order
    advantages: np.ndarray  # [D] what the loss multiplies: weighted and divided by the batch scale
    #: [D] weighted advantages BEFORE the batch scale: "total" and, when adv_norm=batch, each term
    unscaled: dict[str, np.ndarray]
    scale: float  # the divisor used (1.0 with adv_norm=group_round)
    stats: dict[str, float]


def _match_indices(group: GroupPlan) -> list[int]:
    """Every episode a group needs: its rollouts and (paper modes) their auxiliary episodes."""
    aux = {i for tree in group.aux or [] for by in tree.values() for idx in by.values() for i in idx}
    return [*group.matches, *sorted(aux)]


def batch_seed(seed: int, batch_index: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(batch_index)]).generate_state(1)[0])


def seat_swap(seed: int, tag: str, mirrored: bool) -> bool:
    """A group's seat arrangement in a mirrored game: drawn per group, shared by its rollouts."""
    return mirrored and episode_seed(seed, zlib.crc32(b"seats"), tag) % 2 == 1


class BatchBuilder:
    """Builds the rollout batches of one run; reads what it needs from the config once."""

    def __init__(self, cfg: DictConfig, s: DictConfig):
        self.pools = pools_of(cfg.game)
        self.strategies = {n: make_strategy(cfg.game, n, key="game.pools") for p in self.pools.values() for n in p}
        self.seed = s.seed  # the training seed (sepo.seed, default: seed)
        self.mirrored = cfg.game.mirrored
        self.lambdas = dict(cfg.lambdas.train)
        self.reward_scale = s.reward_scale / cfg.game.max_payoff  # s of docs/spec.md §4.1
        self.n, self.aux_episodes = s.rollouts_per_opponent, s.aux_episodes
        self.n_by_pool = rollouts_per_group(s)
        self.mode, self.credit, self.adv_norm = s.penalty_mode, s.credit, s.adv_norm
        self.eps = s.adv_eps

    def collect(self, game: Game, policy: Policy, batch_index: int, state: EstimatorState) -> RolloutBatch:
        """Play one batch and build its advantages.

        Data parallel (`sepo.distributed`): each process plays its share of the groups (with their
        auxiliary episodes); the finished episodes, without their traces, are exchanged, so every
        process assembles the same batch statistics, scale and estimator state, while only its own
        decisions (those with a trace) enter its part of the loss.
        """
        plan = self.plan(batch_index)
        if distributed.world_size() == 1:
            # a language model on a CPU plays its share in forked workers (`model.cpu_workers`, `sepo.forked`)
            workers = int(getattr(policy, "workers", 1))
            played = play_matches(game, policy, plan.matches, plan.seed, keep_trace=True, workers=workers)
            return self.assemble(game, plan, played, state)
        mine = sorted(i for g in distributed.shard(plan.groups) for i in _match_indices(g))
        played = play_matches(game, policy, [plan.matches[i] for i in mine], plan.seed, keep_trace=True)
        records: list[EpisodeRecord | None] = [None] * len(plan.matches)
        for i, record in zip(mine, played):
            records[i] = record
        for share in distributed.all_gather([(i, replace(r, trace=[])) for i, r in zip(mine, played)]):
            for i, record in share:
                if records[i] is None:
                    records[i] = record
        return self.assemble(game, plan, records, state)

    def plan(self, batch_index: int) -> BatchPlan:
        """Every episode of one rollout batch, grouped (see the module docstring)."""
        seed, k = batch_seed(self.seed, batch_index), self.aux_episodes
        matches: list[Match] = []

        def group(pool: str, name: str) -> list[int]:
            tag, n = f"{pool}/{name}", self.n_by_pool[pool]
            mirror = seat_swap(seed, tag, self.mirrored)
            start = len(matches)
            matches.extend(
                Match(name, self.strategies[name], r, tag, deal=0, opponent_stream=0, mirror=mirror) for r in range(n)
            )
            return list(range(start, start + n))

        def aux_episodes(tag: str) -> dict[str, dict[str, list[int]]]:
            tree: dict[str, dict[str, list[int]]] = {}
            for pool in penalties.measured_pools():
                tree[pool] = {}
                for name in self.pools[pool]:
                    start = len(matches)
                    matches.extend(
                        Match(
                            name,
                            self.strategies[name],
                            j,
                            tag,
                            mirror=seat_swap(seed, f"{tag}/{name}/{j}", self.mirrored),
                        )
                        for j in range(k)
                    )
                    tree[pool][name] = list(range(start, start + k))
            return tree

        groups: list[GroupPlan] = []
        for pool in penalties.trained_pools() if self.mode == "pooled" else (penalties.TRAIN_POOL,):
            for name in self.pools[pool]:
                groups.append(GroupPlan(pool, name, group(pool, name)))
        for g in groups:
            if self.mode == "per_rollout":
                g.aux = [aux_episodes(f"aux/{g.opponent}/{r}") for r in range(len(g.matches))]
            elif self.mode == "shared":
                g.aux = [aux_episodes(f"aux/{g.opponent}")] * len(g.matches)
        return BatchPlan(seed, matches, groups)

    def assemble(
        self, game: Game, plan: BatchPlan, records: list[EpisodeRecord], state: EstimatorState
    ) -> RolloutBatch:
        """Rewards, credit, baseline, weights and scale of a played batch; updates `state` afterwards."""
        groups: list[Group] = []
        for gp in plan.groups:
            recs = [records[i] for i in gp.matches]
            hinged = any(term.hinged for term in penalties.of_pool(gp.pool))
            hinge_on = state.exploit_on(gp.opponent) if hinged else True
            if self.mode == "pooled":
                terms = pooled_terms(game, gp.pool, recs, self.reward_scale, self.lambdas, hinge_on)
            else:
                aux = [
                    {p: {q: [records[i] for i in idx] for q, idx in by.items()} for p, by in tree.items()}
                    for tree in gp.aux
                ]
                terms = paper_terms(game, recs, self.reward_scale, self.lambdas, self.mode, aux)
            T = len(recs[0].rounds)
            advantages = lambda f: group_advantages(f, self.credit, self.adv_norm, self.eps)  # noqa: E731
            groups.append(
                Group(
                    gp.pool,
                    gp.opponent,
                    recs,
                    terms,
                    weight=1.0 / (len(self.pools[gp.pool]) * len(recs) * T),
                    advantages=advantages(sum(terms.values())),
                    term_advantages={k: advantages(v) for k, v in terms.items()} if self.adv_norm == "batch" else {},
                    hinge_on=hinge_on,
                )
            )

        batch_std = float(np.concatenate([g.advantages.ravel() for g in groups]).std())
        scale = state.scale_for(batch_std) + self.eps if self.adv_norm == "batch" else 1.0
        state.record_std(batch_std)

        decisions: list[Decision] = []
        keys = [k for k in term_keys() if any(k in g.term_advantages for g in groups)]
        unscaled: dict[str, list[float]] = {"total": [], **{k: [] for k in keys}}
        for g in groups:
            for r, record in enumerate(g.records):
                for round_index, _request, decision in record.trace:
                    decisions.append(decision)
                    unscaled["total"].append(g.weight * g.advantages[r, round_index])
                    for k in keys:
                        term = g.term_advantages.get(k)
                        unscaled[k].append(0.0 if term is None else g.weight * term[r, round_index])
        arrays = {k: np.asarray(v, dtype=float) for k, v in unscaled.items()}

        stats = batch_stats(game, plan, records, groups, self.lambdas, self.reward_scale)
        stats.update(adv_std=batch_std, adv_scale=scale, **advantage_spread(groups, scale))
        if self.mode == "pooled":
            for g in groups:
                for term in penalties.of_pool(g.pool):
                    if term.hinged:
                        stats[f"{term.metric}_on/{g.opponent}"] = float(g.hinge_on)
                        state.record_exploit(g.opponent, term.rounds(game, g.records).mean(axis=1))
        return RolloutBatch(groups, decisions, arrays["total"] / scale, arrays, scale, stats)


def advantage_spread(groups: list[Group], scale: float) -> dict[str, float]:
    """`adv_std/<pool>`: the std of the advantages the loss gives each pool's decisions (weights and batch scale
    included), so a pool whose signal is drowned or dominates shows in the logs."""
    by_pool: dict[str, list[np.ndarray]] = {}
    for g in groups:
        by_pool.setdefault(g.pool, []).append((g.weight * g.advantages / scale).ravel())
    return {f"adv_std/{pool}": float(np.concatenate(parts).std()) for pool, parts in by_pool.items()}


def term_level_stat(key: str) -> str:
    """The batch statistic that reads a penalty term's level (in the term's own units, `<pool>/<key>`): what
    `sepo.held_at_start` compares with the level a held term started at."""
    return f"{penalties.term(key).pool}/{key}"


def term_level_se_stat(key: str) -> str:
    """The batch statistic that holds the standard error of that read (`<pool>/<key>_se`), over the episodes that
    measured it: what `sepo.held_level_z` weighs a rise above the held level against."""
    return term_level_stat(key) + "_se"


def batch_stats(
    game: Game,
    plan: BatchPlan,
    records: list[EpisodeRecord],
    groups: list[Group],
    lambdas: dict[str, float],
    reward_scale: float,
) -> dict[str, Any]:
    """The batch's u and penalty terms (from whichever episodes measure them) and its estimate of J. A term of
    the train pool is a mean over its episodes, as u is; any other, per opponent and then over opponents."""
    train = [ep for g in groups if g.pool == penalties.TRAIN_POOL for ep in g.records]
    by_pool: dict[str, dict[str, list[EpisodeRecord]]] = {pool: {} for pool in penalties.measured_pools()}
    for g in groups:
        if g.pool in by_pool:
            by_pool[g.pool][g.opponent] = g.records
    for gp in plan.groups:
        for tree in {id(t): t for t in (gp.aux or [])}.values():
            for p, by_opp in tree.items():
                for q, idx in by_opp.items():
                    by_pool[p].setdefault(q, []).extend(records[i] for i in idx)
    u = float(payoffs(train, AGENT).mean())
    # a term of the train pool over all its episodes as one group, as u is; any other per opponent
    measured_on = {
        term.key: {penalties.TRAIN_POOL: train} if term.pool == penalties.TRAIN_POOL else by_pool[term.pool]
        for term in penalties.terms()
    }
    levels = {term.key: term.level(game, measured_on[term.key]) for term in penalties.terms()}
    ses = {term.key: term_level_se(game, term, measured_on[term.key]) for term in penalties.terms()}
    objective = reward_scale * u
    for term in penalties.terms():
        objective -= term.weight(lambdas, reward_scale) * levels[term.key]
    decisions = sum(ep.decisions for ep in records)
    return {
        "objective": objective,
        "train/u": u,
        **{term_level_stat(k): level for k, level in levels.items()},
        **{term_level_se_stat(k): se for k, se in ses.items()},
        "parse_rate": sum(ep.parsed for ep in records) / max(decisions, 1),
        "episodes": float(len(records)),
        "decisions": float(sum(ep.decisions for g in groups for ep in g.records)),
    }
