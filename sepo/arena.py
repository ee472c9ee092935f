"""Plays many episodes in lockstep: one batched call per policy per decision point.

Every episode against every opponent advances together. A scripted opponent's moves are computed at
once (they are cheap); whenever an episode needs a policy (the agent, or an opponent that is itself a
`Policy`: a second language model), it waits, and when every live episode is waiting, each policy
answers all the requests addressed to it in a single `act_batch` call. For a language model that is one
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
    #: the same for an opponent that is a `Policy` (a learned exploiter in training); empty for a scripted one
    opponent_trace: list[tuple[int, DecisionRequest, Decision]] = field(default_factory=list)
    opponent_decisions: int = 0
    opponent_parsed: int = 0

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


#: what sits in the opponent's seat: a scripted strategy (answered inline) or any policy (asked in batches)
Opponent = Strategy | Policy


@dataclass(frozen=True)
class Match:
    """One episode to play: opponent `name` (played by `opponent`), episode index `index`.

    `tag` names an independent family of random streams: each SEPO group has its own, so adding or
    removing groups never changes the others' episodes for the same seed. By default episode k gets
    deal k (its chance events), the agent stream k and the opponent stream k; `deal`, `agent_stream` and
    `opponent_stream` override them, so that the rollouts of a SEPO group share their deal and the
    opponent's coin flips and differ only by the agent's sampling (an exploiter's group: the deal and the
    victim's draws, in the agent's seat). `mirror` overrides the seat swap of mirrored games (a group
    shares its seats too).
    """

    name: str
    opponent: Opponent
    index: int
    tag: str = ""
    deal: int | None = None
    agent_stream: int | None = None
    opponent_stream: int | None = None
    mirror: bool | None = None


@dataclass
class _Live:
    record: EpisodeRecord
    state: GameState
    opponent: Opponent
    agent_rng: np.random.Generator
    opp_rng: np.random.Generator

    @property
    def scripted_opponent(self) -> bool:
        return isinstance(self.opponent, Strategy)

    def rng(self, seat: int) -> np.random.Generator:
        return self.agent_rng if seat == AGENT else self.opp_rng


@dataclass
class _Ask:
    """One seat of one episode waiting for its policy, and the actions of that turn chosen so far."""

    ep: _Live
    actions: dict[int, str]
    request: DecisionRequest


def play(
    game: Game,
    agent: Policy,
    opponents: dict[str, Opponent],
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
    matches = [Match(name, opponent, k) for name, opponent in opponents.items() for k in range(episodes)]
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
        agent_stream = m.index if m.agent_stream is None else m.agent_stream
        opponent_stream = m.index if m.opponent_stream is None else m.opponent_stream
        s = episode_seed(seed, deal, m.tag)
        live.append(
            _Live(
                record=EpisodeRecord(opponent=m.name, index=m.index, seed=s, mirror=mirror),
                state=game.reset(s, mirror=mirror),
                opponent=m.opponent,
                agent_rng=_stream(seed, agent_stream, m.name, AGENT, m.tag),
                opp_rng=_stream(seed, opponent_stream, m.name, OPPONENT, m.tag),
            )
        )
    records = [ep.record for ep in live]
    opponent_policies = {id(ep.opponent): ep.opponent for ep in live if not ep.scripted_opponent}

    while live:
        asks = [ask for ep in live for ask in _asks(game, ep)]
        for ask, decision in _answer(agent, [a for a in asks if a.request.player == AGENT]):
            _record(ask, decision, keep_trace)
        for policy in opponent_policies.values():
            addressed = [a for a in asks if a.request.player == OPPONENT and a.ep.opponent is policy]
            for ask, decision in _answer(policy, addressed):
                _record(ask, decision, keep_trace)
        for ask in {id(a.ep): a for a in asks}.values():  # each waiting episode steps once, with every seat's action
            game.step(ask.ep.state, ask.actions)
        still = []
        for ep in live:
            if game.is_over(ep.state):
                ep.record.rounds = ep.state.rounds
                if on_episode_done:
                    on_episode_done(ep.record)
            else:
                still.append(ep)
        live = still
    for policy in (agent, *opponent_policies.values()):
        episodes_over = getattr(policy, "episodes_over", None)  # optional: a policy that keeps per-episode state
        if episodes_over is not None:
            episodes_over()
    return records


def _asks(game: Game, ep: _Live) -> list[_Ask]:
    """The requests of an episode's next turn that waits on a policy (none once it is over); the seats of that
    turn share one dict of actions, which already holds a scripted opponent's move."""
    pending = _advance_scripted_turns(game, ep)
    if pending is None:
        return []
    actions, seats = pending
    return [
        _Ask(ep, actions, DecisionRequest(game, ep.state, seat, game.legal_actions(ep.state, seat), ep.rng(seat)))
        for seat in seats
    ]


def _answer(policy: Policy, asks: list[_Ask]) -> list[tuple[_Ask, Decision]]:
    """One batched call of `policy` for every request addressed to it; an illegal answer is a bug of the policy."""
    if not asks:
        return []
    decisions = policy.act_batch([a.request for a in asks])
    for ask, decision in zip(asks, decisions):
        if decision.action not in ask.request.legal:
            raise ValueError(f"policy {policy.name} returned illegal action {decision.action!r}")
    return list(zip(asks, decisions))


def _record(ask: _Ask, decision: Decision, keep_trace: bool) -> None:
    record, seat = ask.ep.record, ask.request.player
    if seat == AGENT:
        record.decisions += 1
        record.parsed += int(decision.parsed)
    else:
        record.opponent_decisions += 1
        record.opponent_parsed += int(decision.parsed)
    if keep_trace:
        trace = record.trace if seat == AGENT else record.opponent_trace
        trace.append((ask.ep.state.round_index, ask.request, decision))
    ask.actions[seat] = decision.action


def _advance_scripted_turns(game: Game, ep: _Live) -> tuple[dict[int, str], list[int]] | None:
    """Play the turns that only a scripted opponent moves in; return the next turn that waits on a policy:
    the actions chosen so far and the seats that wait.

    Returns None once the episode is over. When both move simultaneously, a scripted opponent's action is
    already in the returned dict (chosen from an observation that excludes the agent's current move, so it
    cannot peek); a policy opponent is asked at the same state, so it cannot peek either.
    """
    while not game.is_over(ep.state):
        movers = game.to_act(ep.state)
        actions: dict[int, str] = {}
        if OPPONENT in movers and ep.scripted_opponent:
            obs = game.observation(ep.state, OPPONENT)
            actions[OPPONENT] = ep.opponent.act(obs, game.legal_actions(ep.state, OPPONENT), ep.opp_rng)
        waiting = [seat for seat in (AGENT, OPPONENT) if seat in movers and seat not in actions]
        if waiting:
            return actions, waiting
        game.step(ep.state, actions)
    return None
