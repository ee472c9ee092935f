"""Rollout batches (docs/spec.md §4.2 step 1): which groups are played, and how their episodes are seeded."""

from __future__ import annotations

import pytest

from sepo.games import make_game
from sepo.games.strategy import make_strategy
from sepo.policies import ScriptedPolicy
from sepo.training.objective import EstimatorState, sepo_settings
from sepo.training.rollouts import BatchBuilder


def build(compose_cfg, *overrides):
    cfg = compose_cfg(*overrides)
    return cfg, BatchBuilder(cfg, sepo_settings(cfg)), make_game(cfg.game)


def test_pooled_batches_hold_a_group_per_opponent_of_each_trained_pool(compose_cfg):
    cfg, builder, _ = build(compose_cfg, "game=ipd")
    plan = builder.plan(0)
    assert [(g.pool, g.opponent) for g in plan.groups] == [
        ("train", "TFT"),
        ("train", "GenerousTFT"),
        ("train", "Mixed"),
        ("train", "Grim"),
        ("exploit", "AlwaysD"),
        ("exploit", "AltD"),
        ("collusive", "AlwaysC"),
    ]
    assert all(len(g.matches) == 4 for g in plan.groups)  # n = 4 by default
    assert len(plan.matches) == 7 * 4
    _, paper, _ = build(compose_cfg, "game=ipd", "sepo.penalty_mode=per_rollout")
    paper_plan = paper.plan(0)
    assert [g.pool for g in paper_plan.groups] == ["train"] * 4  # the paper trains on the train pool only
    assert len(paper_plan.matches) == 4 * 4 + 4 * 4 * 3  # plus one auxiliary episode per rollout and aux opponent


@pytest.mark.parametrize(
    "game, agent, opponents",
    [
        ("ipd", "TFT", ["game.pools.train=[Random,Mixed]", "game.pools.exploit=[Random]"]),
        ("kuhn", "TightP", ["game.pools.train=[NashApx,RandomLegal]", "game.pools.exploit=[NashApx]"]),
    ],
)
def test_a_group_shares_chance_events_seats_and_the_opponents_coin_flips(compose_cfg, game, agent, opponents):
    """A deterministic agent against random opponents: a group's n rollouts are identical episodes,
    because they share the deal, the seats and the opponent's random stream; groups and batches differ."""
    cfg, builder, g = build(compose_cfg, f"game={game}", *opponents)
    policy = ScriptedPolicy(make_strategy(cfg.game, agent))
    batches = [builder.collect(g, policy, b, EstimatorState()) for b in (0, 1)]
    for batch in batches:
        for group in batch.groups:
            first = group.records[0]
            for other in group.records[1:]:
                assert (other.seed, other.mirror) == (first.seed, first.mirror)
                assert [r.actions for r in other.rounds] == [r.actions for r in first.rounds]
                assert [r.info for r in other.rounds] == [r.info for r in first.rounds]
            assert (group.advantages == 0).all()  # identical rollouts: nothing to compare
    seeds = [grp.records[0].seed for batch in batches for grp in batch.groups]
    assert len(set(seeds)) == len(seeds)  # fresh chance events for every group of every batch
    if game == "kuhn":
        assert len({grp.records[0].mirror for batch in batches for grp in batch.groups}) == 2  # both seat orders occur


def test_rollouts_of_a_group_differ_only_by_the_agents_sampling(compose_cfg):
    from benchmarks.estimator.finite_differences import make_agent

    cfg, builder, g = build(compose_cfg, "game=ipd")
    batch = builder.collect(g, make_agent("constant", (0.5,)), 0, EstimatorState())
    tft = batch.groups[0]
    agent_moves = [[r.actions[0] for r in ep.rounds] for ep in tft.records]
    assert len({tuple(m) for m in agent_moves}) > 1
    for ep, moves in zip(tft.records, agent_moves):  # and TFT answered each rollout's own moves
        assert [r.actions[1] for r in ep.rounds] == ["COOPERATE"] + moves[:-1]


def test_a_pool_can_have_rollouts_of_its_own_count(compose_cfg):
    """`sepo.rollouts_by_pool`: the named pools' groups get their own n, the rest keep rollouts_per_opponent, and
    each group's weight divides by its own n (every pool's term stays a mean over its rollouts)."""
    from sepo.run.model_fit import episodes_at_once

    cfg, builder, g = build(compose_cfg, "game=ipd", "sepo.rollouts_by_pool={collusive:10}")
    plan = builder.plan(0)
    assert [len(grp.matches) for grp in plan.groups] == [4, 4, 4, 4, 4, 4, 10]
    assert len(plan.matches) == 6 * 4 + 10
    assert episodes_at_once(cfg)["sepo.rollouts_per_opponent"] == 6 * 4 + 10  # what the memory check sizes
    batch = builder.collect(g, ScriptedPolicy(make_strategy(cfg.game, "TFT")), 0, EstimatorState())
    T = g.num_rounds
    assert [grp.weight for grp in batch.groups] == pytest.approx(
        [1 / (4 * 4 * T)] * 4 + [1 / (2 * 4 * T)] * 2 + [1 / (10 * T)]
    )


def test_rollouts_per_opponent_below_two_is_a_config_error(compose_cfg):
    from sepo.errors import ConfigError
    from sepo.run.config import validate

    with pytest.raises(ConfigError, match=r"sepo.rollouts_per_opponent=1 is not allowed; allowed: an integer >= 2 \("):
        validate(compose_cfg("stage=sepo", "sepo.rollouts_per_opponent=1"))
    for override in ("+sepo.rollouts_by_pool.robust=8", "sepo.rollouts_by_pool.collusive=1"):
        with pytest.raises(
            ConfigError, match=r"sepo.rollouts_by_pool=.* is not allowed; allowed: a mapping from pools"
        ):
            validate(compose_cfg("stage=sepo", override))
    for key, value in (("penalty_mode", "per_episode"), ("credit", "episode"), ("adv_norm", "group")):
        with pytest.raises(ConfigError, match=f"sepo.{key}={value} is not allowed; allowed: "):
            validate(compose_cfg("stage=sepo", f"sepo.{key}={value}"))


def test_the_best_responders_episodes_are_an_exploit_group_with_the_exploit_term_on(compose_cfg, tmp_path):
    """Kuhn's default exploit pool holds BestResponse: its group is played and trained like any exploit
    opponent, and against a scripted LooseA (exploitability 1/4) its advantage is 2 x 1/4 per hand
    (adv = opponent's chips - agent's chips), so the max(0, .) switch stays on."""
    import numpy as np

    from sepo import penalties
    from sepo.games.kuhn import exact as K
    from sepo.stages.sepo_loop import best_response_schedule

    cfg, builder, g = build(
        compose_cfg,
        "game=kuhn",
        "sepo.rollouts_per_opponent=2",
        "sepo.best_response_every=3",
        "sepo.best_response_samples=2",
    )
    agent = ScriptedPolicy(make_strategy(cfg.game, "LooseA"))
    schedule = best_response_schedule(builder, sepo_settings(cfg))
    assert [type(r).__name__ for r in schedule.responders] == ["BestResponse"]
    assert schedule.due(0)
    cost = schedule.refresh(g, agent, 0)
    assert cost["best_response/exploit_exact"] == 0.25
    assert cost["best_response/decisions_sampled"] == 12  # a scripted table is known exactly: one row a state
    assert cost["best_response/bet_or_call/1b"] == 1.0
    assert cost["best_response/bet_or_call/0b"] == 0.0  # LooseA
    assert not schedule.due(2)
    assert schedule.due(3)

    state, advs = EstimatorState(), []
    for b in range(100):
        batch = builder.collect(g, agent, b, state)
        (group,) = [grp for grp in batch.groups if grp.opponent == "BestResponse"]
        assert group.pool == "exploit"
        assert group.hinge_on
        assert np.abs(group.terms["e"]).sum() > 0
        assert len(group.records[0].trace) > 0  # trained on
        advs.append(penalties.term("e").rounds(g, group.records).mean())
    se = np.std(advs, ddof=1) / np.sqrt(len(advs))  # batches have independent deals (a group shares one)
    assert abs(np.mean(advs) - 2 * K.exploitability(schedule.responders[0].target)) <= 3 * se

    schedule.save(tmp_path)  # a checkpoint keeps the response, so a resumed run plays the same one
    _, again, _ = build(compose_cfg, "game=kuhn")
    resumed = best_response_schedule(again, sepo_settings(cfg))
    resumed.load(tmp_path)
    assert resumed.step == 0
    assert resumed.responders[0].aggression == schedule.responders[0].aggression
