"""The played action probabilities (sepo/policies/played.py): the table of the policy that plays.

Two tiny models taught in seconds on one-hand Kuhn poker prompts (the 12 information sets):
- `reasoner` answers as the SFT data do, a reasoning line and then the action; with a Q the same
  line ("Middle card.") is followed by either action, so the last line is a real coin flip;
- `blurter` answers with the action alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from sepo.arena import play
from sepo.games import make_game
from sepo.games.kuhn import exact as K
from sepo.games.kuhn.rules import ACTION_INDEX, node_of
from sepo.games.strategy import get_strategy
from sepo.policies.lm import LMPolicy
from sepo.policies.played_table import infoset_requests, played_table

from .conftest import CONF, teach

pytestmark = pytest.mark.usefixtures("one_thread")

KUHN = make_game(OmegaConf.merge(OmegaConf.load(CONF / "game" / "kuhn.yaml"), {"rounds": 1}))  # one hand


def reasoned(key: str, legal: list[str]) -> list[str]:
    """The reasoner's answers at one information set (drawn uniformly while teaching)."""
    passive, aggressive = sorted(legal, key=lambda a: ACTION_INDEX[a])
    card = int(key[0])
    if card == 2:
        return [f"Strong card.\n{aggressive}"]
    if card == 1:
        return [f"Middle card.\n{aggressive}", f"Middle card.\n{passive}", f"Careful here.\n{passive}"]
    return [f"Weak card, bluff.\n{aggressive}", f"Weak card.\n{passive}", f"Weak card.\n{passive}"]


def blurted(key: str, legal: list[str]) -> list[str]:
    passive, aggressive = sorted(legal, key=lambda a: ACTION_INDEX[a])
    return {2: [aggressive], 1: [aggressive, passive], 0: [passive, passive, aggressive]}[int(key[0])]


def taught_on(bundle, answers, steps: int = 120):
    """The tiny model taught `answers(key, legal)` at the 12 information sets (drawn uniformly)."""
    return teach(bundle, [(r.messages, a) for key, r in infoset_requests(KUHN) for a in answers(key, r.legal)], steps)


@pytest.fixture(scope="module")
def reasoner(tiny):
    return taught_on(tiny, reasoned)


@pytest.fixture(scope="module")
def blurter(tiny):
    return taught_on(tiny, blurted)


def agent(bundle, samples: int = 128) -> LMPolicy:
    model, tokenizer, cfg = bundle
    return LMPolicy(model, tokenizer, cfg, 0.8, 16, seed=0, action_samples=samples)


def hand_one_decisions(records) -> dict[str, list[int]]:
    """Per information set, 1 for every BET/CALL and 0 for every PASS/FOLD the agent played in hand 1."""
    out: dict[str, list[int]] = {}
    for record in records:
        info = record.rounds[0].info
        seat, card = ("first", "second").index(info["agent_seat"]), "JQK".index(info["agent_card"])
        betting = list(info["betting"])
        for i in range(seat, len(betting), 2):
            out.setdefault(f"{card}{node_of(betting[:i])}", []).append(ACTION_INDEX[betting[i]])
    return out


@pytest.mark.slow  # the played table is checked against OpenSpiel in the default run (test_the_estimate_is_seeded...)
@pytest.mark.parametrize("episodes, decisions", [(1000, 150), (2700, 400)])
def test_the_played_table_agrees_with_decisions_played_through_the_arena(reasoner, episodes, decisions):
    """Within 3 SE (the estimate's and the frequency's) at every state with >= `decisions` decisions
    (the slow variant: >= 400 at each of 6 states)."""
    policy = agent(reasoner)
    played = played_table(KUHN, policy, seed=5)
    assert played.rao_blackwellised > 0.5  # most last lines scored exactly; the rest needed the fallback (counted)
    records = play(
        KUHN, policy, {"AlwaysBet": get_strategy("kuhn", "AlwaysBet")}, episodes=episodes, seed=11, mirrored=True
    )
    compared = 0
    for key, acts in hand_one_decisions(records).items():
        if len(acts) < decisions:
            continue
        f = float(np.mean(acts))
        z = abs(played.table[key][1] - f) / np.sqrt(played.se[key] ** 2 + f * (1 - f) / len(acts))
        assert z <= 3, (key, played.table[key][1], played.se[key], f, len(acts))
        compared += 1
    assert compared >= 6  # (J, Q, K) x (opening as first player, facing a bet as second)


@pytest.mark.slow
def test_for_a_model_that_answers_with_the_action_alone_old_and_new_readings_agree(blurter):
    policy = agent(blurter, samples=16)
    requests = [r for _, r in infoset_requests(KUHN)]
    new = policy.action_probabilities(requests, seed=1)
    old = policy.action_first_probabilities(requests)
    for estimate, probs in zip(new, old):
        assert estimate.rao_blackwellised == 1.0  # every sample's action line starts the answer
        assert list(estimate.probs.values()) == pytest.approx(list(probs.values()), abs=1e-5)
        assert max(estimate.se.values()) < 1e-5  # every sample gives the same exact vector


def test_the_estimate_is_seeded_and_its_table_checks_against_openspiel(reasoner):
    policy = agent(reasoner, samples=32)
    a, b, c = (played_table(KUHN, policy, seed=s) for s in (3, 3, 4))
    assert all(np.array_equal(a.table[k], b.table[k]) for k in K.INFOSETS)
    assert any(not np.array_equal(a.table[k], c.table[k]) for k in K.INFOSETS)
    assert a.exploitability_se > 0
    assert a.samples == 32
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import exploitability

    os_game = pyspiel.load_game("kuhn_poker")
    tabular = os_policy.TabularPolicy(os_game)
    for key, probs in a.table.items():
        tabular.action_probability_array[tabular.state_lookup[key]] = probs
    assert a.exploitability == pytest.approx(exploitability.exploitability(os_game, tabular), abs=1e-9)


def test_greedy_decoding_reads_one_answer_per_state(reasoner):
    model, tokenizer, cfg = reasoner
    policy = LMPolicy(model, tokenizer, cfg, 0.0, 16, seed=0, action_samples=64)
    requests = [r for _, r in infoset_requests(KUHN)]
    estimates = policy.action_probabilities(requests)
    decisions = policy.act_batch(requests)
    for estimate, decision in zip(estimates, decisions):
        assert estimate.samples.shape[0] == 1
        assert estimate.probs[decision.action] == 1.0


def test_a_table_read_split_over_forked_workers_is_the_one_read_in_one_process(reasoner):
    """`model.cpu_workers`: the information sets are dealt to forked processes, each copy keeping the
    sampling stream of its place in the whole read, so the read is the same, sample for sample."""
    policy = agent(reasoner, samples=8)
    whole = played_table(KUHN, policy, seed=3)
    policy.workers = 2
    split = played_table(KUHN, policy, seed=3)
    assert all(np.array_equal(whole.table[k], split.table[k]) for k in K.INFOSETS)
    assert whole.se == split.se and whole.rao_blackwellised == split.rao_blackwellised
