"""The probability that a language model, *as it plays*, ends its answer with each legal action.

An SFT'd model writes a reasoning line first and its action on the last line, so the probability
of an action as the first thing it says is not its policy (measured on tiny IPD: P(COOPERATE)
0.294 read that way, 0.630 played). This module estimates the policy that plays: the same prompt,
sampling temperature, stopping rule, parser and constrained fallback as `LMPolicy.act_batch`.

The estimator (Rao-Blackwellised sampling). For each request, K answers are sampled exactly as in
play. Each sampled answer X gives one vector w(X) over the legal actions, and the estimate is the
mean of the K vectors, with SE = std / sqrt(K):

- If X ended with an action line (line l, after the text z before it) and its tokens are those of
  the tokenizer's own encoding of l: let t be l with the action replaced by a slot. Every legal b
  whose line t[b] parses as b, stops the answer exactly at its end and fits the token budget gives
  a complete answer z + t[b]; w(X)[b] is proportional to p(t[b] | prompt, z), scored exactly
  (teacher-forced, at the sampling temperature).
- Otherwise (the answer needed the fallback, or the line was written in an unusual tokenization),
  w(X) is the one-hot vector of the action actually played.

Why it is unbiased: let Z(X) = (z, t) in the first case and Z(X) = X in the second. The answers
with Z = (z, t) are exactly {z + t[b]}, each of probability P(z) p(t[b] | z), so w(X) is
P(final action | Z(X)) and its mean over samples is P(final action) (tower rule). It averages out
the last line's coin flip: with a reasoning line that leaves the action open, one sample gives the
whole distribution. With temperature 0 the policy is deterministic: one greedy answer, one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import Any

import numpy as np

from sepo.forked import forked_map, split_round_robin
from sepo.games.base import holds_action
from sepo.policies.base import DecisionRequest

# `policy` below is an `LMPolicy` and `answer` its `Answer` (sepo/policies/lm.py, which uses this
# module: it is not imported here, so that imports go one way)


@dataclass
class ActionEstimate:
    """A policy's probability of ending with each legal action at one state, with standard errors.

    `samples` is [K, |legal|]: one probability vector per sampled answer (their mean is `probs`);
    `rao_blackwellised` is the share of samples scored exactly rather than counted.
    """

    probs: dict[str, float]
    se: dict[str, float]
    samples: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    rao_blackwellised: float = 0.0


def exact_estimate(probs: dict[str, float]) -> ActionEstimate:
    """A distribution known exactly (a scripted strategy): standard errors 0."""
    return ActionEstimate(dict(probs), {a: 0.0 for a in probs}, np.array([list(probs.values())]), 1.0)


def sample_requests(requests: list[DecisionRequest], samples: int, seed: int) -> list[DecisionRequest]:
    """K copies of every request, each with its own sampling stream keyed by (seed, request, copy).

    Copies share the request's state (nothing mutates it while answering), so the rules and the
    history are the same prompt; only the random stream differs.
    """
    return [
        replace(r, rng=np.random.default_rng([int(seed), i, k])) for i, r in enumerate(requests) for k in range(samples)
    ]


def action_line_start(text: str) -> int:
    """Where the last non-empty line of `text` begins (0 when it is the first line)."""
    stripped = text.rstrip()
    return stripped.rfind("\n") + 1


def line_template(line: str, action: str) -> str | None:
    """The action line with its (last) action replaced by a slot, or None if the action is not in it."""
    at = line.rfind(action)
    if at < 0:
        return None
    return line[:at] + "{}" + line[at + len(action) :]


@dataclass
class Alternative:
    """One complete answer z + t[b] that the sampled answer stands for: scored after `context`."""

    action: str
    tokens: list[int]


def alternatives(
    policy: Any, request: DecisionRequest, answer: Any, action: str
) -> tuple[list[int], list[Alternative]] | None:
    """The context (prompt + z tokens) and the complete alternative answers, or None when the sample
    is counted instead (the line does not start at a token boundary, or its tokens are not the
    tokenizer's own encoding of it).
    """
    start = action_line_start(answer.text)
    line = answer.text[start:]
    template = line_template(line, action)
    if template is None:
        return None
    z = _token_prefix(policy, answer.generated, answer.text[:start])
    if z is None or answer.generated[z:] != policy.action_ids(line):
        return None
    head = answer.view[: len(answer.view) - len(answer.text)] + answer.text[:start]  # what parsing sees before l
    out = []
    for b in request.legal:
        tokens = policy.action_ids(template.format(b))
        if z + len(tokens) <= policy.max_new_tokens and _stops_exactly_at_end(policy, request, head, tokens, b):
            out.append(Alternative(b, tokens))
    if action not in [alt.action for alt in out]:
        return None  # the sampled answer must be one of its own alternatives; else count it
    return list(answer.prompt) + list(answer.generated[:z]), out


def _token_prefix(policy: Any, generated: list[int], text: str) -> int | None:
    """The number of leading generated tokens whose text is exactly `text`, or None.

    Searched from the end: `text` is everything but the short action line, so a few decodes do.
    """
    for k in range(len(generated), -1, -1):
        decoded = policy.tokenizer.decode(generated[:k], skip_special_tokens=True)
        if decoded == text:
            return k
        if len(decoded) < len(text):
            return None
    return None


def _stops_exactly_at_end(policy: Any, request: DecisionRequest, head: str, tokens: list[int], action: str) -> bool:
    """Whether the stopping rule, fed `tokens` after `head`, first fires at the last token, on `action`."""
    for j in range(1, len(tokens) + 1):
        text = head + policy.tokenizer.decode(tokens[:j], skip_special_tokens=True)
        if holds_action(text, request.game, request.legal):
            return j == len(tokens) and request.game.parse_action(text, request.legal) == action
    return False


def scores_by_request(
    policy: Any, contexts: list[list[int]], scored: list[tuple[int, list[Alternative]]], samples: int
) -> list[Any]:
    """Every alternative's log-prob, one pass per request: a request's contexts all start with its whole
    prompt, which one cached pass then serves for all of its rows (`shared_prefix_length`). In passes of
    `score_batch` rows the prompt was encoded once per pass instead (Kuhn's table on a 135M model: 48
    prompt passes where 12 do, a third of a read's time). A pass holds K x |alternatives| rows of a few
    answer tokens each (Kuhn: 2 alternatives)."""
    scores: list[Any] = []
    for _, group in groupby(range(len(scored)), key=lambda k: scored[k][0] // samples):
        rows = list(group)
        actions = [[alt.tokens for alt in scored[k][1]] for k in rows]
        batch = sum(map(len, actions))
        scores += policy.action_scores([contexts[k] for k in rows], actions, policy.logprob_temperature, batch=batch)
    return scores


def estimate(policy: Any, requests: list[DecisionRequest], samples: int, seed: int) -> list[ActionEstimate]:
    """`ActionEstimate` of every request from `samples` answers each, then every exact score in one
    batched scoring pass.

    The K answers of one request are sampled in one generate call: they share the whole prompt, so
    it is encoded once for all K rows (with `model.prefix_cache`; 2.2x faster than one call for the
    whole table on tiny Kuhn, whose rows then each encode their own prompt). The requests are
    independent, so a policy with `workers` > 1 estimates them split across that many forked
    processes (`sepo.forked`); each copy keeps the sampling stream keyed by its place in `requests`.
    """
    if policy.temperature == 0:
        samples = 1  # greedy decoding: the one answer is the policy
    copies = sample_requests(requests, samples, seed)
    parts = split_round_robin(len(requests), int(getattr(policy, "workers", 1)))
    found = forked_map(
        lambda part: estimate_copies(policy, [copies[i * samples : (i + 1) * samples] for i in part]), parts
    )
    out: list[ActionEstimate | None] = [None] * len(requests)
    for part, estimates in zip(parts, found):
        for i, e in zip(part, estimates):
            out[i] = e
    return out  # type: ignore[return-value]


def estimate_copies(policy: Any, groups: list[list[DecisionRequest]]) -> list[ActionEstimate]:
    """The estimate of each group of sampled copies of one request (`sample_requests`)."""
    copies = [c for group in groups for c in group]
    samples = len(groups[0]) if groups else 0
    answers, decisions = [], []
    for group in groups:
        part = policy.answer(group)
        answers += part[0]
        decisions += part[1]
    return estimates_from_answers(policy, copies, answers, decisions, samples)


def estimates_from_answers(
    policy: Any, copies: list[DecisionRequest], answers: list[Any] | None, decisions: list[Any], samples: int
) -> list[ActionEstimate]:
    """The estimate of each request from its `samples` consecutive copies' answers (`sample_requests`'
    order), already sampled: what `estimate_copies` does after sampling, and what a SEPO batch that trains on
    the same answers (`sepo.training.exact_values`) reads its table from. Without `answers` (a policy that
    writes no text) every sample is counted."""
    rows: list[np.ndarray] = []
    scored: list[tuple[int, list[Alternative]]] = []  # (row, its alternatives)
    contexts: list[list[int]] = []
    for index, (request, decision) in enumerate(zip(copies, decisions)):
        row = np.zeros(len(request.legal))
        row[request.legal.index(decision.action)] = 1.0
        rows.append(row)
        found = (
            alternatives(policy, request, answers[index], decision.action)
            if answers is not None and decision.parsed and policy.temperature > 0
            else None
        )
        if found is not None and len(found[1]) > 1:
            contexts.append(found[0])
            scored.append((index, found[1]))

    if scored:
        scores = scores_by_request(policy, contexts, scored, samples)
        for (index, alts), logp in zip(scored, scores):
            weights = np.exp(logp.double().numpy() - float(logp.max()))
            row = np.zeros(len(copies[index].legal))
            for alt, w in zip(alts, weights / weights.sum()):
                row[copies[index].legal.index(alt.action)] = w
            rows[index] = row

    out = []
    for i, request in enumerate(copies[::samples]):
        block = np.stack(rows[i * samples : (i + 1) * samples])
        mean = block.mean(axis=0)
        se = block.std(axis=0, ddof=1) / np.sqrt(samples) if samples > 1 else np.zeros_like(mean)
        exact = sum(1 for index, _ in scored if i * samples <= index < (i + 1) * samples)
        out.append(
            ActionEstimate(
                dict(zip(request.legal, mean.tolist())), dict(zip(request.legal, se.tolist())), block, exact / samples
            )
        )
    return out
