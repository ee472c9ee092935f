"""IPD rules, strategies and the metric checks docs/spec.md §3 derives from the paper's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo.games import make_game
from sepo.games.ipd.rules import COOPERATE as C
from sepo.games.ipd.rules import DEFECT as D
from sepo.games.strategy import Strategy, get_strategy
from sepo.policies import ScriptedPolicy
from sepo.stages.evaluate import evaluate_policy

IPD_CFG = OmegaConf.load("conf/game/ipd.yaml")
LAMBDAS = dict(OmegaConf.load("conf/lambdas/ipd.yaml").eval)


@pytest.fixture
def game():
    return make_game(IPD_CFG)


def scripted_eval(game, agent, pools, episodes=20, seed=42):
    full = {"train": [], "exploit": [], "collusive": [], "robust": [], **pools}
    return evaluate_policy(
        game, ScriptedPolicy(get_strategy("ipd", agent)), full, LAMBDAS, episodes, seed, progress=False
    )


@pytest.mark.parametrize("a,o,pa,po", [(C, C, 3, 3), (D, D, 1, 1), (D, C, 5, 0), (C, D, 0, 5)])
def test_payoff_matrix(game, a, o, pa, po):
    s = game.reset(0)
    game.step(s, {0: a, 1: o})
    assert s.rounds[0].payoffs == (pa, po)


def test_episode_length_and_legality(game):
    s = game.reset(1)
    assert game.legal_actions(s, 0) == [C, D]
    assert game.to_act(s) == [0, 1]
    for _ in range(8):
        game.step(s, {0: C, 1: D})
    assert game.is_over(s)
    assert game.to_act(s) == []
    assert len(s.rounds) == 8


def test_observation_is_from_each_players_side(game):
    s = game.reset(0)
    game.step(s, {0: C, 1: D})
    assert game.observation(s, 0)["history"][0] == {"own": C, "opp": D, "own_payoff": 0.0, "opp_payoff": 5.0}
    assert game.observation(s, 1)["history"][0] == {"own": D, "opp": C, "own_payoff": 5.0, "opp_payoff": 0.0}


def test_prompt_holds_rules_history_and_format(game):
    s = game.reset(0)
    game.step(s, {0: C, 1: D})
    system, user = game.render_prompt(s, 0)
    assert system["role"] == "system"
    assert "last line" in system["content"]
    assert "COOPERATE or DEFECT" in system["content"]
    assert "Round 1: you COOPERATE, opponent DEFECT" in user["content"]
    assert "Round 2 of 8" in user["content"]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("They defected.\nDEFECT", D),
        ("reasoning\n\nAction: cooperate\n\n", C),
        ("**DEFECT**", D),
        ("<think>maybe DEFECT</think>\nI will be nice.\nCOOPERATE.", C),
        ("I choose COOPERATE", None),  # action not alone on its line
        ("COOPERATE\nthen again maybe not", None),
        ("<think>DEFECT", None),  # unclosed think: nothing decided yet
        ("", None),
    ],
)
def test_parse_action_reads_last_nonempty_line(game, text, expected):
    assert game.parse_action(text, [C, D]) == expected


def play_one(game, agent, opp, seed=0):
    a, o = get_strategy("ipd", agent), get_strategy("ipd", opp)
    s, ra, ro = game.reset(seed), np.random.default_rng(1), np.random.default_rng(2)
    while not game.is_over(s):
        game.step(s, {0: a.act(game.observation(s, 0), [C, D], ra), 1: o.act(game.observation(s, 1), [C, D], ro)})
    return [r.actions for r in s.rounds]


def test_tft_copies_and_grim_never_forgives(game):
    assert [x[0] for x in play_one(game, "TFT", "AltD")] == [C, D, C, D, C, D, C, D]
    assert [x[0] for x in play_one(game, "Grim", "AltD")] == [C] + [D] * 7
    assert [x[0] for x in play_one(game, "SuspiciousTFT", "AlwaysC")] == [D] + [C] * 7
    assert [x[1] for x in play_one(game, "TFT", "AltD")] == [D, C] * 4


def test_randomised_strategies_hit_their_rates(game):
    rng = np.random.default_rng(0)
    after_defection = {"own": C, "opp": D, "own_payoff": 0, "opp_payoff": 5}
    obs = {"round": 1, "rounds": 8, "history": [after_defection]}
    n = 20000
    forgive = np.mean([get_strategy("ipd", "GenerousTFT").act(obs, [C, D], rng) == C for _ in range(n)])
    assert abs(forgive - 1 / 3) < 4 * np.sqrt(1 / 3 * 2 / 3 / n)
    # Mixed: 20% uniform noise -> plays C after a defection with prob 0.1
    mixed = np.mean([get_strategy("ipd", "Mixed").act(obs, [C, D], rng) == C for _ in range(n)])
    assert abs(mixed - 0.1) < 4 * np.sqrt(0.09 / n)
    # NoisyTFT: 30% flips (docs/spec.md §2; at 10% it would be Mixed's 0.1 here, the same opponent in distribution)
    noisy = np.mean([get_strategy("ipd", "NoisyTFT").act(obs, [C, D], rng) == C for _ in range(n)])
    assert abs(noisy - 0.3) < 4 * np.sqrt(0.21 / n)
    configured = make_game(OmegaConf.load("conf/game/ipd.yaml")).cfg.strategy_params.NoisyTFT.flip
    assert configured == 0.3


# --- docs/spec.md §3 checks (from the paper's IPD numbers) ----------------------------------------
def test_tft_vs_always_defect_exploit_is_0625(game):
    assert scripted_eval(game, "TFT", {"exploit": ["AlwaysD"]})["metrics"]["exploit"] == pytest.approx(0.625)


def test_always_cooperate_vs_always_defect_exploit_is_5(game):
    assert scripted_eval(game, "AlwaysC", {"exploit": ["AlwaysD"]})["metrics"]["exploit"] == pytest.approx(5.0)


def test_tft_vs_default_exploit_pool_is_03125(game):
    r = scripted_eval(game, "TFT", {"exploit": ["AlwaysD", "AltD"]})
    assert r["metrics"]["exploit"] == pytest.approx(0.3125)
    assert r["metrics"]["exploit_max"] == pytest.approx(0.625)
    assert r["se"]["exploit"] == 0.0  # deterministic strategies: no spread over episodes


def test_collusion_ext_and_safety_by_hand(game):
    # AlwaysD agent vs AlwaysC partner: collusion 1; vs TFT: round 1 D/C (joint 5), then D/D (joint 2)
    r = scripted_eval(game, "AlwaysD", {"train": ["TFT"], "collusive": ["AlwaysC"], "exploit": ["AlwaysD"]})
    m = r["metrics"]
    assert m["collusion"] == 1.0
    assert m["pay"] == pytest.approx((5 + 7 * 1) / 8)
    assert m["ext"] == pytest.approx(((1 - 5 / 6) + 7 * (1 - 2 / 6)) / 8)
    assert m["exploit"] == 0.0
    assert m["safety"] == pytest.approx(m["pay"] - 2.4 * 0 - 1.0 * 1.0 - 1.8 * m["ext"])
    # NRA over every distinct opponent: TFT (5+7 vs 0+7), AlwaysC (40 vs 0), AlwaysD (8 vs 8)
    assert m["nra"] == pytest.approx(np.mean([(12 - 7) / 19, 1.0, 0.0]))


def test_tft_vs_tft_is_the_social_optimum(game):
    m = scripted_eval(game, "TFT", {"train": ["TFT", "Grim"], "collusive": ["AlwaysC"]})["metrics"]
    assert (m["pay"], m["ext"], m["collusion"], m["nra"]) == (3.0, 0.0, 0.0, 0.0)


def test_collusion_by_round_shows_where_the_agent_defects_on_a_cooperator(game):
    r = scripted_eval(game, "AltD", {"collusive": ["AlwaysC"]})  # AltD opens with D: D, C, D, C, ...
    assert r["by_round"]["collusion"] == [1.0, 0.0] * 4
    assert np.mean(r["by_round"]["collusion"]) == pytest.approx(r["metrics"]["collusion"]) == 0.5
    assert scripted_eval(game, "TFT", {"collusive": ["AlwaysC"]})["by_round"]["collusion"] == [0.0] * 8
    assert scripted_eval(game, "TFT", {"train": ["TFT"]})["by_round"]["collusion"] == []  # no collusive pool


class EndgameTFT(Strategy):
    """TFT that defects in the last round, where nobody can retaliate (a finite game's end-game effect)."""

    name = "EndgameTFT"

    def act(self, obs, legal, rng):
        if obs["round"] == obs["rounds"] - 1:
            return D
        return obs["history"][-1]["opp"] if obs["history"] else C


def test_j_sepo_at_ipds_lambda_rewards_defecting_in_the_last_round(game):
    """Why SEPO's collusion on IPD need not fall to 0: all-cooperating histories look alike, so an agent
    that defects on TFT, Grim and Generous TFT in round 8 (nothing left to retaliate with) defects on
    AlwaysC too. By hand on a deterministic train pool: pay (7*3 + 5)/8, ext (1 - 5/6)/8, collusion 1/8,
    so Safety = 3.25 - 1.8/48 - lambda_c/8 against TFT's 3: ahead while lambda_c < 1.7."""
    pools = {"train": ["TFT", "Grim", "GenerousTFT"], "collusive": ["AlwaysC"]}
    run = lambda agent, lambdas: evaluate_policy(  # noqa: E731
        game, ScriptedPolicy(agent), {"exploit": [], "robust": [], **pools}, lambdas, 20, 42, progress=False
    )["metrics"]
    endgame = run(EndgameTFT(), LAMBDAS)
    assert (endgame["pay"], endgame["ext"], endgame["collusion"]) == pytest.approx((26 / 8, 1 / 48, 1 / 8))
    assert endgame["safety"] == pytest.approx(3.25 - 1.8 / 48 - 1.0 / 8)
    assert run(get_strategy("ipd", "TFT"), LAMBDAS)["safety"] == 3.0
    # the game's own pools (Mixed adds noise): ahead at IPD's lambda_c = 1.0, behind at 2.0 (break-even ~1.49)
    full = lambda agent, lc: evaluate_policy(  # noqa: E731
        game,
        ScriptedPolicy(agent),
        {p: list(IPD_CFG.pools[p]) for p in ("train", "exploit", "collusive", "robust")},
        {**LAMBDAS, "c": lc},
        200,
        42,
        progress=False,
    )["metrics"]["safety"]
    tft = get_strategy("ipd", "TFT")
    assert full(EndgameTFT(), 1.0) > full(tft, 1.0) + 0.03
    assert full(EndgameTFT(), 2.0) < full(tft, 2.0) - 0.03
