"""The language-model agent (sepo/policies/lm.py): batching, stopping, fallback, log-probs, eval.

Two tiny models: the random one as built (it never writes a legal action line, so every decision
takes the fallback), and a copy taught in a few seconds to answer IPD prompts TFT-style with a
reasoning line and the action on the last line (so answers parse and stop early, at different
lengths per row).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sepo.builders import load_model_and_tokenizer
from sepo.errors import NonFiniteLogits
from sepo.games import make_game
from sepo.games.base import holds_action
from sepo.lm.batching import score_passes
from sepo.lm.decoding import IncrementalText
from sepo.lm.logprobs import next_token_logits, token_logprobs
from sepo.lm.sampling import RowSampler, counter_uniforms
from sepo.policies.base import DecisionRequest
from sepo.policies.lm import LMPolicy
from sepo.policies.lm_answers import ActionStoppingCriteria, fallback_question

from .conftest import CONF, ROOT, model_cfg, read_results, teach

pytestmark = pytest.mark.usefixtures("one_thread")

C, D = "COOPERATE", "DEFECT"
VECTORS = ["[1, 0, 2]", "[1, 2, 0]", "[0, 0, 1]"]  # legal actions that share their first tokens


def game(name: str):
    return make_game(OmegaConf.load(CONF / "game" / f"{name}.yaml"))


IPD = game("ipd")


def ipd_request(opponent_moves: list[str], legal: list[str] | None = None) -> DecisionRequest:
    state = IPD.reset(0)
    for move in opponent_moves:
        IPD.step(state, {0: C, 1: move})
    return DecisionRequest(IPD, state, 0, legal or IPD.legal_actions(state, 0), np.random.default_rng(0))


def first_requests(name: str, n: int) -> list[DecisionRequest]:
    """The agent's first decision in n episodes of game `name` (first legal moves until then)."""
    g, out = game(name), []
    for seed in range(n):
        state = g.reset(seed)
        while 0 not in g.to_act(state):
            g.step(state, {p: g.legal_actions(state, p)[0] for p in g.to_act(state)})
        out.append(DecisionRequest(g, state, 0, g.legal_actions(state, 0), np.random.default_rng(seed)))
    return out


def tft_answer(opponent_moves: list[str]) -> str:
    if not opponent_moves:
        return f"Start kind.\n{C}"
    return f"They cooperated.\n{C}" if opponent_moves[-1] == C else f"They defected, so I defect too.\n{D}"


HISTORIES = [[], [D], [C], [D, C], [C, D, D], [C, C, C, C, D], [D, D, C, C, C, C]]


@pytest.fixture(scope="module")
def taught(tiny):
    """The tiny model after 80 Adam steps on TFT answers (loss on the answer tokens, no EOS)."""
    rng = np.random.default_rng(0)
    histories = [list(rng.choice([C, D], size=rng.integers(0, 7))) for _ in range(64)]
    return teach(tiny, [(ipd_request(h).messages, tft_answer(h)) for h in histories], steps=80)


def policy(bundle, temperature=0.0, max_new_tokens=24, seed=0, **kwargs) -> LMPolicy:
    model, tokenizer, cfg = bundle
    return LMPolicy(model, tokenizer, cfg, temperature, max_new_tokens, seed, **kwargs)


# --------------------------------------------------------------------------- generation
def test_taught_model_parses_and_stops_at_the_action(taught):
    decisions = policy(taught).act_batch([ipd_request(h) for h in HISTORIES])
    assert all(d.parsed for d in decisions), [d.text for d in decisions]
    assert all(d.text.splitlines()[-1] == d.action for d in decisions)  # nothing generated after the stop
    assert len({len(d.text) for d in decisions}) > 1  # rows stopped at different lengths


@pytest.mark.parametrize("which", ["taught", "tiny"])
def test_batched_equals_one_at_a_time_under_greedy_decoding(which, request):
    bundle = request.getfixturevalue(which)
    requests = [ipd_request(h) for h in HISTORIES]  # prompts of different lengths: left padding
    agent = policy(bundle, max_new_tokens=12 if which == "tiny" else 24)
    batched = agent.act_batch(requests, return_logprobs=True)
    single = [agent.act_batch([r], return_logprobs=True)[0] for r in requests]
    assert [(d.action, d.text, d.parsed) for d in batched] == [(d.action, d.text, d.parsed) for d in single]
    for a, b in zip(batched, single):
        assert torch.equal(a.tokens.gen_ids, b.tokens.gen_ids)
        torch.testing.assert_close(a.tokens.logprobs, b.tokens.logprobs, atol=1e-4, rtol=0)


def requests_with_streams(seed: int = 0) -> list[DecisionRequest]:
    """Fresh requests, each with its own episode stream (as the arena makes them)."""
    out = [ipd_request(h) for h in HISTORIES]
    for k, r in enumerate(out):
        r.rng = np.random.default_rng([seed, k])
    return out


def test_sampling_is_reproducible_and_leaves_the_global_rng_alone(taught):
    state = torch.get_rng_state()
    first = [d.text for d in policy(taught, temperature=1.5, seed=3).act_batch(requests_with_streams())]
    assert torch.equal(state, torch.get_rng_state())
    assert first == [d.text for d in policy(taught, temperature=1.5, seed=3).act_batch(requests_with_streams())]
    assert first != [d.text for d in policy(taught, temperature=1.5, seed=4).act_batch(requests_with_streams())]
    assert first != [d.text for d in policy(taught, temperature=1.5, seed=3).act_batch(requests_with_streams(1))]
    streamless = requests_with_streams()  # requests without a stream draw from the policy's generator
    for r in streamless:
        r.rng = None
    assert [d.text for d in policy(taught, temperature=1.5, seed=3).act_batch(streamless)] == [
        d.text for d in policy(taught, temperature=1.5, seed=3).act_batch(streamless)
    ]


@pytest.mark.parametrize("which", ["taught", "tiny"])
def test_a_rows_sample_does_not_depend_on_its_batch(which, request):
    """Per-row generators: sampled answers are the same batched, one at a time, or beside others."""
    bundle = request.getfixturevalue(which)
    agent = policy(bundle, temperature=1.0, max_new_tokens=12)
    batched = [d.text for d in agent.act_batch(requests_with_streams())]
    single = [agent.act_batch([r])[0].text for r in requests_with_streams()]
    assert batched == single
    extra = requests_with_streams(7)[:3]
    mixed = agent.act_batch(extra[:2] + requests_with_streams() + extra[2:])
    assert [d.text for d in mixed[2:-1]] == batched


def test_checkpoint_sampling_settings_do_not_truncate_the_distribution(taught):
    """A generation config with top_k=1 would make sampling greedy; the policy samples plainly."""
    greedy = [d.text for d in policy(taught).act_batch(requests_with_streams())]
    config = taught[0].generation_config
    config.top_k = 1
    try:
        sampled = [d.text for d in policy(taught, temperature=1.5).act_batch(requests_with_streams())]
    finally:
        config.top_k = None
    assert sampled != greedy


# --------------------------------------------------------------------------- stopping criterion
def _criterion_call(tokenizer, requests, texts, think_prefix=None, prompt_length=5):
    """Run the criterion on crafted rows: `prompt_length` pad tokens, then each text right-padded."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), prompt_length + width), tokenizer.pad_token_id)
    for i, row in enumerate(rows):
        ids[i, prompt_length : prompt_length + len(row)] = torch.tensor(row)
    stop = ActionStoppingCriteria(tokenizer, prompt_length, requests, think_prefix)
    return stop, stop(ids, None)


def test_stopping_criterion_per_row(tiny):
    _, tokenizer, _ = tiny
    texts = [
        f"Because.\n{C}",
        f"<think>\n{C}",
        f"<think>\nhmm\n</think>\n{D}",
        f"{C} is nice",
        f"{D}\n\n",
        f"reasoning\n{C}",
        f"ok</think>\n{C}",
        "no action here",
    ]
    prefix = [False] * 5 + [True, True, False]  # rows 5 and 6: the prompt opened <think>
    requests = [ipd_request([]) for _ in texts]
    stop, result = _criterion_call(tokenizer, requests, texts, prefix)
    assert result.dtype == torch.bool
    assert result.tolist() == [True, False, True, False, True, False, True, False]
    assert [s is not None for s in stop.stop_at] == result.tolist()


def test_stopping_criterion_fires_once_the_line_completes_and_stays(tiny):
    _, tokenizer, _ = tiny
    ids = tokenizer(f"I think so.\n{D}\n", add_special_tokens=False)["input_ids"]
    done_at = tokenizer(f"I think so.\n{D}", add_special_tokens=False)["input_ids"]
    stop = ActionStoppingCriteria(tokenizer, 0, [ipd_request([])])
    fired = [bool(stop(torch.tensor([ids[:n]]), None)[0]) for n in range(1, len(ids) + 1)]
    assert fired == [n >= len(done_at) for n in range(1, len(ids) + 1)]
    assert stop.stop_at == [len(done_at)]  # the first stop is kept


def test_holds_action_rules():
    legal = [C, D]
    assert holds_action(f"Action: **{C}**", IPD, legal)
    assert not holds_action(f"<think>{C}", IPD, legal)
    assert holds_action(f"<think>x</think>\n{D}", IPD, legal)
    assert not holds_action(f"{C}\n<think>", IPD, legal)


# --------------------------------------------------------------------------- constrained fallback
def test_fallback_on_a_model_that_never_answers(tiny):
    requests = [ipd_request(h) for h in HISTORIES]
    agent = policy(tiny, max_new_tokens=8)
    decisions = agent.act_batch(requests, return_logprobs=True)
    assert not any(d.parsed for d in decisions)  # parse rate 0
    assert all(d.action in (C, D) for d in decisions)
    # the choice is the argmax of the first-token logits after the elicitation question
    for request, d in zip(requests, decisions):
        messages = request.messages + [
            {"role": "assistant", "content": d.text},
            {"role": "user", "content": fallback_question(IPD, request.legal)},
        ]
        prompt = agent.render(messages, answer_now=True)
        logits = next_token_logits(agent.model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long))
        firsts = [agent.action_ids(a)[0] for a in request.legal]
        assert d.action == request.legal[int(logits[0, firsts].argmax())]
        # training sees what the policy sampled (the fallback is part of the environment, docs/spec.md §4.3)
        assert d.tokens.fallback
        assert d.tokens.prompt_ids.tolist() == agent.render(request.messages)
        assert agent.tokenizer.decode(d.tokens.gen_ids.tolist(), skip_special_tokens=True) == d.text


def test_the_fallback_after_the_generations_cache_chooses_as_padded_rows(tiny):
    """`model.prefix_cache`: the fallback's question is encoded after the generate call's cache, and every
    forced action is the one padded rows of whole prompts choose for the same answers."""
    agent = policy(tiny, temperature=1.0, max_new_tokens=8)
    assert agent.prefix_cache
    requests = [ipd_request(h) for h in HISTORIES]
    decisions = agent.act_batch(requests)
    assert not any(d.parsed for d in decisions)  # every action comes from the fallback
    padded = agent._fallback(requests, [d.text for d in decisions])  # no cache given: whole prompts
    assert [d.action for d in decisions] == padded


@pytest.mark.parametrize("which", ["taught", "tiny"])
def test_the_fallbacks_question_asked_after_the_generations_cache_is_a_fresh_pass(which, request):
    """With `model.prefix_cache` the fallback encodes only its question, after what the generate call
    encoded: the prompt (the rules shared in round 1, each episode's earlier prompt reused in round 2) and
    the answer up to its last token fed back. Its logits are a fresh pass's over the whole question, for
    rows stopped early (taught) and rows cut by the budget (tiny)."""
    agent = policy(request.getfixturevalue(which), temperature=1.0, max_new_tokens=12)
    requests = [ipd_request(h) for h in HISTORIES]
    answer_reused = 0
    for round_ in range(2):
        answers, encoded = agent._generate(requests)
        question = [{"role": "user", "content": fallback_question(IPD, [C, D])}]
        prompts = [
            agent.render(r.messages + [{"role": "assistant", "content": a.text}] + question, answer_now=True)
            for r, a in zip(requests, answers)
        ]
        rows = list(range(len(requests)))
        for keys, logits in agent._continued_logits(encoded, rows, prompts, rows):
            for k, row in enumerate(keys):
                fresh = next_token_logits(agent.model, torch.tensor([prompts[row]]), torch.ones(1, len(prompts[row])))
                torch.testing.assert_close(logits[k], fresh[0], atol=1e-4, rtol=0)
                answer_reused += len(encoded.tokens[row]) > len(answers[row].prompt)
        agent.prompt_cache.round_over()
        if round_ == 0:
            assert len(agent.prompt_cache.held) == len(requests)  # round 2 reuses each episode's prompt
        for r in requests:
            IPD.step(r.state, {0: C, 1: D})
        requests = [DecisionRequest(IPD, r.state, 0, r.legal, np.random.default_rng(1)) for r in requests]
    assert answer_reused >= len(HISTORIES)  # the answers' tokens came from the cache, not a new pass


def test_fallback_question_lists_the_actions():
    assert fallback_question(IPD, [C, D]) == "State your final action (COOPERATE/DEFECT):"
    many = [str(i) for i in range(20)]
    assert fallback_question(IPD, many) == f"State your final action ({IPD.action_hint}):"


def test_constrained_decoding_over_multi_token_actions(tiny):
    """Vectors share their first tokens: the whole sequences are scored and the best is taken."""
    agent = policy(tiny, max_new_tokens=6)
    assert len({agent.action_ids(v)[0] for v in VECTORS}) == 1
    requests = [ipd_request(h, legal=VECTORS) for h in HISTORIES[:3]]
    decisions = agent.act_batch(requests, return_logprobs=True)
    for request, d in zip(requests, decisions):
        assert not d.parsed
        assert d.action in VECTORS
        prompt = agent.render(
            request.messages
            + [{"role": "assistant", "content": d.text}, {"role": "user", "content": fallback_question(IPD, VECTORS)}],
            answer_now=True,
        )
        scores = [agent.sequence_logprobs([prompt], [agent.action_ids(v)], batch=1)[0].sum() for v in VECTORS]
        assert d.action == VECTORS[int(torch.stack(scores).argmax())]


def test_neg_v2_fallback_is_always_legal(tiny):
    requests = first_requests("neg_v2", 2)
    decisions = policy(tiny, max_new_tokens=4).act_batch(requests)
    assert all(not d.parsed and d.action in r.legal for d, r in zip(decisions, requests))


def test_a_scoring_pass_never_holds_part_of_one_prompts_candidates_beside_anothers():
    """Small candidate sets share passes; a large one gets passes of its own, whole or split in `batch`s."""
    assert score_passes([2, 2, 2], 16) == [range(0, 6)]
    assert score_passes([125, 3, 3], 16)[-3:] == [range(96, 112), range(112, 125), range(125, 131)]
    assert score_passes([3, 20, 2], 16) == [range(0, 3), range(3, 19), range(19, 23), range(23, 25)]
    assert score_passes([0, 3, 0, 2], 4) == [range(0, 3), range(3, 5)]


def test_action_scores_do_not_depend_on_how_the_pairs_are_passed(tiny):
    """neg_v2's 125 vectors of two prompts, passed 7 or 300 rows at a time: the same log-probs."""
    agent = policy(tiny)
    requests = first_requests("neg_v2", 2)
    prompts = [agent.render(r.messages, answer_now=True) for r in requests]
    actions = [[agent.action_ids(a) for a in r.legal] for r in requests]
    small, large = agent.action_scores(prompts, actions, batch=7), agent.action_scores(prompts, actions, batch=300)
    for a, b in zip(small, large):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


# --------------------------------------------------------------------------- log-probs and probabilities
@pytest.mark.parametrize("which", ["taught", "tiny"])
def test_returned_logprobs_equal_a_fresh_teacher_forced_pass(which, request):
    bundle = request.getfixturevalue(which)
    agent = policy(bundle, temperature=0.8, max_new_tokens=10, logprob_chunk=4)
    for d in agent.act_batch([ipd_request(h) for h in HISTORIES], return_logprobs=True):
        prompt, gen = d.tokens.prompt_ids, d.tokens.gen_ids
        ids = torch.cat([prompt, gen])[None]
        with torch.no_grad():
            fresh = token_logprobs(bundle[0], ids, torch.ones_like(ids), len(prompt), temperature=0.8)[0]
        assert d.tokens.logprob_temperature == 0.8
        assert len(d.tokens.logprobs) == len(gen) > 0
        # recorded by the sampler while it drew the tokens: no second pass, the same numbers
        torch.testing.assert_close(d.tokens.logprobs, fresh, atol=1e-5, rtol=0)
        if d.parsed:
            assert bundle[1].decode(gen.tolist(), skip_special_tokens=True) == d.text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("prefix_cache,static_cache", [(True, True), (True, False), (False, True)])
def test_the_shared_prefix_and_the_static_cache_change_nothing(taught, temperature, prefix_cache, static_cache):
    """model.prefix_cache: the rules are encoded once and repeated; model.static_cache: the KV cache
    is preallocated. Answers and log-probs are those of transformers' plain dynamic cache."""
    model, tokenizer, cfg = taught
    plain_cfg = OmegaConf.merge(cfg, {"prefix_cache": False, "static_cache": False})
    cfg = OmegaConf.merge(cfg, {"prefix_cache": prefix_cache, "static_cache": static_cache})
    cached = LMPolicy(model, tokenizer, cfg, temperature, 24, 0)
    plain = LMPolicy(model, tokenizer, plain_cfg, temperature, 24, 0)
    prompts = [cached.render(r.messages) for r in requests_with_streams()]
    assert (cached.shared_prefix_length(prompts) >= 100) == prefix_cache
    assert plain.shared_prefix_length(prompts) == 0
    a = cached.act_batch(requests_with_streams(), return_logprobs=True)
    b = plain.act_batch(requests_with_streams(), return_logprobs=True)
    assert [d.text for d in a] == [d.text for d in b]
    for x, y in zip(a, b):
        assert torch.equal(x.tokens.gen_ids, y.tokens.gen_ids)
        torch.testing.assert_close(x.tokens.logprobs, y.tokens.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_policy_decoding_with_cascade_attention_plays_what_the_plain_cache_plays(taught, temperature, monkeypatch):
    """model.cascade_attention: decoding reads the rules every row shares once for the batch. Answers and
    log-probs are those of transformers' plain dynamic cache, and the cascade really ran."""
    import sepo.lm.cascade_attention as cascade
    from sepo.lm.cascade_attention import use_cascade_attention

    model, tokenizer, cfg = taught
    plain = LMPolicy(
        model, tokenizer, OmegaConf.merge(cfg, {"prefix_cache": False, "static_cache": False}), temperature, 24, 0
    )
    b = plain.act_batch(requests_with_streams(), return_logprobs=True)
    steps = []
    counted = cascade.decode_step_attention
    monkeypatch.setattr(cascade, "decode_step_attention", lambda *a: steps.append(a[1].shape[1]) or counted(*a))
    fast_cfg = OmegaConf.merge(cfg, {"prefix_cache": True, "static_cache": True, "cascade_attention": True})
    use_cascade_attention(model)
    try:
        # SEPO's rollout policy declines it (sepo_loop.training_parts): no cascaded step
        LMPolicy(model, tokenizer, fast_cfg, temperature, 24, 0, cascade_attention=False).act_batch(
            requests_with_streams()
        )
        assert not steps
        a = LMPolicy(model, tokenizer, fast_cfg, temperature, 24, 0).act_batch(
            requests_with_streams(), return_logprobs=True
        )
    finally:
        model.set_attn_implementation("sdpa")
    assert steps and min(steps) >= 100  # it ran, over the rules every row shares
    assert [d.text for d in a] == [d.text for d in b]
    for x, y in zip(a, b):
        assert torch.equal(x.tokens.gen_ids, y.tokens.gen_ids)
        torch.testing.assert_close(x.tokens.logprobs, y.tokens.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_bfloat16_policy_plays_the_same_answers_and_log_probs_with_packed_linears(taught, temperature):
    """model.packed_linears: passes without gradients multiply through oneDNN's prepacked bfloat16 weights, for
    speed alone: the same answers and log-probs bit for bit."""
    from sepo.lm.packed_linear import can_pack, packed_bytes, use_packed_linears

    if not can_pack(torch.zeros(1, dtype=torch.bfloat16)):
        pytest.skip("this CPU's oneDNN has no bfloat16 products")
    model, tokenizer, cfg = taught
    plain = copy.deepcopy(model).to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    assert use_packed_linears(packed) > 0
    a = policy((packed, tokenizer, cfg), temperature).act_batch(requests_with_streams(), return_logprobs=True)
    assert packed_bytes(packed) > 0  # the copies were used
    b = policy((plain, tokenizer, cfg), temperature).act_batch(requests_with_streams(), return_logprobs=True)
    assert [d.text for d in a] == [d.text for d in b]
    for x, y in zip(a, b):
        assert torch.equal(x.tokens.gen_ids, y.tokens.gen_ids)
        assert torch.equal(x.tokens.logprobs, y.tokens.logprobs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reusing_each_episodes_encoded_prompt_changes_nothing(taught, temperature):
    """Whole IPD episodes in lockstep: from round 2 on, each row reuses its episode's previous prompt
    encoding and encodes only the new history. Same games, answers and log-probs as encoding every
    prompt in full, and the reuse really happens."""
    from sepo.arena import Match, play_matches
    from sepo.games.strategy import make_strategy

    model, tokenizer, cfg = taught
    matches = [Match(name, make_strategy(IPD.cfg, name), k) for name in ("TFT", "AlwaysD", "Random") for k in range(2)]
    runs = {}
    for reuse in (True, False):
        agent = LMPolicy(
            model, tokenizer, OmegaConf.merge(cfg, {"prefix_cache": reuse, "static_cache": reuse}), temperature, 24, 0
        )
        planned = []
        plan = agent.prompt_cache.plan
        agent.prompt_cache.plan = lambda states, prompts, planned=planned, plan=plan: (
            planned.append(plan(states, prompts)[1]) or plan(states, prompts)
        )
        recording = type(
            "Recording",
            (),
            {"name": "lm", "act_batch": lambda self, r, agent=agent: agent.act_batch(r, return_logprobs=True)},
        )()
        records = play_matches(IPD, recording, matches, 0, keep_trace=True)
        runs[reuse] = [[(d.text, d.tokens.gen_ids.tolist(), d.tokens.logprobs) for _, _, d in r.trace] for r in records]
        if reuse:
            assert not any(planned[0])
            assert all(k > 100 for k in planned[-1])  # round 1 none, the last round all
    for a, b in zip(runs[True], runs[False]):
        assert [x[:2] for x in a] == [x[:2] for x in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(x[2], y[2], atol=1e-5, rtol=0)


def test_the_encoded_prompts_do_not_outlive_their_episodes(taught):
    """Each reused encoding is dropped once copied into the new cache, and the arena's `episodes_over`
    drops the last ones: nothing per episode is held through what runs after a `play` (SEPO's update)."""
    from sepo.arena import Match, play_matches
    from sepo.games.strategy import make_strategy
    from sepo.policies.recording import RecordingPolicy

    model, tokenizer, cfg = taught
    agent = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, {"prefix_cache": True, "static_cache": True}), 1.0, 24, 0)
    held, generate = [], agent._generate

    def generate_and_count(requests):
        answers = generate(requests)
        held.append(len(agent.prompt_cache.held))
        return answers

    agent._generate = generate_and_count
    matches = [Match(name, make_strategy(IPD.cfg, name), k) for name in ("TFT", "AlwaysD") for k in range(2)]
    records = play_matches(IPD, RecordingPolicy(agent), matches, 0)
    assert sum(r.decisions for r in records) == 4 * IPD.cfg.rounds
    assert held[1:] == [0] * (len(held) - 1)  # after each generate call, every entry it reused is gone
    assert agent.prompt_cache.held == {}
    assert agent.prompt_cache.written == {}


def test_incremental_text_equals_the_full_decode(tiny):
    _, tokenizer, _ = tiny
    rng = np.random.default_rng(0)
    sample = tokenizer(f"Round 3: they played {D}.\nI think so.\n{C}\n", add_special_tokens=False)["input_ids"]
    for ids in [sample] + [rng.integers(0, len(tokenizer), size=40).tolist() for _ in range(5)]:
        text = IncrementalText(tokenizer)
        for k, token in enumerate(ids):
            text.push(token)
            full = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
            if not full.endswith("\ufffd"):
                assert text.text == full


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_refuses_scores_no_token_can_be_drawn_from(bad, temperature):
    """A NaN or +inf score (weights blown up by a diverged update) used to end in an index error deep
    inside generate; -inf alone is an ordinary masked token."""
    scores = torch.tensor([[0.0, 1.0, -float("inf")], [0.0, bad, 1.0]])
    with pytest.raises(NonFiniteLogits, match="generation step 0"):
        RowSampler([0, 1], temperature=temperature, logprob_temperature=1.0)(None, scores)


def test_counter_sampler_draws_from_softmax_and_each_row_alone():
    logits = torch.tensor([2.0, 1.0, 0.0, -float("inf"), 0.5]).repeat(4000, 1)
    sampler = RowSampler(range(4000), temperature=1.0, logprob_temperature=1.0)
    drawn = sampler(None, logits).argmax(dim=1)
    freq = torch.bincount(drawn, minlength=5).double() / 4000
    probs = torch.softmax(logits[0].double(), 0)
    assert freq[3] == 0  # a token of probability 0 is never drawn
    assert torch.all((freq - probs).abs() < 4 * (probs * (1 - probs) / 4000).sqrt() + 1e-9)
    torch.testing.assert_close(sampler.logprobs[0], torch.log(probs[drawn]).float())
    # row k's uniform depends on (key k, step) only: the same whatever the rows beside it
    keys = np.arange(10, dtype=np.uint64)
    assert np.array_equal(counter_uniforms(keys, 3)[4:6], counter_uniforms(keys[4:6], 3))
    assert not np.array_equal(counter_uniforms(keys, 3), counter_uniforms(keys, 4))


@pytest.mark.parametrize("name", ["ipd", "kuhn", "neg_v1", "neg_v2"])
def test_action_probabilities_sum_to_one(tiny, name):
    requests = first_requests(name, 2)
    for estimate, r in zip(policy(tiny, temperature=0.8).action_probabilities(requests, samples=4), requests):
        probs = estimate.probs
        assert list(probs) == r.legal
        assert list(estimate.se) == r.legal
        assert estimate.samples.shape == (4, len(r.legal))
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
        assert min(probs.values()) >= 0
        # the random model never writes an action line: every sample is the fallback's action, counted
        assert estimate.rao_blackwellised == 0.0
        assert set(np.unique(estimate.samples)) <= {0.0, 1.0}


def test_action_first_probabilities_are_the_renormalised_sequence_probabilities(tiny):
    agent = policy(tiny, temperature=0.5)
    request = ipd_request([D], legal=VECTORS)
    (probs,) = agent.action_first_probabilities([request])
    prompt = agent.render(request.messages, answer_now=True)
    logp = torch.stack([agent.sequence_logprobs([prompt], [agent.action_ids(v)], 0.5)[0].sum() for v in VECTORS])
    # float32 through two code paths (batched with a shared prefix vs one sequence at a time): ~1e-6
    # apart with transformers 5.24; a wrong token or temperature would be >= 1e-3 off
    assert list(probs.values()) == pytest.approx(torch.softmax(logp.double(), 0).tolist(), abs=1e-5)


# --------------------------------------------------------------------------- real architectures
@pytest.mark.parametrize("name,thinking", [("gemma4", False), ("qwen", False), ("qwen", True)])
def test_real_architectures(name, thinking, request):
    """Tiny random Gemma 4 (token type ids, KV sharing) and Qwen 3.5 (hybrid linear attention; with
    thinking the prompt opens <think>) through the same paths: batching, fallback, log-probs."""
    path = request.getfixturevalue(f"{name}_dir")
    cfg = model_cfg(name, path=str(path), thinking=thinking, dtype="float32")  # bfloat16 would blur the checks
    model, tokenizer = load_model_and_tokenizer(cfg, path, device="cpu")
    agent = LMPolicy(model, tokenizer, cfg, 0.0, 6, 0)
    requests = [ipd_request(h) for h in HISTORIES[:3]] + [ipd_request([C], legal=VECTORS)]
    batched = agent.act_batch(requests, return_logprobs=True)
    single = [agent.act_batch([r], return_logprobs=True)[0] for r in requests]
    assert [(d.action, d.text) for d in batched] == [(d.action, d.text) for d in single]
    for r, d in zip(requests, batched):
        assert d.action in r.legal
        assert not d.parsed
        ids = torch.cat([d.tokens.prompt_ids, d.tokens.gen_ids])[None]
        with torch.no_grad():
            fresh = token_logprobs(
                model, ids, torch.ones_like(ids), len(d.tokens.prompt_ids), **agent.extra_inputs(ids)
            )[0]
        torch.testing.assert_close(d.tokens.logprobs, fresh, atol=1e-4, rtol=0)
    for estimate in agent.action_probabilities(requests, samples=2):
        assert sum(estimate.probs.values()) == pytest.approx(1.0)


# --------------------------------------------------------------------------- wiring
def test_importing_policies_does_not_load_torch():
    code = (
        "import sys, sepo.policies, sepo.stages.evaluate; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch loaded'; "
        "from sepo.policies import LMPolicy; print(LMPolicy.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "LMPolicy"


@pytest.mark.parametrize(
    "game", ["ipd", *(pytest.param(g, marks=pytest.mark.slow) for g in ("auction", "neg_v1", "neg_v2", "kuhn"))]
)
def test_lm_eval_end_to_end_through_the_cli_on_every_game(cli, tmp_path, monkeypatch, game):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # see one_thread
    proc = cli(
        "stage=eval",
        "model=tiny",
        f"game={game}",
        "logger=none",
        "eval.episodes_per_opponent=2",
        "eval.max_new_tokens=8",
        "eval.action_samples=4",
        f"paths.root_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(tmp_path)
    opponents = {o["name"] for o in results["per_opponent"]}
    assert results["model"] == "tiny"
    assert results["episodes"] == 2 * len(opponents) == len(results["per_episode"])
    assert 0.0 <= results["metrics"]["parse_rate"] <= 1.0
    assert "parse_rate" in results["se"]
    rounds = {"ipd": 8, "auction": 6, "neg_v1": 4, "neg_v2": 4, "kuhn": 6}[game]
    if game == "kuhn":  # one or two agent decisions per hand; the exact exploitability of the LM's policy
        assert all(rounds <= e["decisions"] <= 2 * rounds for e in results["per_episode"])
        assert 0.0 <= results["metrics"]["exploit_exact"] <= 1.5
        assert results["se"]["exploit_exact"] >= 0.0
        assert results["played_table"]["samples_per_state"] == 4
        assert len(results["played_table"]["se"]) == 12
        assert "BestResponse" in opponents  # Kuhn's default exploit pool
    else:
        assert all(e["decisions"] == rounds for e in results["per_episode"])


def test_rollout_benchmark_runs_and_reports_json(tmp_path):
    env = {**os.environ, "PROJECT_ROOT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "rollout", "--episodes", "4", "--max-new-tokens", "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 4
    assert result["decisions"] == 4 * 8
    assert result["same_episodes"]
    assert result["batched_per_s"] > 0
    assert result["sequential_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["batched_per_s"] / result["sequential_per_s"], rel=0.01)
