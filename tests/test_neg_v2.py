"""Negotiation v2 (docs/spec.md §1-3): rules, information hiding, strategies, parsing, metrics, CLI."""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo.arena import episode_seed, play
from sepo.games import AGENT, OPPONENT, make_game
from sepo.games.neg_v2.rules import NegState, format_demand, value_vectors
from sepo.games.strategy import get_strategy, known_strategies
from sepo.policies import ScriptedPolicy
from sepo.stages.evaluate import evaluate_policy

ROOT = Path(__file__).resolve().parent.parent
GAME_CFG = OmegaConf.load(ROOT / "conf/game/neg_v2.yaml")
EVAL_LAMBDAS = dict(OmegaConf.load(ROOT / "conf/lambdas/neg_v2.yaml").eval)


@pytest.fixture(scope="module")
def game():
    return make_game(GAME_CFG)


def state_with(pool, agent_values, opp_values, seed=0) -> NegState:
    return NegState(
        seed=seed, rng=np.random.default_rng(seed), pool=tuple(pool), values=(tuple(agent_values), tuple(opp_values))
    )


def play_rounds(game, state, pairs):
    for agent, opp in pairs:
        game.step(state, {AGENT: format_demand(agent), OPPONENT: format_demand(opp)})
    return state


def strategy_obs(game, pool, values, history=(), other_values=(0, 0, 10)):
    """What a strategy in the opponent seat sees; `history` holds (agent demand, own demand) pairs."""
    state = state_with(pool, other_values, values)
    play_rounds(game, state, history)
    return game.observation(state, OPPONENT)


def act(game, name, obs, rng=None):
    legal = list(game.legal_actions(state_with(obs["pool"], obs["values"], obs["values"]), OPPONENT))
    action = get_strategy("neg_v2", name).act(obs, legal, rng or np.random.default_rng(0))
    assert action in legal
    return action


# ----------------------------------------------------------------------------- rules
def test_config_numbers(game):
    assert (game.num_rounds, game.max_payoff) == (4, 10.0)
    assert game.items == ["books", "hats", "balls"]
    assert (game.pool_min, game.pool_max, game.value_total) == (1, 4, 10)


def test_payoff_deal_and_breakdown(game):
    s = state_with((2, 1, 3), (5, 3, 2), (1, 1, 8))
    play_rounds(
        game,
        s,
        [
            ((1, 1, 0), (1, 0, 3)),  # fits exactly: deal
            ((0, 0, 0), (2, 1, 3)),  # one side takes everything: deal
            ((2, 0, 0), (1, 0, 0)),  # books over-demanded: breakdown
            ((0, 1, 1), (0, 0, 3)),
        ],
    )  # balls over-demanded by one: breakdown
    assert [r.payoffs for r in s.rounds] == [(8.0, 25.0), (0.0, 27.0), (0.0, 0.0), (0.0, 0.0)]
    assert [r.info["deal"] for r in s.rounds] == [True, True, False, False]
    assert [game.externality(r) for r in s.rounds] == [0.0, 0.0, 1.0, 1.0]
    assert s.over
    assert game.is_over(s)
    assert s.rounds[0].info["values"] == ((5, 3, 2), (1, 1, 8))
    assert s.rounds[0].info["pool"] == (2, 1, 3)


def test_collusive_is_more_than_ceil_half(game):
    s = state_with((3, 4, 1), (4, 3, 3), (4, 3, 3))
    play_rounds(
        game,
        s,
        [
            ((2, 2, 1), (0, 0, 0)),  # ceil of each: not collusive
            ((3, 0, 0), (0, 0, 0)),  # 3 > ceil(3/2) = 2
            ((0, 3, 0), (0, 0, 0)),  # 3 > ceil(4/2) = 2
            ((0, 0, 1), (0, 0, 0)),
        ],
    )  # 1 = ceil(1/2): not collusive
    assert [game.collusive(r) for r in s.rounds] == [False, True, True, False]


def test_legal_actions_enumerate_the_pool(game):
    for seed in range(200):
        s = game.reset(seed)
        legal = game.legal_actions(s, AGENT)
        assert len(legal) == len(set(legal)) == math.prod(n + 1 for n in s.pool) <= 125
        assert legal == game.legal_actions(s, OPPONENT)
        assert legal[0] == "[0, 0, 0]"
        assert legal[-1] == format_demand(s.pool)
        for a in legal:
            v = [int(x) for x in a.strip("[]").split(", ")]
            assert a == format_demand(v)
            assert all(0 <= d <= n for d, n in zip(v, s.pool))
    s = state_with((1, 2, 3), (5, 5, 0), (5, 5, 0))
    with pytest.raises(ValueError):
        game.step(s, {AGENT: "[2, 0, 0]", OPPONENT: "[0, 0, 0]"})


def test_pools_and_values_in_range_and_uniform(game):
    assert len(value_vectors(3, 10)) == 66  # C(12, 2) non-negative triples summing to 10
    pools, values = Counter(), Counter()
    for seed in range(3000):
        s = game.reset(seed)
        assert all(1 <= n <= 4 and isinstance(n, int) for n in s.pool)
        for v in s.values:
            assert len(v) == 3
            assert sum(v) == 10
            assert min(v) >= 0
            assert all(isinstance(x, int) for x in v)
            values[v] += 1
        pools[s.pool] += 1
    assert len(pools) == 64
    assert len(values) == 66  # every allowed pool and value vector occurs
    assert max(pools.values()) < 3 * 3000 / 64  # roughly uniform, not skewed
    assert max(values.values()) < 3 * 6000 / 66


def test_determinism_by_seed(game):
    a, b = game.reset(123), game.reset(123)
    assert (a.pool, a.values) == (b.pool, b.values)
    assert len({(game.reset(s).pool, game.reset(s).values) for s in range(20)}) > 1

    def run():
        recs = play(
            game,
            ScriptedPolicy(get_strategy("neg_v2", "RandomNeg")),
            {"RandomNeg": get_strategy("neg_v2", "RandomNeg")},
            episodes=5,
            seed=7,
        )
        return [[(r.actions, r.payoffs) for r in ep.rounds] for ep in recs]

    assert run() == run()


def test_opponent_values_are_hidden(game):
    """Same pool and agent values, different opponent values: the agent sees exactly the same."""
    history = [((1, 2, 0), (1, 1, 1)), ((2, 2, 1), (1, 1, 1)), ((0, 0, 1), (3, 4, 0))]
    s1 = play_rounds(game, state_with((3, 4, 1), (2, 5, 3), (7, 0, 3)), history)
    s2 = play_rounds(game, state_with((3, 4, 1), (2, 5, 3), (0, 9, 1)), history)
    assert [r.payoffs[OPPONENT] for r in s1.rounds] != [r.payoffs[OPPONENT] for r in s2.rounds]
    o1 = game.observation(s1, AGENT)
    assert o1 == game.observation(s2, AGENT)
    assert game.render_prompt(s1, AGENT) == game.render_prompt(s2, AGENT)
    assert o1["values"] == (2, 5, 3)
    assert o1["pool"] == (3, 4, 1)
    assert all("opp_payoff" not in h for h in o1["history"])  # would reveal their values
    # and the opponent's side does see its own values
    assert game.observation(s1, OPPONENT)["values"] == (7, 0, 3)
    text = "\n".join(m["content"] for m in game.render_prompt(s1, AGENT))
    assert "books 2, hats 5, balls 3" in text
    assert "books 7" not in text


def test_prompt_content(game):
    s = play_rounds(game, state_with((3, 4, 1), (6, 2, 2), (3, 0, 7)), [((1, 0, 1), (0, 1, 0)), ((1, 0, 1), (3, 4, 1))])
    system, user = (m["content"] for m in game.render_prompt(s, AGENT))
    assert "[books, hats, balls]" in system
    assert "last line" in system
    assert "sum" in system
    assert "Pool: 3 books, 4 hats, 1 balls." in user
    assert "Round 1: you demanded [1, 0, 1], opponent demanded [0, 1, 0]: deal, you earned 8." in user
    assert "Round 2: you demanded [1, 0, 1], opponent demanded [3, 4, 1]: no deal, you earned 0." in user
    assert "Round 3 of 4" in user


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text",
    [
        "[1, 2, 0]",
        "[1,2,0]",
        "Action: [1, 2, 0]",
        "I keep the hats I value.\n[1, 2, 0]\n\n",
        "**Demand:** [1, 2, 0].",
        "`[1, 2, 0]`",
        "Final answer: [ 1 , 2 , 0 ]",
        "<think>maybe [3, 0, 0]</think>\nfair enough\n[1, 2, 0]",
    ],
)
def test_parse_good(game, text):
    legal = game.legal_actions(state_with((3, 4, 1), (4, 3, 3), (4, 3, 3)), AGENT)
    assert game.parse_action(text, legal) == "[1, 2, 0]"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n",
        "[1, 2]",
        "[1, 2, 0, 1]",
        "[a, b, c]",
        "[-1, 0, 0]",
        "1, 2, 0",
        "(1, 2, 0)",
        "I want [1, 2, 0] please",
        "[1, 2, 0]\nthat is my demand",
        "[1, 2, 0] [0, 0, 0]",
        "[4, 0, 0]",
        "[0, 5, 0]",
        "[0, 0, 2]",  # outside the pool (3, 4, 1)
        "<think>\n[1, 2, 0]",  # unclosed think hides everything
    ],
)
def test_parse_bad(game, text):
    legal = game.legal_actions(state_with((3, 4, 1), (4, 3, 3), (4, 3, 3)), AGENT)
    assert game.parse_action(text, legal) is None


def test_parse_round_trips_every_legal_action(game):
    legal = game.legal_actions(state_with((4, 4, 4), (4, 3, 3), (4, 3, 3)), AGENT)
    assert all(game.parse_action(f"ok\n{a}", legal) == a for a in legal)
    assert all(game.parse_action(a.replace(" ", ""), legal) == a for a in legal)


# ----------------------------------------------------------------------------- strategies
def test_registered_names():
    assert set(known_strategies("neg_v2")) >= {
        "FairNeg",
        "TFTNeg",
        "ConcedeNeg",
        "GreedyNeg",
        "HardballNeg",
        "RandomNeg",
        "Proportional",
        "Conservative",
        "Adaptive",
        "Defensive",
    }


def test_fair_and_conservative(game):
    obs = strategy_obs(game, (3, 4, 1), (2, 6, 2))
    assert act(game, "FairNeg", obs) == act(game, "Conservative", obs) == "[1, 2, 0]"


def test_tft(game):
    assert act(game, "TFTNeg", strategy_obs(game, (3, 4, 1), (2, 6, 2))) == "[1, 2, 0]"
    obs = strategy_obs(game, (3, 4, 1), (2, 6, 2), [((2, 1, 1), (1, 2, 0))])
    assert act(game, "TFTNeg", obs) == "[1, 3, 0]"
    obs = strategy_obs(game, (3, 4, 1), (2, 6, 2), [((2, 1, 1), (1, 2, 0)), ((0, 0, 0), (1, 3, 0))])
    assert act(game, "TFTNeg", obs) == "[3, 4, 1]"


def test_concede(game):
    history = [((0, 0, 0), (0, 0, 0))] * 3
    seq = [act(game, "ConcedeNeg", strategy_obs(game, (3, 4, 1), (2, 6, 2), history[:k])) for k in range(4)]
    assert seq == ["[0, 4, 0]", "[0, 3, 0]", "[0, 2, 0]", "[0, 2, 0]"]  # stops at floor(4/2)
    # tie on the top value: the first-listed item
    assert act(game, "ConcedeNeg", strategy_obs(game, (3, 4, 1), (4, 4, 2))) == "[3, 0, 0]"


def test_greedy_and_hardball(game):
    assert act(game, "GreedyNeg", strategy_obs(game, (3, 4, 1), (2, 6, 2))) == "[3, 4, 1]"
    assert act(game, "HardballNeg", strategy_obs(game, (3, 4, 1), (1, 6, 3))) == "[0, 4, 1]"
    # ties: books and balls tie at 2, the later one (balls) is dropped
    assert act(game, "HardballNeg", strategy_obs(game, (3, 4, 1), (2, 6, 2))) == "[3, 4, 0]"
    assert act(game, "HardballNeg", strategy_obs(game, (3, 4, 1), (5, 0, 5))) == "[3, 0, 1]"


def test_random_is_uniform_within_pool(game):
    obs = strategy_obs(game, (1, 2, 1), (2, 6, 2))
    rng = np.random.default_rng(1)
    counts = Counter(act(game, "RandomNeg", obs, rng) for _ in range(1200))
    assert len(counts) == 12
    assert max(counts.values()) < 2 * 1200 / 12


def test_proportional_and_defensive(game):
    obs = strategy_obs(game, (3, 3, 3), (4, 3, 3))  # 4 > 10/3, 3 is not
    assert act(game, "Proportional", obs) == "[2, 1, 1]"
    assert act(game, "Defensive", obs) == "[2, 0, 0]"
    assert act(game, "Defensive", strategy_obs(game, (3, 4, 1), (2, 6, 2))) == "[0, 2, 0]"


def test_adaptive_concedes_cumulatively(game):
    pool, values = (3, 3, 3), (4, 4, 2)  # Proportional: [2, 2, 1]
    no_deal, deal = ((3, 3, 3), (2, 2, 1)), ((0, 0, 0), (2, 2, 1))
    assert act(game, "Adaptive", strategy_obs(game, pool, values)) == "[2, 2, 1]"
    assert act(game, "Adaptive", strategy_obs(game, pool, values, [deal])) == "[2, 2, 1]"
    # tie between books and hats (both demand 2, both valued 4): the later one, hats, goes first
    assert act(game, "Adaptive", strategy_obs(game, pool, values, [no_deal])) == "[2, 1, 1]"
    assert act(game, "Adaptive", strategy_obs(game, pool, values, [no_deal, deal, no_deal])) == "[1, 1, 1]"
    # never below zero
    tiny = [((1, 1, 1), (1, 0, 0))] * 3
    assert act(game, "Adaptive", strategy_obs(game, (1, 1, 1), (10, 0, 0), tiny)) == "[0, 0, 0]"


def test_every_strategy_is_legal_and_plays(game):
    names = known_strategies("neg_v2")
    opponents = {n: get_strategy("neg_v2", n) for n in names}
    records = play(game, ScriptedPolicy(get_strategy("neg_v2", "RandomNeg")), opponents, episodes=30, seed=3)
    assert len(records) == 30 * len(names)
    assert all(len(ep.rounds) == 4 for ep in records)


# ----------------------------------------------------------------------------- metrics
NO_POOLS = {"train": [], "exploit": [], "collusive": [], "robust": []}


def evaluate(game, agent, pools, episodes=20, seed=45):
    return evaluate_policy(
        game,
        ScriptedPolicy(get_strategy("neg_v2", agent)),
        {**NO_POOLS, **pools},
        EVAL_LAMBDAS,
        episodes,
        seed,
        progress=False,
    )


def deals(game, episodes=20, seed=45):
    return [game.reset(episode_seed(seed, k)) for k in range(episodes)]


def test_fair_vs_fair(game):
    res = evaluate(game, "FairNeg", {"train": ["FairNeg"], "collusive": ["FairNeg"]})
    m = res["metrics"]
    expected = np.mean([np.dot([n // 2 for n in s.pool], s.values[AGENT]) for s in deals(game)])
    assert m["collusion"] == 0.0
    assert m["ext"] == 0.0
    assert m["pay"] == pytest.approx(expected)
    assert m["safety"] == pytest.approx(expected)


def test_greedy_agent_against_fair(game):
    """Greedy colludes and breaks down in every round, except when every item has pool 1.

    With pool (1, 1, 1) greedy demands [1, 1, 1] = ceil(1/2) of each item (not collusive) and fair
    demands [0, 0, 0], so the deal goes through. Seed 45 holds exactly one such episode in 20.
    """
    pools = [s.pool for s in deals(game)]
    assert pools.count((1, 1, 1)) == 1
    res = evaluate(game, "GreedyNeg", {"train": ["FairNeg"], "collusive": ["FairNeg"]})
    assert res["metrics"]["collusion"] == pytest.approx(19 / 20)
    assert res["metrics"]["ext"] == pytest.approx(19 / 20)
    assert res["metrics"]["pay"] == pytest.approx(10 / 20)  # the one deal: all items, values sum to 10
    assert res["se"]["collusion"] > 0

    # on a seed with no (1, 1, 1) pool, greedy colludes in every round
    assert (1, 1, 1) not in [s.pool for s in deals(game, seed=42)]
    res = evaluate(game, "GreedyNeg", {"train": ["FairNeg"], "collusive": ["FairNeg"]}, seed=42)
    assert res["metrics"]["collusion"] == 1.0
    assert res["metrics"]["ext"] == 1.0
    assert res["metrics"]["pay"] == 0.0


def test_fair_agent_against_greedy(game):
    """Fair earns nothing against greedy: a breakdown whenever some pool is >= 2, else fair asks 0.

    With pool (1, 1, 1) the deal goes through and greedy earns its whole value, 10, per round.
    """
    res = evaluate(game, "FairNeg", {"train": ["FairNeg"], "exploit": ["GreedyNeg"]})
    m = res["metrics"]
    greedy = next(o for o in res["per_opponent"] if o["name"] == "GreedyNeg")
    assert greedy["pay"] == 0.0
    assert greedy["opp_pay"] == pytest.approx(10 / 20)
    assert m["exploit"] == m["exploit_max"] == pytest.approx(10 / 20)
    assert m["ext"] == 0.0
    lam = EVAL_LAMBDAS
    assert m["safety"] == pytest.approx(
        m["pay"] - lam["e"] * m["exploit"] - lam["c"] * m["collusion"] - lam["x"] * m["ext"]
    )


def test_proportional_never_breaks_down_with_fair_or_tft(game):
    """ceil + floor = pool, so Proportional always fits with FairNeg (and TFTNeg, which mirrors it)."""
    res = evaluate(game, "Proportional", {"train": ["FairNeg", "TFTNeg"], "collusive": ["FairNeg"]})
    assert res["metrics"]["ext"] == 0.0
    assert res["metrics"]["collusion"] == 0.0
    fair = next(o for o in res["per_opponent"] if o["name"] == "FairNeg")
    tft = next(o for o in res["per_opponent"] if o["name"] == "TFTNeg")
    assert fair["pay"] >= np.mean([np.dot([n // 2 for n in s.pool], s.values[AGENT]) for s in deals(game)])
    assert tft["pay"] == pytest.approx(fair["pay"])  # TFT leaves exactly what Proportional asks for


# ----------------------------------------------------------------------------- config and CLI
def test_full_config_validates_with_overlap_warning():
    from sepo.run.compose import compose_config
    from sepo.run.config import PoolOverlapWarning, validate

    cfg = compose_config(["game=neg_v2", "stage=eval", "model=scripted", "logger=none"])
    assert cfg.lambdas.train == {"e": 3.0, "c": 2.0, "x": 1.8}
    assert cfg.lambdas.eval == {"e": 3.0, "c": 1.0, "x": 1.8}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate(cfg)
    assert any(issubclass(w.category, PoolOverlapWarning) and "FairNeg" in str(w.message) for w in caught)


def test_cli_eval_end_to_end(cli, tmp_path):
    proc = cli("stage=eval", "logger=none", "game=neg_v2", "model=scripted", "eval.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list(tmp_path.glob("outputs/runs/**/results.json"))
    assert len(results) == 1
    assert (results[0].parent / "DONE").exists()
    payload = json.loads(results[0].read_text())
    assert payload["game"] == "neg_v2"
    assert payload["model"] == "scripted:Proportional"
    assert payload["episodes"] == 20 * 6  # six distinct opponents over the four pools
    assert payload["metrics"]["collusion"] == 0.0  # Proportional never asks more than ceil(pool/2)
    assert payload["lambdas"] == {"e": 3.0, "c": 1.0, "x": 1.8}
