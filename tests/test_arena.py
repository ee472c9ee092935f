"""The arena: lockstep batching, reproducibility and independence from batch composition."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from sepo.arena import play
from sepo.games import make_game
from sepo.games.strategy import get_strategy
from sepo.policies import Decision, ScriptedPolicy

GAME = make_game(OmegaConf.load("conf/game/ipd.yaml"))


class CountingPolicy(ScriptedPolicy):
    def __init__(self, name):
        super().__init__(get_strategy("ipd", name))
        self.batches = []

    def act_batch(self, requests):
        self.batches.append(len(requests))
        return super().act_batch(requests)


def opponents(*names):
    return {n: get_strategy("ipd", n) for n in names}


def test_one_agent_call_per_decision_point_for_all_episodes():
    agent = CountingPolicy("Mixed")
    records = play(GAME, agent, opponents("TFT", "Random", "AltD"), episodes=7, seed=3)
    assert agent.batches == [21] * 8  # 3 opponents x 7 episodes, 8 rounds
    assert all(r.decisions == 8 and r.parsed == 8 for r in records)


def trace(records):
    return [(r.opponent, r.index, [x.actions for x in r.rounds]) for r in records]


def test_same_seed_same_episodes_and_batch_composition_does_not_matter():
    first = play(GAME, ScriptedPolicy(get_strategy("ipd", "Mixed")), opponents("Random", "Mixed"), 5, seed=11)
    again = play(GAME, ScriptedPolicy(get_strategy("ipd", "Mixed")), opponents("Random", "Mixed"), 5, seed=11)
    alone = play(GAME, ScriptedPolicy(get_strategy("ipd", "Mixed")), opponents("Mixed"), 5, seed=11)
    assert trace(first) == trace(again)
    assert [t for t in trace(first) if t[0] == "Mixed"] == trace(alone)
    other = play(GAME, ScriptedPolicy(get_strategy("ipd", "Mixed")), opponents("Random", "Mixed"), 5, seed=12)
    assert trace(first) != trace(other)


def test_trace_keeps_requests_and_decisions_when_asked():
    (record,) = play(GAME, ScriptedPolicy(get_strategy("ipd", "TFT")), opponents("AltD"), 1, seed=0, keep_trace=True)
    assert [t[0] for t in record.trace] == list(range(8))
    round_index, request, decision = record.trace[1]
    assert request.observation["history"][0]["opp"] == "DEFECT"
    assert decision.action == "DEFECT"


def test_tagged_matches_do_not_disturb_untagged_ones():
    from sepo.arena import Match, play_matches

    mixed = get_strategy("ipd", "Mixed")
    agent = ScriptedPolicy(get_strategy("ipd", "Mixed"))
    base = play_matches(GAME, agent, [Match("Mixed", mixed, k) for k in range(3)], seed=5)
    extra = [Match("Mixed", mixed, k, tag="aux") for k in range(3)]
    both = play_matches(GAME, agent, [Match("Mixed", mixed, k) for k in range(3)] + extra, seed=5)
    assert trace(both[:3]) == trace(base)
    assert trace(both[3:]) != trace(base)  # the tagged family has its own streams


def game_of(name):
    cfg = OmegaConf.load(f"conf/game/{name}.yaml")
    return make_game(cfg), cfg


def test_an_opponent_that_is_a_policy_plays_the_very_episodes_of_its_strategy_inline():
    """A policy in the opponent's seat is asked in batches, from the same state and random stream as a scripted
    strategy is asked inline: simultaneous games (IPD; the auction, with private values) and a sequential one dealt
    in seat-swapped pairs (Kuhn) give the same episodes either way."""
    for name, agent_name, opponent_name, mirrored in (
        ("ipd", "Mixed", "Random", False),
        ("kuhn", "NashApx", "LooseA", True),
        ("auction", "Truthful", "Shaded", False),
    ):
        game, cfg = game_of(name)
        agent = ScriptedPolicy(get_strategy(name, agent_name))
        strategy = get_strategy(name, opponent_name)
        inline = play(game, agent, {opponent_name: strategy}, episodes=6, seed=11, mirrored=mirrored)
        asked = CountingOpponent(strategy)
        batched = play(game, agent, {opponent_name: asked}, episodes=6, seed=11, mirrored=mirrored, keep_trace=True)
        assert trace(batched) == trace(inline), name
        assert [r.payoffs for ep in batched for r in ep.rounds] == [r.payoffs for ep in inline for r in ep.rounds]
        assert sum(asked.batches) == sum(ep.opponent_decisions for ep in batched) > 0
        assert max(asked.batches) > 1  # episodes waiting on the opponent are answered together
        assert all(len(ep.opponent_trace) == ep.opponent_decisions for ep in batched)
        assert all(ep.opponent_parsed == ep.opponent_decisions for ep in batched)


def test_an_opponent_policy_that_answers_an_illegal_action_is_an_error():
    class Illegal(ScriptedPolicy):
        def act_batch(self, requests):
            return [Decision("nonsense") for _ in requests]

    with pytest.raises(ValueError, match="illegal action 'nonsense'"):
        play(GAME, ScriptedPolicy(get_strategy("ipd", "TFT")), {"X": Illegal(get_strategy("ipd", "TFT"))}, 1, seed=0)


class CountingOpponent(ScriptedPolicy):
    def __init__(self, strategy):
        super().__init__(strategy)
        self.batches = []

    def act_batch(self, requests):
        self.batches.append(len(requests))
        return super().act_batch(requests)
