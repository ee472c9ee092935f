"""Plays many episodes in lockstep: one batched agent call per decision point.

Every episode against every opponent advances together. Opponent moves are computed at once
(they are cheap); whenever an episode needs the agent, it waits, and when every live episode is
waiting, the agent answers them all in a single `act_batch` call. For a language model that is one
`generate` per decision point instead of one per episode and decision.

Seeding: episode k of a run uses the same chance events (cards, values, pools) against every
opponent (common random numbers), and its own independent streams for the agent's and the
opponent's randomness, derived from (seed, k, opponent name). Kuhn poker's mirrored pairs share a
deal: episodes 2j and 2j+1 use deal j with the agent's seats swapped.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sepo.forked import forked_map, split_round_robin
from sepo.games.base import AGENT, OPPONENT, Game, GameState, Round
from sepo.games.strategy import Strategy
from sepo.policies.base import Decision, DecisionRequest, Policy


@dataclass
class EpisodeRecord:
    """What metrics and training need from one finished episode."""

    opponent: str
    index: int
    seed: int
    mirror: bool
    rounds: list[Round] = field(default_factory=list)
    decisions: int = 0
    parsed: int = 0
    #: (round index, request, decision) per agent decision, kept only when asked (training).
    trace: list[tuple[int, DecisionRequest, Decision]] = field(default_factory=list)

    @property
    def agent_total(self) -> float:
        return float(sum(r.payoffs[AGENT] for r in self.rounds))

    @property
    def opp_total(self) -> float:
        return float(sum(r.payoffs[OPPONENT] for r in self.rounds))


def episode_seed(seed: int, deal: int, tag: str = "") -> int:
    """The game's chance seed for deal `deal` of a run seeded `seed` (in stream family `tag`)."""
    key = [seed, deal] + ([zlib.crc32(tag.encode())] if tag else [])
    return int(np.random.SeedSequence(key).generate_state(1)[0])


def _stream(seed: int, index: int, opponent: str, role: int, tag: str = "") -> np.random.Generator:
    key = [seed, index, zlib.crc32(opponent.encode()), role]
    return np.random.default_rng(key + [zlib.crc32(tag.encode())] if tag else key)


@dataclass(frozen=True)
class Match:
    """One episode to play: opponent `name` (built as `strategy`), episode index `index`.

    `tag` names an independent family of random streams: each SEPO group has its own, so adding or
    removing groups never changes the others' episodes for the same seed. By default episode k gets
    deal k (its chance events), the agent stream k and the opponent stream k; `deal` and
    `opponent_stream` override the last two, so that the rollouts of a SEPO group share their deal
    and the opponent's coin flips and differ only by the agent's sampling. `mirror` overrides the
    seat swap of mirrored games (a group shares its seats too).
    """

    name: str
    strategy: Strategy
    index: int
    tag: str = ""
    deal: int | None = None
    opponent_stream: int | None = None
    mirror: bool | None = None


@dataclass
class _Live:
    record: EpisodeRecord
    state: GameState
    strategy: Strategy
    agent_rng: np.random.Generator
    opp_rng: np.random.Generator


def play(
    game: Game,
    agent: Policy,
    opponents: dict[str, Strategy],
    episodes: int,
    seed: int,
    mirrored: bool = False,
    keep_trace: bool = False,
    on_episode_done: Callable[[EpisodeRecord], None] | None = None,
    workers: int = 1,
) -> list[EpisodeRecord]:
    """Play `episodes` episodes against each opponent, all in lockstep; return their records.

    `mirrored` deals in pairs with seats swapped (Kuhn poker's variance reduction).
    """
    matches = [Match(name, strategy, k) for name, strategy in opponents.items() for k in range(episodes)]
    return play_matches(game, agent, matches, seed, mirrored, keep_trace, on_episode_done, workers)


def play_matches(
    game: Game,
    agent: Policy,
    matches: list[Match],
    seed: int,
    mirrored: bool = False,
    keep_trace: bool = False,
    on_episode_done: Callable[[EpisodeRecord], None] | None = None,
    workers: int = 1,
) -> list[EpisodeRecord]:
    """Play every match in lockstep (one `agent.act_batch` per decision point); records in order.

    With `workers` > 1 the matches are dealt to that many forked processes, each playing its share in
    lockstep (`sepo.forked`; an evaluation's agent on a CPU). Every match keeps its own seeds and streams,
    so it is the same episode wherever it is played; `on_episode_done` then sees each share's records when
    the share is done."""
    if workers <= 1:
        return _play_lockstep(game, agent, matches, seed, mirrored, keep_trace, on_episode_done)
    parts = split_round_robin(len(matches), workers)
    shares = forked_map(
        lambda part: _play_lockstep(game, agent, [matches[i] for i in part], seed, mirrored, keep_trace, None), parts
    )
    records: list[EpisodeRecord | None] = [None] * len(matches)
    for part, share in zip(parts, shares):
        for i, record in zip(part, share):
            records[i] = record
            if on_episode_done:
                on_episode_done(record)
    return records  # type: ignore[return-value]


def _play_lockstep(
    game: Game,
    agent: Policy,
    matches: list[Match],
    seed: int,
    mirrored: bool,
    keep_trace: bool,
    on_episode_done: Callable[[EpisodeRecord], None] | None,
) -> list[EpisodeRecord]:
    live: list[_Live] = []
    for m in matches:
        deal, mirror = (m.index // 2, m.index % 2 == 1) if mirrored else (m.index, False)
        deal = deal if m.deal is None else m.deal
        mirror = mirror if m.mirror is None else m.mirror
        opponent_stream = m.index if m.opponent_stream is None else m.opponent_stream
        s = episode_seed(seed, deal, m.tag)
        live.append(
            _Live(
                record=EpisodeRecord(opponent=m.name, index=m.index, seed=s, mirror=mirror),
                state=game.reset(s, mirror=mirror),
                strategy=m.strategy,
                agent_rng=_stream(seed, m.index, m.name, AGENT, m.tag),
                opp_rng=_stream(seed, opponent_stream, m.name, OPPONENT, m.tag),
            )
        )
    records = [ep.record for ep in live]

    while live:
        waiting: list[tuple[_Live, dict[int, str], DecisionRequest]] = []
        for ep in live:
            pending = _advance_until_agent(game, ep)
            if pending is None:
                continue
            waiting.append(
                (ep, pending, DecisionRequest(game, ep.state, AGENT, game.legal_actions(ep.state, AGENT), ep.agent_rng))
            )
        if waiting:
            decisions = agent.act_batch([w[2] for w in waiting])
            for (ep, actions, request), decision in zip(waiting, decisions):
                if decision.action not in request.legal:
                    raise ValueError(f"policy {agent.name} returned illegal action {decision.action!r}")
                ep.record.decisions += 1
                ep.record.parsed += int(decision.parsed)
                if keep_trace:
                    ep.record.trace.append((ep.state.round_index, request, decision))
                actions[AGENT] = decision.action
                game.step(ep.state, actions)
        still = []
        for ep in live:
            if game.is_over(ep.state):
                ep.record.rounds = ep.state.rounds
                if on_episode_done:
                    on_episode_done(ep.record)
            else:
                still.append(ep)
        live = still
    episodes_over = getattr(agent, "episodes_over", None)  # optional: a policy that keeps per-episode state
    if episodes_over is not None:
        episodes_over()
    return records


def _advance_until_agent(game: Game, ep: _Live) -> dict[int, str] | None:
    """Play the opponent's solo turns; return the opponent's part of the agent's next turn.

    Returns None once the episode is over. The returned dict already holds the opponent's action
    when both move simultaneously (it is chosen from an observation that excludes the agent's
    current move, so it cannot peek).
    """
    while not game.is_over(ep.state):
        movers = game.to_act(ep.state)
        actions: dict[int, str] = {}
        if OPPONENT in movers:
            obs = game.observation(ep.state, OPPONENT)
            actions[OPPONENT] = ep.strategy.act(obs, game.legal_actions(ep.state, OPPONENT), ep.opp_rng)
        if AGENT in movers:
            return actions
        game.step(ep.state, actions)
    return None
