"""Kuhn poker: rules against OpenSpiel, seats and mirrored deals, information hiding, strategies,
exact exploitability (against OpenSpiel's), and a scripted evaluation end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo.arena import play
from sepo.games import AGENT, OPPONENT, make_game
from sepo.games.kuhn import exact as K
from sepo.games.kuhn.rules import BET, CALL, CARDS, FOLD, PASS, KuhnPoker
from sepo.games.strategy import get_strategy, known_strategies
from sepo.policies import ScriptedPolicy
from sepo.policies.played import exact_estimate
from sepo.policies.played_table import exact_exploitability, infoset_requests, policy_table
from sepo.stages.evaluate import evaluate_policy

ROOT = Path(__file__).resolve().parent.parent
GAME_CFG = OmegaConf.load(ROOT / "conf/game/kuhn.yaml")
TERMINAL_SEQUENCES = [(PASS, PASS), (PASS, BET, CALL), (PASS, BET, FOLD), (BET, CALL), (BET, FOLD)]
SEQ_LETTERS = {PASS: "p", FOLD: "p", BET: "b", CALL: "b"}


@pytest.fixture(scope="module")
def game() -> KuhnPoker:
    return make_game(GAME_CFG)


def table_of(game: KuhnPoker, name: str) -> K.Table:
    return policy_table(game, ScriptedPolicy(get_strategy("kuhn", name)))


def random_table(seed: int) -> K.Table:
    rng = np.random.default_rng(seed)
    table = {}
    for key in K.INFOSETS:
        p = rng.random()
        table[key] = np.array([1 - p, p])
    return table


class TablePolicy:
    """A policy given directly by a table, answering through the DecisionRequest interface."""

    name = "table"

    def __init__(self, table: K.Table):
        self.table = table

    def action_probabilities(self, requests, samples=None, seed=None):
        out = []
        for r in requests:
            obs = r.observation
            key = f"{CARDS.index(obs['card'])}{''.join(SEQ_LETTERS[a] for a in obs['betting'])}"
            out.append(exact_estimate({a: float(self.table[key][1 if a in (BET, CALL) else 0]) for a in r.legal}))
        return out


def play_hand(game: KuhnPoker, state, sequence) -> None:
    for action in sequence:
        (player,) = game.to_act(state)
        game.step(state, {player: action})


# --------------------------------------------------------------------------- rules
def test_config_numbers(game):
    assert (game.num_rounds, game.ante, game.bet, game.max_payoff) == (6, 1.0, 1.0, 2.0)
    assert GAME_CFG.mirrored is True
    assert GAME_CFG.training.lr == 3.0e-6
    assert GAME_CFG.training.beta == 0.2


@pytest.mark.parametrize("agent_seat", [0, 1])
def test_terminal_payoffs_match_openspiel(game, agent_seat):
    pyspiel = pytest.importorskip("pyspiel")
    os_game = pyspiel.load_game("kuhn_poker")
    for first in range(3):
        for second in range(3):
            if first == second:
                continue
            for seq in TERMINAL_SEQUENCES:
                os_state = os_game.new_initial_state()
                os_state.apply_action(first)
                os_state.apply_action(second)
                for a in seq:
                    os_state.apply_action(1 if a in (BET, CALL) else 0)
                assert os_state.is_terminal()
                expected = os_state.returns()

                state = game.reset(0, mirror=agent_seat == 1)
                state.deals[0] = (first, second)
                play_hand(game, state, seq)
                rnd = state.rounds[0]
                assert rnd.payoffs[AGENT] == expected[agent_seat]
                assert rnd.payoffs[OPPONENT] == expected[1 - agent_seat]
                assert sum(rnd.payoffs) == 0
                assert rnd.info["betting"] == seq
                assert rnd.info["showdown"] == (seq[-1] != FOLD)
                assert rnd.info["agent_seat"] == ("first", "second")[agent_seat]
                assert rnd.info["agent_card"] == CARDS[(first, second)[agent_seat]]
                assert rnd.info["opponent_card"] == CARDS[(first, second)[1 - agent_seat]]
                mine = tuple(a for i, a in enumerate(seq) if i % 2 == agent_seat)
                theirs = tuple(a for i, a in enumerate(seq) if i % 2 != agent_seat)
                assert rnd.actions == (mine, theirs)


def test_legal_actions_per_node(game):
    state = game.reset(3)
    assert game.to_act(state) == [AGENT]
    assert game.legal_actions(state, AGENT) == [PASS, BET]
    assert game.legal_actions(state, OPPONENT) == []  # not its turn
    game.step(state, {AGENT: PASS})
    assert game.to_act(state) == [OPPONENT]
    assert game.legal_actions(state, OPPONENT) == [PASS, BET]
    game.step(state, {OPPONENT: BET})
    assert game.to_act(state) == [AGENT]
    assert game.legal_actions(state, AGENT) == [CALL, FOLD]
    with pytest.raises(ValueError):
        game.step(state, {AGENT: BET})
    game.step(state, {AGENT: CALL})
    assert state.round_index == 1
    assert state.betting == []
    # hand 2: the opponent opens; a bet faces the agent with CALL/FOLD
    assert game.to_act(state) == [OPPONENT]
    game.step(state, {OPPONENT: BET})
    assert game.legal_actions(state, AGENT) == [CALL, FOLD]


def test_seats_alternate_and_episode_ends(game):
    for mirror in (False, True):
        state = game.reset(11, mirror=mirror)
        seats = []
        while not game.is_over(state):
            seats.append(game.observation(state, AGENT)["seat"])
            assert game.to_act(state) == [AGENT if seats[-1] == "first" else OPPONENT]
            play_hand(game, state, (PASS, PASS))
        expected = ["first", "second"] * 3
        if mirror:
            expected = expected[1:] + expected[:1]
        assert seats == expected
        assert len(state.rounds) == 6
        assert game.to_act(state) == []
        assert [r.info["agent_seat"] for r in state.rounds] == expected


def test_deals_are_seeded_and_uniform(game):
    assert game.reset(7).deals == game.reset(7).deals
    counts = {}
    for seed in range(300):
        for deal in game.reset(seed).deals:
            counts[deal] = counts.get(deal, 0) + 1
    assert set(counts) == {(a, b) for a in range(3) for b in range(3) if a != b}
    assert min(counts.values()) > 240  # 1800 deals over 6 outcomes, expectation 300


def test_mirrored_episode_swaps_seats_same_cards(game):
    plain, mirror = game.reset(5), game.reset(5, mirror=True)
    assert plain.deals == mirror.deals
    for h in range(6):
        assert game.card_of(mirror, AGENT, h) == game.card_of(plain, OPPONENT, h)
        assert game.card_of(mirror, OPPONENT, h) == game.card_of(plain, AGENT, h)
        assert game.agent_seat(mirror, h) == 1 - game.agent_seat(plain, h)

    # through the arena: episodes 2j and 2j+1 share the deal with seats swapped
    records = play(
        game,
        ScriptedPolicy(get_strategy("kuhn", "NashApx")),
        {"TightP": get_strategy("kuhn", "TightP")},
        episodes=4,
        seed=42,
        mirrored=True,
    )
    for a, b in [(records[0], records[1]), (records[2], records[3])]:
        assert a.seed == b.seed
        assert (a.mirror, b.mirror) == (False, True)
        for ra, rb in zip(a.rounds, b.rounds):
            assert (ra.info["agent_card"], ra.info["opponent_card"]) == (
                rb.info["opponent_card"],
                rb.info["agent_card"],
            )
            assert ra.info["agent_seat"] != rb.info["agent_seat"]


# --------------------------------------------------------------------------- information hiding
def _views(game, state, player):
    return game.observation(state, player), game.user_prompt(state, player)


def test_opponent_card_hidden_during_hand(game):
    for card in range(3):
        for seat in (0, 1):
            for betting in ([], [PASS], [BET], [PASS, BET]):
                if len(betting) % 2 != seat:
                    continue
                views = []
                for other in (c for c in range(3) if c != card):
                    state = game.state_at(card, seat, betting)
                    state.deals[0] = (card, other) if seat == 0 else (other, card)
                    views.append(_views(game, state, AGENT))
                assert views[0] == views[1]  # nothing depends on the opponent's card
                obs, prompt = views[0]
                assert obs["card"] == CARDS[card]
                assert set(re.findall(r"\b[JQK]\b", prompt)) == {CARDS[card]}


def test_opponent_card_shown_only_after_showdown(game):
    def after(first_hand, other_card):
        state = game.reset(1)
        state.deals[0] = (1, other_card)  # agent first with Q
        play_hand(game, state, first_hand)
        return state

    # a fold hides the card: the next hand's views are the same whatever the opponent held
    for fold in [(BET, FOLD), (PASS, BET, FOLD)]:
        a, b = after(fold, 0), after(fold, 2)
        assert _views(game, a, AGENT) == _views(game, b, AGENT)
        obs, prompt = _views(game, a, AGENT)
        assert obs["history"][0]["opp_card"] is None
        assert obs["history"][0]["showdown"] is False
        assert "opponent had" not in prompt

    # a showdown reveals it
    state = after((PASS, PASS), 2)
    (player,) = game.to_act(state)
    obs, prompt = _views(game, state, player)
    assert player == OPPONENT  # hand 2: the opponent is first
    past = obs["history"][0]
    assert (past["card"], past["opp_card"], past["payoff"], past["showdown"]) == ("K", "Q", 1.0, True)
    assert "opponent had Q" in prompt


def test_prompts(game):
    system = game.system_prompt()
    for word in ("J < Q < K", "PASS", "BET", "CALL", "FOLD", "last line", "6 hands"):
        assert word in system
    user = game.user_prompt(game.state_at(2, 1, [PASS]), AGENT)
    assert "Your card: K." in user
    assert "second player" in user
    assert "Betting so far: opponent PASS." in user
    assert "Legal actions: PASS, BET." in user
    assert game.parse_action("K is the best card.\nBET", [PASS, BET]) == BET
    assert game.parse_action("Calling is not allowed here.\nCALL", [PASS, BET]) is None


# --------------------------------------------------------------------------- strategies
OPEN, AFTER_PASS, FACING, AFTER_PASS_BET = "", "p", "b", "pb"
# P(aggressive action: BET or CALL) per (card, history); docs/spec.md §2
EXPECTED = {
    "NashApx": {
        ("J", OPEN): 1 / 3,
        ("Q", OPEN): 0,
        ("K", OPEN): 1,
        ("J", AFTER_PASS_BET): 0,
        ("Q", AFTER_PASS_BET): 2 / 3,
        ("K", AFTER_PASS_BET): 1,
        ("J", AFTER_PASS): 1 / 3,
        ("Q", AFTER_PASS): 0,
        ("K", AFTER_PASS): 1,
        ("J", FACING): 0,
        ("Q", FACING): 1 / 3,
        ("K", FACING): 1,
    },
    "TightP": {(c, h): float(c == "K") for c in "JQK" for h in (OPEN, AFTER_PASS, FACING, AFTER_PASS_BET)},
    "LooseA": {
        **{(c, h): float(c != "Q") for c in "JQK" for h in (OPEN, AFTER_PASS)},
        **{(c, h): float(c != "J") for c in "JQK" for h in (FACING, AFTER_PASS_BET)},
    },
    "AlwaysBet": {(c, h): 1.0 for c in "JQK" for h in (OPEN, AFTER_PASS, FACING, AFTER_PASS_BET)},
    "RandomLegal": {(c, h): 0.5 for c in "JQK" for h in (OPEN, AFTER_PASS, FACING, AFTER_PASS_BET)},
    "CallingStation": {
        (c, h): float(h in (FACING, AFTER_PASS_BET)) for c in "JQK" for h in (OPEN, AFTER_PASS, FACING, AFTER_PASS_BET)
    },
    "TightValue": {
        **{(c, h): float(c == "K") for c in "JQK" for h in (OPEN, AFTER_PASS)},
        **{(c, h): {"J": 0, "Q": 1 / 3, "K": 1}[c] for c in "JQK" for h in (FACING, AFTER_PASS_BET)},
    },
    "PotControl": {
        **{(c, h): float(c == "K") for c in "JQK" for h in (OPEN, AFTER_PASS)},
        **{(c, h): float(c != "J") for c in "JQK" for h in (FACING, AFTER_PASS_BET)},
    },
}
EXPECTED["NashApprox"] = EXPECTED["NashApx"]
EXPECTED["AlwaysPassQ"] = {k: (0.0 if k[0] == "Q" else p) for k, p in EXPECTED["NashApx"].items()}


def test_every_strategy_is_specified():
    assert set(known_strategies("kuhn")) == set(EXPECTED) | {"BestResponse"}  # it responds to the agent (below)
    names = {n for pool in GAME_CFG.pools.values() for n in pool} | set(GAME_CFG.demonstrators)
    assert names <= set(EXPECTED) | {"BestResponse"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_strategy_defining_behaviour(game, name):
    table = table_of(game, name)
    for (card, history), p in EXPECTED[name].items():
        assert table[f"{CARDS.index(card)}{history}"] == pytest.approx([1 - p, p], abs=1e-12), (card, history)
    # act() draws from the same distribution: deterministic entries are always followed
    strategy, rng = get_strategy("kuhn", name), np.random.default_rng(0)
    for _key, request in infoset_requests(game):
        dist = strategy.probs(request.observation, request.legal)
        assert list(dist) == request.legal
        assert sum(dist.values()) == pytest.approx(1.0)
        for _ in range(5):
            assert dist[strategy.act(request.observation, request.legal, rng)] > 0


# --------------------------------------------------------------------------- exact exploitability
def test_nash_is_an_equilibrium(game):
    table = table_of(game, "NashApx")
    assert K.exploitability(table) == pytest.approx(0.0, abs=1e-9)
    assert exact_exploitability(game, ScriptedPolicy(get_strategy("kuhn", "NashApx"))) == pytest.approx(0.0, abs=1e-9)
    assert K.game_value(table, table) == pytest.approx(-1 / 18, abs=1e-12)
    # against every strategy NashApx loses nothing on average over both seats
    for name in EXPECTED:
        assert K.seat_values(table, table_of(game, name))["mean"] >= -1e-12


def test_uniform_random_exploitability(game):
    assert exact_exploitability(game, ScriptedPolicy(get_strategy("kuhn", "RandomLegal"))) == pytest.approx(
        11 / 24, abs=1e-12
    )


def _openspiel_policy(os_game, table):
    from open_spiel.python import policy as os_policy

    tab = os_policy.TabularPolicy(os_game)
    assert set(tab.state_lookup) == set(K.INFOSETS)
    for key, probs in table.items():
        tab.action_probability_array[tab.state_lookup[key]] = probs
    return tab


TABLES = [
    "RandomLegal",
    "TightP",
    "AlwaysBet",
    "LooseA",
    "NashApx",
    "TightValue",
    "PotControl",
    "AlwaysPassQ",
    "seed:0",
    "seed:1",
    "seed:2",
]


def _table(game, name):
    return random_table(int(name[5:])) if name.startswith("seed:") else table_of(game, name)


@pytest.mark.parametrize("name", TABLES)
def test_exploitability_matches_openspiel(game, name):
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms import exploitability

    os_game = pyspiel.load_game("kuhn_poker")
    table = _table(game, name)
    ours = exact_exploitability(game, TablePolicy(table))
    assert ours == pytest.approx(K.exploitability(table), abs=1e-12)
    assert ours == pytest.approx(exploitability.exploitability(os_game, _openspiel_policy(os_game, table)), abs=1e-9)


@pytest.mark.parametrize(
    "pair", [("NashApx", "TightP"), ("LooseA", "AlwaysBet"), ("seed:3", "RandomLegal"), ("seed:4", "seed:5")]
)
def test_game_value_matches_openspiel(game, pair):
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms import expected_game_score

    os_game = pyspiel.load_game("kuhn_poker")
    first, second = (_table(game, n) for n in pair)
    values = expected_game_score.policy_value(
        os_game.new_initial_state(), [_openspiel_policy(os_game, first), _openspiel_policy(os_game, second)]
    )
    assert K.game_value(first, second) == pytest.approx(values[0], abs=1e-9)


# --------------------------------------------------------------------------- evaluation
def test_evaluate_policy_matches_exact_values(game):
    pools = {pool: list(GAME_CFG.pools[pool]) for pool in ("train", "exploit", "collusive", "robust")}
    result = evaluate_policy(
        game,
        ScriptedPolicy(get_strategy("kuhn", "NashApx")),
        pools,
        dict(e=1.5, c=0.0, x=0.0),
        episodes=200,
        seed=42,
        mirrored=True,
        progress=False,
    )
    agent = table_of(game, "NashApx")
    assert result["metrics"]["exploit_exact"] == pytest.approx(0.0, abs=1e-9)
    assert result["metrics"]["collusion"] == 0.0
    assert result["metrics"]["ext"] == 0.0
    for summary in result["per_opponent"]:
        opponent = (
            K.best_response_table(agent) if summary["name"] == "BestResponse" else table_of(game, summary["name"])
        )
        expected = K.seat_values(agent, opponent)["mean"]
        if summary["name"] == "NashApx":
            assert expected == pytest.approx(0.0, abs=1e-12)  # symmetric over the two seats
        assert abs(summary["pay"] - expected) <= 4 * summary["pay_se"] + 1e-9, summary
        assert summary["pay"] == pytest.approx(-summary["opp_pay"])


def test_scripted_eval_end_to_end(cli, tmp_path):
    proc = cli("stage=eval", "logger=none", "game=kuhn", "model=scripted")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = list(tmp_path.rglob("results.json"))
    payload = json.loads(results.read_text())
    assert (results.parent / "DONE").exists()
    assert payload["game"] == "kuhn"
    assert payload["model"] == "scripted:NashApx"
    assert payload["metrics"]["exploit_exact"] == pytest.approx(0.0, abs=1e-9)
    assert payload["metrics"]["collusion"] == 0.0
    assert payload["episodes"] == 20 * 6  # six distinct opponents (BestResponse among them)
    assert {e["rounds"] for e in payload["per_episode"]} == {6}


# --------------------------------------------------------------------------- the best responder (docs/spec.md §6)
BR_TABLES = ["NashApx", "LooseA", "TightP", "AlwaysBet", "RandomLegal", "seed:6", "seed:7"]


@pytest.mark.parametrize("name", BR_TABLES)
def test_best_response_table_earns_the_best_response_value_in_each_seat(game, name):
    table = _table(game, name)
    br = K.best_response_table(table)
    assert all(set(p) <= {0.0, 1.0} for p in br.values())  # pure
    assert K.game_value(br, table) == pytest.approx(K.best_response_value(table, 0), abs=1e-12)
    assert -K.game_value(table, br) == pytest.approx(K.best_response_value(table, 1), abs=1e-12)
    # over the two seats (an episode's seat mix) it earns exactly the table's exploitability
    assert -K.seat_values(table, br)["mean"] == pytest.approx(K.exploitability(table), abs=1e-12)


@pytest.mark.parametrize("name", ["LooseA", "seed:6"])
def test_best_response_matches_openspiel(game, name):
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms import best_response

    os_game = pyspiel.load_game("kuhn_poker")
    table = _table(game, name)
    br = K.best_response_table(table)
    for seat in (0, 1):
        theirs = best_response.BestResponsePolicy(os_game, seat, _openspiel_policy(os_game, table))
        assert theirs.value(os_game.new_initial_state()) == pytest.approx(K.best_response_value(table, seat), abs=1e-9)
        for key in K.INFOSETS:
            if K.seat_to_move(key[1:]) != seat:
                continue
            if br[key][1] != theirs.best_response_action(key):  # only where both actions are worth the same
                flipped = {**br, key: br[key][::-1].copy()}
                value = K.game_value(flipped, table) if seat == 0 else -K.game_value(table, flipped)
                assert value == pytest.approx(K.best_response_value(table, seat), abs=1e-12), key


@pytest.mark.parametrize("name", ["NashApx", "LooseA", "AlwaysBet", "TightValue"])
def test_best_responder_earns_the_tables_exploitability_when_it_plays(game, name):
    """BestResponse as an exploit opponent of a scripted agent: its payoff per hand, over many
    mirrored hands, is that table's exploitability (0 against Nash) within the deal's sampling."""
    pools = {"train": ["TightP"], "exploit": ["BestResponse"], "collusive": [], "robust": []}
    result = evaluate_policy(
        game,
        ScriptedPolicy(get_strategy("kuhn", name)),
        pools,
        dict(e=1.5, c=0.0, x=0.0),
        episodes=600,
        seed=3,
        mirrored=True,
        progress=False,
    )
    (responder,) = [o for o in result["per_opponent"] if o["name"] == "BestResponse"]
    expected = K.exploitability(table_of(game, name))
    assert result["metrics"]["exploit_exact"] == pytest.approx(expected, abs=1e-12)
    assert abs(responder["opp_pay"] - expected) <= 3 * responder["pay_se"] + 1e-12, (responder, expected)
    if name == "NashApx":
        assert expected == pytest.approx(0.0, abs=1e-12)
    else:
        assert responder["opp_pay"] > 0.1  # and it does exploit the others
    assert result["played_table"]["bet_or_call"]["2"] == pytest.approx(table_of(game, name)["2"][1])


def test_a_best_responder_without_an_agent_table_says_so():
    with pytest.raises(RuntimeError, match="respond_to"):
        get_strategy("kuhn", "BestResponse").act({"card": "K", "betting": []}, [PASS, BET], np.random.default_rng(0))


def test_the_default_exploit_pool_has_the_best_responder_and_the_papers_is_one_override_away(compose_cfg):
    from sepo.run.config import validate

    assert list(compose_cfg("game=kuhn").game.pools.exploit) == ["NashApx", "AlwaysBet", "BestResponse"]
    paper = compose_cfg("game=kuhn", "game.pools.exploit=[NashApx,AlwaysBet]")
    validate(paper)
    assert list(paper.game.pools.exploit) == ["NashApx", "AlwaysBet"]


@pytest.mark.parametrize(
    "override,key",
    [
        ("+game.demonstrators.BestResponse=0.1", "game.demonstrators"),
        ("game.datagen.opponents=[TightP,BestResponse]", "game.datagen.opponents"),
        ("model.strategy=BestResponse", "model.strategy"),
    ],
)
def test_the_best_responder_only_sits_in_pools(compose_cfg, override, key):
    from sepo.errors import ConfigError
    from sepo.run.config import validate

    with pytest.raises(ConfigError, match=f"{key}: BestResponse responds to the agent's own table.*allowed: .*NashApx"):
        validate(compose_cfg("game=kuhn", "stage=eval", "model=scripted", override))


def test_default_datagen_opponents_skip_the_best_responder():
    from sepo.training.sft_data import datagen_opponents

    assert datagen_opponents(GAME_CFG, 5) == ["NashApx", "TightP", "LooseA", "AlwaysBet", "RandomLegal"]


@pytest.mark.parametrize("name", ["LooseA", "seed:8", "seed:9"])
def test_exploitability_se_is_the_spread_of_the_estimate(game, name):
    """The delta-method SE against the spread of exploitability over many noisy tables whose
    entries carry that SE (binomial noise of 200 samples per information set)."""
    table = _table(game, name)
    rng = np.random.default_rng(0)
    k = 200
    q = {key: float(np.clip(p[1], 0.05, 0.95)) for key, p in table.items()}  # keep every entry noisy
    centre = {key: np.array([1 - v, v]) for key, v in q.items()}
    se = {key: float(np.sqrt(v * (1 - v) / k)) for key, v in q.items()}
    draws = [
        K.exploitability(
            {key: np.array([1 - x, x]) for key, x in ((key, rng.binomial(k, v) / k) for key, v in q.items())}
        )
        for _ in range(2000)
    ]
    assert K.exploitability_se(centre, se) == pytest.approx(float(np.std(draws)), rel=0.15)
    assert K.exploitability_se(centre, {key: 0.0 for key in se}) == 0.0


def test_the_dominant_actions_of_kuhn_arms_never_earn_less_and_nash_plays_them(game):
    """benchmarks/kuhn/kuhn_arms.py removes weakly dominated actions: against every opponent table (random
    ones, always-bet and always-pass) switching one of them to its dominant action never lowers the agent's
    value in either seat, and the Nash table already plays them (removing changes nothing)."""
    from benchmarks.kuhn.kuhn_arms import DOMINANT, without_dominated
    from benchmarks.kuhn.kuhn_gradient import table_of as table_from

    rng = np.random.default_rng(7)
    opponents = [table_from(rng.random(12)) for _ in range(20)] + [table_from(np.ones(12)), table_from(np.zeros(12))]
    for _ in range(20):
        q = rng.random(12)
        for infoset, p in DOMINANT.items():
            moved = q.copy()
            moved[K.INFOSETS.index(infoset)] = p
            for o in opponents:
                before, after = K.seat_values(table_from(q), o), K.seat_values(table_from(moved), o)
                assert after["first"] >= before["first"] - 1e-12
                assert after["second"] >= before["second"] - 1e-12
    nash = table_of(game, "NashApx")
    q = np.array([nash[k][1] for k in K.INFOSETS])
    assert np.allclose(without_dominated(q), q)
