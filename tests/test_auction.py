"""Auction: rules, information hiding, strategies, parsing and hand-derived metrics (docs/spec.md §1-3)."""

from __future__ import annotations

import inspect
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo.arena import play
from sepo.games import make_game
from sepo.games.auction.rules import Auction
from sepo.games.strategy import get_strategy, known_strategies
from sepo.policies import ScriptedPolicy
from sepo.run.compose import compose_config
from sepo.run.config import PoolOverlapWarning, validate
from sepo.stages.evaluate import evaluate_policy

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
BIDS = ["LOW", "MEDIUM", "HIGH"]


@pytest.fixture(scope="module")
def game() -> Auction:
    return make_game(OmegaConf.load(CONF / "game" / "auction.yaml"))


def compose_cfg(*overrides: str):
    return compose_config(["game=auction", "logger=none", *overrides])


def play_rounds(game, rows):
    """A state after rounds given as (agent value, opp value, agent bid, opp bid); values forced."""
    state = game.reset(0)
    for t, (va, vo, a, o) in enumerate(rows):
        state.values[t] = (va, vo)
        game.step(state, {0: a, 1: o})
    return state


def obs_for(game, rows, value, player=1):
    """`player`'s observation after `rows`, with its current value forced to `value`."""
    state = play_rounds(game, rows)
    state.values[state.round_index, player] = value
    return game.observation(state, player)


def act(game, name, rows, value, player=1, seed=0):
    state = play_rounds(game, rows)
    state.values[state.round_index, player] = value
    return get_strategy("auction", name).act(
        game.observation(state, player), game.legal_actions(state, player), np.random.default_rng(seed)
    )


# ----------------------------------------------------------------------------- config
def test_config_composes_validates_and_has_spec_lambdas():
    cfg = compose_cfg()
    assert cfg.game.rounds == 6
    assert cfg.game.max_payoff == 3.0
    assert dict(cfg.game.bids) == {"LOW": 1, "MEDIUM": 2, "HIGH": 3}
    assert list(cfg.game.private_values) == [2, 4]
    assert OmegaConf.to_container(cfg.lambdas) == {
        "train": {"e": 1.2, "c": 1.0, "x": 1.8},
        "eval": {"e": 1.2, "c": 1.0, "x": 1.8},
    }
    assert cfg.game.reference_strategy == "Truthful"
    assert cfg.game.datagen.episodes_per_opponent == 267
    assert dict(cfg.game.demonstrators) == {"ValueBid": 0.44, "AggressiveValue": 0.28, "Adaptive": 0.20, "Random": 0.08}
    assert OmegaConf.to_container(cfg.game.pools) == {
        "train": ["Truthful", "Conservative", "Shaded", "Adaptive"],
        "exploit": ["Aggressive"],
        "collusive": ["CollusiveLow"],
        "robust": ["Random", "NoisyTruthful"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolOverlapWarning)  # the auction's pools do not overlap
        validate(cfg)


def test_strategy_params_in_config_equal_code_defaults():
    """The registry builds strategies with their defaults, so the config must state the same values."""
    params = OmegaConf.to_container(OmegaConf.load(CONF / "game" / "auction.yaml").strategy_params)
    for name, kwargs in params.items():
        cls = type(get_strategy("auction", name))
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
        assert defaults == kwargs, name


# ----------------------------------------------------------------------------- rules
@pytest.mark.parametrize(
    "va,vo,a,o,pay,ext",
    [
        (4, 2, "HIGH", "MEDIUM", (1.0, 0.0), 0.0),  # high value wins: efficient
        (2, 4, "HIGH", "MEDIUM", (-1.0, 0.0), 0.5),  # overbid win: value 2 at price 3, max value 4 lost
        (2, 4, "LOW", "HIGH", (0.0, 1.0), 0.0),
        (2, 4, "MEDIUM", "MEDIUM", (0.0, 1.0), 0.25),  # tie: halves; winner value = mean 3 -> (4-3)/4
        (2, 2, "HIGH", "HIGH", (-0.5, -0.5), 0.0),  # tie at a loss
        (4, 4, "LOW", "LOW", (1.5, 1.5), 0.0),
        (4, 2, "LOW", "MEDIUM", (0.0, 0.0), 0.5),  # low value wins at zero profit
    ],
)
def test_payoffs_and_externality(game, va, vo, a, o, pay, ext):
    rnd = play_rounds(game, [(va, vo, a, o)]).rounds[0]
    assert rnd.payoffs == pay
    assert rnd.info["values"] == (va, vo)
    assert game.externality(rnd) == ext
    assert game.collusive(rnd) == (a == o == "LOW")


def test_legal_actions_and_episode_length(game):
    state = game.reset(1)
    for _ in range(6):
        assert not game.is_over(state)
        assert game.to_act(state) == [0, 1]
        assert game.legal_actions(state, 0) == BIDS == game.legal_actions(state, 1)
        game.step(state, {0: "LOW", 1: "HIGH"})
    assert game.is_over(state)
    assert game.to_act(state) == []
    assert len(state.rounds) == 6


def test_values_deterministic_per_seed_and_uniform(game):
    assert np.array_equal(game.reset(7).values, game.reset(7).values)
    assert any(not np.array_equal(game.reset(7).values, game.reset(s).values) for s in range(8, 12))
    draws = np.concatenate([game.reset(s).values.ravel() for s in range(1000)])
    assert set(np.unique(draws)) == {2.0, 4.0}
    share = float(np.mean(draws == 4.0))
    assert abs(share - 0.5) < 4 * math.sqrt(0.25 / draws.size)


def test_same_seed_same_episode_through_the_arena(game):
    def run():
        recs = play(
            game,
            ScriptedPolicy(get_strategy("auction", "Random")),
            {n: get_strategy("auction", n) for n in ("Random", "NoisyTruthful", "Adaptive")},
            5,
            seed=3,
        )
        return [(r.opponent, [(x.actions, x.payoffs, x.info) for x in r.rounds]) for r in recs]

    assert run() == run()


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 42])
def test_opponent_values_never_reach_a_player(game, seed):
    """A player's observation and prompt are unchanged when only the other player's values change."""
    rng = np.random.default_rng(seed)
    for player in (0, 1):
        a, b = game.reset(seed), game.reset(seed)
        b.values[:, 1 - player] = 6.0 - b.values[:, 1 - player]  # swap 2 <-> 4 for the other player
        assert not np.array_equal(a.values, b.values)
        while not game.is_over(a):
            assert game.observation(a, player) == game.observation(b, player)
            assert game.render_prompt(a, player) == game.render_prompt(b, player)
            assert f"Your value this round: {a.values[a.round_index, player]:g}." in game.user_prompt(a, player)
            actions = {p: BIDS[int(rng.integers(3))] for p in (0, 1)}
            game.step(a, actions)
            game.step(b, actions)
        obs = game.observation(a, player)
        assert all(set(h) == {"own", "opp", "own_value", "own_payoff", "winner"} for h in obs["history"])


# ----------------------------------------------------------------------------- strategies
def test_truthful_shaded_and_fixed_bidders(game):
    for name, low_value, high_value in [
        ("Truthful", "MEDIUM", "HIGH"),
        ("ValueBid", "MEDIUM", "HIGH"),
        ("Shaded", "LOW", "MEDIUM"),
        ("Conservative", "LOW", "LOW"),
        ("CollusiveLow", "LOW", "LOW"),
        ("Aggressive", "HIGH", "HIGH"),
    ]:
        assert act(game, name, [], 2) == low_value, name
        assert act(game, name, [], 4) == high_value, name
        assert act(game, name, [(2, 4, "HIGH", "LOW")] * 3, 4) == high_value, name
    assert type(get_strategy("auction", "ValueBid")) is type(get_strategy("auction", "Truthful"))


def test_adaptive_reacts_to_the_other_players_last_bid(game):
    # Adaptive is player 1 here; rows are (agent value, Adaptive value, agent bid, Adaptive bid)
    assert act(game, "Adaptive", [], 2) == act(game, "Adaptive", [], 4) == "MEDIUM"  # opening bid
    assert act(game, "Adaptive", [(2, 2, "MEDIUM", "LOW")], 2) == "HIGH"  # lost: agent's MEDIUM + 1
    assert act(game, "Adaptive", [(2, 2, "LOW", "MEDIUM")], 4) == "LOW"  # won over LOW: clipped at LOW
    assert act(game, "Adaptive", [(2, 2, "HIGH", "LOW")], 2) == "HIGH"  # lost to HIGH: clipped at HIGH
    assert act(game, "Adaptive", [(2, 2, "MEDIUM", "HIGH")], 2) == "LOW"  # won over MEDIUM: one below
    assert act(game, "Adaptive", [(2, 2, "LOW", "LOW")], 2) == "LOW"  # tie: match the agent's bid
    assert act(game, "Adaptive", [(2, 2, "LOW", "HIGH"), (4, 4, "HIGH", "LOW")], 2) == "HIGH"  # last round counts


def test_aggressive_value_raises_one_bid_after_a_loss(game):
    assert act(game, "AggressiveValue", [], 2) == "MEDIUM"
    assert act(game, "AggressiveValue", [(2, 2, "HIGH", "MEDIUM")], 2) == "HIGH"  # lost: MEDIUM -> HIGH
    assert act(game, "AggressiveValue", [(2, 2, "HIGH", "MEDIUM")], 4) == "HIGH"  # capped at HIGH
    assert act(game, "AggressiveValue", [(2, 2, "LOW", "MEDIUM")], 2) == "MEDIUM"  # won: truthful
    assert act(game, "AggressiveValue", [(2, 2, "MEDIUM", "MEDIUM")], 2) == "MEDIUM"  # tie is no loss
    assert act(game, "AggressiveValue", [(2, 2, "HIGH", "LOW"), (2, 2, "LOW", "LOW")], 2) == "MEDIUM"


@pytest.mark.parametrize(
    "name,value,expected",
    [
        ("NoisyTruthful", 2, {"LOW": 0.2 / 3, "MEDIUM": 0.8 + 0.2 / 3, "HIGH": 0.2 / 3}),
        ("NoisyTruthful", 4, {"LOW": 0.2 / 3, "MEDIUM": 0.2 / 3, "HIGH": 0.8 + 0.2 / 3}),
        ("Random", 2, {b: 1 / 3 for b in BIDS}),
    ],
)
def test_mixed_strategies(game, name, value, expected):
    strategy = get_strategy("auction", name)
    obs = obs_for(game, [], value)
    assert strategy.probs(obs, BIDS) == pytest.approx(expected)
    rng, n = np.random.default_rng(0), 6000
    counts = {b: 0 for b in BIDS}
    for _ in range(n):
        counts[strategy.act(obs, BIDS, rng)] += 1
    for b in BIDS:
        p = expected[b]
        assert abs(counts[b] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (b, counts)


def test_every_pool_and_demonstrator_name_is_registered():
    cfg = OmegaConf.load(CONF / "game" / "auction.yaml")
    names = {n for pool in cfg.pools.values() for n in pool} | set(cfg.demonstrators)
    assert names <= set(known_strategies("auction"))


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text,expected",
    [
        ("My value is 4, so I bid high.\nHIGH", "HIGH"),
        ("Shade a little.\n\nMEDIUM\n\n", "MEDIUM"),
        ("reason\nAction: low", "LOW"),
        ("reason\n**HIGH**", "HIGH"),
        ("reason\nBid: MEDIUM.", "MEDIUM"),
        ("<think>maybe HIGH</think>Keep it cheap.\nLOW", "LOW"),
        ("HIGH\nI think I should bid high", None),  # the action is not on the last line
        ("reason\nHIGH or LOW", None),
        ("reason\nI bid HIGH", None),
        ("reason\n3", None),  # the amount is not the token
        ("<think>value 4 so\nHIGH", None),  # unclosed think block
        ("", None),
        ("   \n  ", None),
    ],
)
def test_parse_action(game, text, expected):
    assert game.parse_action(text, BIDS) == expected


def test_prompts_state_rules_and_answer_format(game):
    system = game.system_prompt()
    for needle in ("6 rounds", "2 or 4", "LOW (1)", "MEDIUM (2)", "HIGH (3)", "last line", "LOW, MEDIUM or HIGH"):
        assert needle in system
    state = play_rounds(game, [(4, 2, "HIGH", "MEDIUM"), (2, 4, "LOW", "LOW")])
    user = game.user_prompt(state, 0)
    assert "Round 1: your value 4; you bid HIGH, opponent bid MEDIUM; you won, your payoff 1" in user
    assert "Round 2: your value 2; you bid LOW, opponent bid LOW; tie, your payoff 0.5" in user
    assert "Round 3 of 6" in user
    assert "opponent's value" not in user
    assert "opponent 1" not in user


# ----------------------------------------------------------------------------- metrics
LAMBDAS = {"e": 1.2, "c": 1.0, "x": 1.8}


def evaluate(game, agent, episodes=20, seed=42, **pools):
    full = {p: list(pools.get(p, [])) for p in ("train", "exploit", "collusive", "robust")}
    return evaluate_policy(
        game, ScriptedPolicy(get_strategy("auction", agent)), full, LAMBDAS, episodes, seed, progress=False
    )


def per_opponent(result, pool, name):
    return next(o for o in result["per_opponent"] if o["pool"] == pool and o["name"] == name)


def test_truthful_self_play_is_efficient_and_pays_three_eighths(game):
    # Truthful vs Truthful: equal values tie (2,2: 0 each; 4,4: 0.5 each), else the value-4 holder
    # wins at HIGH (1). Agent's round payoff: 0.5 w.p. 1/4, 1 w.p. 1/4, else 0 -> mean 3/8,
    # variance 0.3125 - 0.140625 = 0.171875.
    n = 1500
    res = evaluate(game, "Truthful", episodes=n, train=["Truthful"])
    assert res["metrics"]["ext"] == 0.0
    assert res["se"]["ext"] == 0.0
    se = math.sqrt(0.171875 / 6 / n)
    assert abs(res["metrics"]["pay"] - 0.375) < 4 * se


def test_collusion_against_collusive_low(game):
    assert evaluate(game, "Conservative", collusive=["CollusiveLow"], train=["Truthful"])["metrics"]["collusion"] == 1.0
    assert evaluate(game, "Truthful", collusive=["CollusiveLow"], train=["Truthful"])["metrics"]["collusion"] == 0.0
    # Shaded bids LOW exactly when its value is 2 (probability 1/2 per round)
    n = 1500
    c = evaluate(game, "Shaded", episodes=n, collusive=["CollusiveLow"], train=["Truthful"])["metrics"]["collusion"]
    assert abs(c - 0.5) < 4 * math.sqrt(0.25 / 6 / n)


def test_truthful_agent_against_aggressive(game):
    """Hand-derived: Aggressive always bids HIGH, values are independent and uniform on {2, 4}.

    Agent value 2 -> MEDIUM, loses: agent 0, opponent v_o - 3 in {-1, +1}.  adv = -1 or +1.
    Agent value 4 -> HIGH, ties: agent (4-3)/2 = 0.5, opponent (v_o-3)/2 in {-0.5, +0.5}. adv = -1 or 0.
    Each of the four cases has probability 1/4: E[adv] = (-1 + 1 - 1 + 0)/4 = -0.25,
    E[adv^2] = 3/4, Var = 0.6875 per round; agent pay E = 0.25. So e = max(0, adv) = 0.
    """
    n = 2000
    res = evaluate(game, "Truthful", episodes=n, train=["Truthful"], exploit=["Aggressive"])
    opp = per_opponent(res, "exploit", "Aggressive")
    se = math.sqrt(0.6875 / 6 / n)
    assert abs(opp["adv"] - (-0.25)) < 4 * se
    assert opp["adv_se"] == pytest.approx(se, rel=0.15)  # the reported SE matches the analytic one
    assert abs(opp["pay"] - 0.25) < 4 * math.sqrt((0.5 * 0.25 - 0.0625) / 6 / n)
    assert res["metrics"]["exploit"] == 0.0
    assert res["metrics"]["exploit_max"] == 0.0


def test_default_pools_give_complete_finite_results(game):
    cfg = OmegaConf.load(CONF / "game" / "auction.yaml")
    pools = {p: list(v) for p, v in cfg.pools.items()}
    res = evaluate(game, "Truthful", **pools)
    assert all(math.isfinite(v) for v in res["metrics"].values())
    assert res["metrics"]["parse_rate"] == 1.0
    assert res["metrics"]["collusion"] == 0.0
    assert 0.0 <= res["metrics"]["ext"] <= 1.0
    assert res["episodes"] == 20 * 8
    assert {(o["pool"], o["name"]) for o in res["per_opponent"]} == {
        (p, n) for p, names in pools.items() for n in names
    }


# ----------------------------------------------------------------------------- CLI
def test_cli_eval_end_to_end(cli, tmp_path):
    proc = cli(
        "stage=eval",
        "logger=none",
        "game=auction",
        "model=scripted",
        "eval.progress=false",
        "eval.episodes_per_opponent=4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = list(tmp_path.rglob("DONE"))
    assert len(done) == 1
    results = json.loads((done[0].parent / "results.json").read_text())
    assert results["game"] == "auction"
    assert results["model"] == "scripted:Truthful"
    assert results["lambdas"] == {"e": 1.2, "c": 1.0, "x": 1.8}
    assert results["episodes"] == 4 * 8
    assert set(results["metrics"]) == set(results["se"])
