"""Rows that leave a decoding batch as they stop (sepo/lm/row_dropping.py, `model.drop_stopped_rows`).

The loop is generate's greedy loop with the policy's sampler and stopping rule; dropping stopped rows must
leave every row's answer, log-probs, fallback action and kept prompt encoding as generate gives them. Two
tiny models: a copy taught to answer IPD prompts TFT-style (answers stop at different lengths per row) and
the random one as built (no answer ever holds an action: every row runs to the budget and falls back).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import sepo.lm.row_dropping as row_dropping
from sepo.games import make_game
from sepo.policies.base import DecisionRequest
from sepo.policies.lm import LMPolicy

from .conftest import CONF, teach

pytestmark = pytest.mark.usefixtures("one_thread")

IPD = make_game(OmegaConf.load(CONF / "game" / "ipd.yaml"))
C, D = "COOPERATE", "DEFECT"
HISTORIES = [[], [D], [C], [D, C], [C, D, D], [C, C, C, C, D], [D, D, C, C, C, C], [C, D], [D, D, D]]


def ipd_request(opponent_moves: list[str], stream: int) -> DecisionRequest:
    state = IPD.reset(0)
    for move in opponent_moves:
        IPD.step(state, {0: C, 1: move})
    return DecisionRequest(IPD, state, 0, IPD.legal_actions(state, 0), np.random.default_rng([0, stream]))


def requests() -> list[DecisionRequest]:
    return [ipd_request(h, k) for k, h in enumerate(HISTORIES)]


def answer(moves: list[str]) -> str:
    """TFT with a reasoning line whose length differs by history, the action on the last line."""
    if not moves:
        return f"Start kind.\n{C}"
    if moves[-1] == C:
        return f"They cooperated.\n{C}"
    return f"They defected {len(moves)} rounds in, so I defect too, as before.\n{D}"


@pytest.fixture(scope="module")
def taught(tiny):
    rng = np.random.default_rng(0)
    histories = [list(rng.choice([C, D], size=rng.integers(0, 7))) for _ in range(64)]
    return teach(tiny, [(ipd_request(h, 0).messages, answer(h)) for h in histories], steps=80)


@pytest.fixture
def drops(monkeypatch):
    """How many rows each compaction kept (the loop really let rows go)."""
    kept = []
    select = row_dropping.select_rows
    monkeypatch.setattr(row_dropping, "select_rows", lambda cache, keep: kept.append(len(keep)) or select(cache, keep))
    return kept


def play(bundle, temperature: float, max_new_tokens: int = 24, **settings):
    model, tokenizer, cfg = bundle
    agent = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, settings), temperature, max_new_tokens, 0)
    return agent, agent.act_batch(requests(), return_logprobs=True)


def assert_same_play(a, b) -> None:
    assert [d.text for d in a] == [d.text for d in b]
    assert [d.action for d in a] == [d.action for d in b]
    assert [d.parsed for d in a] == [d.parsed for d in b]
    for x, y in zip(a, b):
        assert torch.equal(x.tokens.gen_ids, y.tokens.gen_ids)
        torch.testing.assert_close(x.tokens.logprobs, y.tokens.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("static_cache", [True, False])
@pytest.mark.parametrize("compact_at", [1.0, 0.75])
def test_rows_that_leave_as_they_stop_play_what_generate_plays(taught, drops, temperature, static_cache, compact_at):
    _, plain = play(taught, temperature, static_cache=static_cache, drop_stopped_rows=0)
    assert not drops
    _, dropping = play(taught, temperature, static_cache=static_cache, drop_stopped_rows=compact_at)
    assert_same_play(dropping, plain)
    lengths = sorted(len(d.tokens.gen_ids) for d in plain)
    assert lengths[0] < lengths[-1]  # the rows stop at different steps
    assert drops and drops[0] < len(HISTORIES)  # and left the batch as they did
    if compact_at == 1.0:
        assert len(drops) == len(set(lengths)) - 1  # at every step where some rows stopped, but the last


@pytest.mark.parametrize("static_cache", [True, False])
def test_rows_that_repeat_a_prompt_encode_it_once_and_play_what_generate_plays(taught, monkeypatch, static_cache):
    """Three samples of each of four states (each its own stream): the first pass carries four rows, and every
    row plays what generate, which encodes all twelve, gives it."""
    states = [h for h in HISTORIES[:4] for _ in range(3)]
    model, tokenizer, cfg = taught

    def answers(**settings):
        agent = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, settings), 1.0, 24, 0)
        return agent.act_batch([ipd_request(h, k) for k, h in enumerate(states)], return_logprobs=True)

    passes = []
    forward = row_dropping.forward_last
    monkeypatch.setattr(row_dropping, "forward_last", lambda *a: passes.append(a[1].shape) or forward(*a))
    plain = answers(static_cache=static_cache, drop_stopped_rows=0)
    assert not passes
    shared = answers(static_cache=static_cache, drop_stopped_rows=1.0)
    assert passes[0][0] == 4 and passes[0][1] > 1  # the prompts' pass: one row per state
    assert passes[1][0] == len(states)  # then every row draws its own tokens
    assert_same_play(shared, plain)
    assert len({d.text for d in plain}) > 4  # the copies of a state answered differently


def test_a_batch_decoded_with_cascade_attention_drops_rows_the_same(taught, drops):
    from sepo.lm.cascade_attention import use_cascade_attention

    model = taught[0]
    _, plain = play(taught, 1.0, drop_stopped_rows=0)
    use_cascade_attention(model)
    try:
        _, dropping = play(taught, 1.0, cascade_attention=True, drop_stopped_rows=1.0)
    finally:
        model.set_attn_implementation("sdpa")
    assert drops
    assert_same_play(dropping, plain)


def test_rows_that_never_answer_fall_back_after_their_own_cache(tiny, drops, monkeypatch):
    """The random model never writes an action: every row runs to the budget and is held, so its fallback is
    asked after the cache it left, and chooses as generate's path does."""
    _, plain = play(tiny, 1.0, max_new_tokens=6, drop_stopped_rows=0)
    asked = []
    continued = LMPolicy._continued_logits
    monkeypatch.setattr(
        LMPolicy,
        "_continued_logits",
        lambda self, encoded, rows, *a: asked.append(rows) or continued(self, encoded, rows, *a),
    )
    _, dropping = play(tiny, 1.0, max_new_tokens=6, drop_stopped_rows=1.0)
    assert not drops  # nobody stopped early
    assert sorted(r for rows in asked for r in rows) == list(range(len(HISTORIES)))
    assert not any(d.parsed for d in dropping)
    assert_same_play(dropping, plain)


def test_rows_that_end_their_turn_without_an_action_keep_their_cache_for_the_fallback(tiny, drops, monkeypatch):
    """A row that ends its turn early without an action leaves the batch with a copy of its cache, and its
    fallback chooses as a fresh pass over its whole prompt and answer does."""
    _, plain = play(tiny, 1.0, max_new_tokens=8, drop_stopped_rows=0)
    ending = {int(d.tokens.gen_ids[2]) for d in plain[::2]}  # every other row's third token: an end of turn below
    whole = []
    scored = LMPolicy._next_token_logits
    monkeypatch.setattr(
        LMPolicy, "_next_token_logits", lambda self, prompts, keys: whole.append(keys) or scored(self, prompts, keys)
    )
    model, tokenizer, cfg = tiny
    for drop in (0.0, 1.0):
        agent = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, {"drop_stopped_rows": drop}), 1.0, 8, 0)
        agent.eos_ids = set(agent.eos_ids) | ending
        if drop:
            dropping = agent.act_batch(requests(), return_logprobs=True)
        else:
            monkeypatch.setattr(agent, "prefix_cache", False)  # the fallback re-encodes every prompt whole
            reference = agent.act_batch(requests(), return_logprobs=True)
    ended = [i for i, d in enumerate(dropping) if int(d.tokens.gen_ids[-1]) in ending and len(d.tokens.gen_ids) < 8]
    assert ended and drops
    assert not any(d.parsed for d in dropping)
    assert [d.action for d in dropping] == [d.action for d in reference]
    assert [d.tokens.gen_ids.tolist() for d in dropping] == [d.tokens.gen_ids.tolist() for d in reference]
    assert sum(len(k) for k in whole) == len(HISTORIES)  # only the reference's: every dropped row was held


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_whole_episodes_reuse_their_prompts_after_rows_left(taught, temperature):
    """Whole IPD episodes in lockstep: each episode's encoding is kept before any row leaves, so its next
    decision reuses it; the games are generate's."""
    from sepo.arena import Match, play_matches
    from sepo.games.strategy import make_strategy

    model, tokenizer, cfg = taught
    matches = [Match(name, make_strategy(IPD.cfg, name), k) for name in ("TFT", "AlwaysD", "Random") for k in range(2)]
    runs = {}
    for drop in (0.0, 0.75):
        agent = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, {"drop_stopped_rows": drop}), temperature, 24, 0)
        recording = type(
            "Recording",
            (),
            {"name": "lm", "act_batch": lambda self, r, agent=agent: agent.act_batch(r, return_logprobs=True)},
        )()
        records = play_matches(IPD, recording, matches, 0, keep_trace=True)
        runs[drop] = [[(d.text, d.tokens.gen_ids.tolist(), d.tokens.logprobs) for _, _, d in r.trace] for r in records]
    for a, b in zip(runs[0.75], runs[0.0]):
        assert [x[:2] for x in a] == [x[:2] for x in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(x[2], y[2], atol=1e-5, rtol=0)
