"""Chunked per-token log-probs (sepo/lm/logprobs.py) against the plain unchunked computation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from sepo.lm.logprobs import (
    chunked_logprobs_from_hidden,
    logprobs_from_hidden_reference,
    next_token_logits,
    token_logprobs,
    token_logprobs_reference,
)

from .conftest import CONF, ROOT, scores_and_gradient

pytestmark = pytest.mark.usefixtures("one_thread")


def padded_batch(tokenizer, texts: list[str], gen_lengths: list[int], vocab: int, seed: int = 0):
    """Left-padded prompts followed by right-padded random 'generated' tokens (generate's layout)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width_p, width_g = max(map(len, prompts)), max(gen_lengths)
    ids = torch.full((len(texts), width_p + width_g), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, (p, n) in enumerate(zip(prompts, gen_lengths)):
        ids[i, width_p - len(p) : width_p] = torch.tensor(p)
        ids[i, width_p : width_p + n] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, width_p - len(p) : width_p + n] = 1
    return ids, mask, width_p


TEXTS = [
    "Round 1 of 8. Your action?",
    "History:\nRound 1: you COOPERATE, opponent DEFECT.\nYour action?",
    "You are playing an iterated prisoner's dilemma.",
]


@pytest.mark.parametrize("chunk", [1, 3, 32, 1000])
def test_chunked_matches_unchunked_on_the_model(tiny, chunk):
    model, tokenizer, _ = tiny
    ids, mask, start = padded_batch(tokenizer, TEXTS, [17, 40, 5], len(tokenizer))
    with torch.no_grad():
        chunked = token_logprobs(model, ids, mask, start, chunk=chunk)
        reference = token_logprobs_reference(model, ids, mask, start)
    valid = mask[:, start:].bool()
    assert chunked.shape == reference.shape == (3, 40)
    torch.testing.assert_close(chunked[valid], reference[valid], atol=1e-5, rtol=0)


def test_temperature_divides_the_logits(tiny):
    model, tokenizer, _ = tiny
    ids, mask, start = padded_batch(tokenizer, TEXTS, [9, 4, 12], len(tokenizer))
    with torch.no_grad():
        chunked = token_logprobs(model, ids, mask, start, chunk=4, temperature=0.7)
        reference = token_logprobs_reference(model, ids, mask, start, temperature=0.7)
    valid = mask[:, start:].bool()
    torch.testing.assert_close(chunked[valid], reference[valid], atol=1e-5, rtol=0)


def test_padding_does_not_change_a_row(tiny):
    """Position ids from the mask: a left-padded row scores like the same row alone."""
    model, tokenizer, _ = tiny
    ids, mask, start = padded_batch(tokenizer, TEXTS, [8, 8, 8], len(tokenizer))
    with torch.no_grad():
        batch = token_logprobs(model, ids, mask, start)
        row = 2  # the shortest prompt carries the most padding
        keep = mask[row].bool()
        alone = token_logprobs(model, ids[row : row + 1, keep], mask[row : row + 1, keep], int(keep[:start].sum()))
    torch.testing.assert_close(batch[row], alone[0], atol=1e-5, rtol=0)


def test_a_shared_prefix_run_once_gives_the_same_values_and_gradients(tiny):
    """shared_prefix: the common rules run as a batch of one, their KV cache repeated; rows laid out
    [prefix][padding][rest] (LMPolicy.pack_shared). Same log-probs and parameter gradients as the
    plain left-padded pass, and the gradient reaches the weights through the cached prefix."""
    from sepo.policies.lm import LMPolicy

    model, tokenizer, _ = tiny
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "model" / "tiny.yaml"), {"prefix_cache": True})
    policy = LMPolicy(model, tokenizer, cfg, 1.0, 8, 0)
    rules = "You are playing an iterated prisoner's dilemma against one opponent for eight rounds. "
    prompts = [tokenizer(rules + t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    g = torch.Generator().manual_seed(1)
    gens = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (6, 11, 3)]
    shared = policy.shared_prefix_length(prompts)
    assert shared >= 16

    def plain():
        ids, mask, start = policy.pack(prompts, gens)
        return token_logprobs(model, ids, mask, start, chunk=4), mask[:, start:].bool()

    def shared_once():
        ids, mask, start = policy.pack_shared(prompts, shared, gens)
        return token_logprobs(model, ids, mask, start, chunk=4, shared_prefix=shared), mask[:, start:].bool()

    (values, grads), (shared_values, shared_grads) = (
        scores_and_gradient(model, plain),
        scores_and_gradient(model, shared_once),
    )
    torch.testing.assert_close(shared_values, values, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_grads, grads, atol=1e-4, rtol=1e-4)
    ids, mask, start = policy.pack_shared(prompts, shared, gens)
    with pytest.raises(ValueError, match="shared_prefix"):
        token_logprobs(model, ids, mask, shared, shared_prefix=shared)


def test_next_token_logits_are_the_models(tiny):
    model, tokenizer, _ = tiny
    ids, mask, _ = padded_batch(tokenizer, TEXTS, [0, 0, 0], len(tokenizer))
    with torch.no_grad():
        ours = next_token_logits(model, ids, mask)
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[
            :, -1
        ]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_hidden_level_chunking_values_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(2, 37, 16, requires_grad=True)
    weight = (torch.randn(500, 16) * 0.3).requires_grad_()
    targets = torch.randint(500, (2, 37))
    chunked = chunked_logprobs_from_hidden(hidden, weight, targets, chunk=8, softcap=5.0)
    reference = logprobs_from_hidden_reference(hidden, weight, targets, softcap=5.0)
    torch.testing.assert_close(chunked, reference, atol=1e-5, rtol=0)
    g_chunked = torch.autograd.grad(chunked.sum(), (hidden, weight))
    g_reference = torch.autograd.grad(reference.sum(), (hidden, weight))
    for a, b in zip(g_chunked, g_reference):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_logprob_benchmark_chunked_uses_a_tenth_of_the_memory():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "logprob",
            "--vocab",
            "65536",
            "--positions",
            "512",
            "--hidden",
            "64",
            "--chunk",
            "32",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["unchunked_peak_mb"] > 100
    assert result["chunked_peak_mb"] < result["unchunked_peak_mb"] / 10


def row_major(t: torch.Tensor) -> bool:
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    return t.stride() == tuple(reversed(strides))


def test_densely_strided_copies_a_slice_that_only_counts_as_contiguous():
    """A [1, 1, H] slice of [1, T, H] is `is_contiguous()` yet strided by T x H: matmul would then copy the
    other operand per row. It is copied into row-major strides, with its values; a row-major tensor is
    handed back as it is."""
    from sepo.lm.logprobs import densely_strided

    hidden = torch.randn(1, 7, 5)
    last = hidden[:, -1:]
    assert last.is_contiguous() and not row_major(last)
    dense = densely_strided(last)
    assert row_major(dense) and torch.equal(dense, last)
    assert densely_strided(hidden) is hidden
    chunk = torch.randn(2, 9, 5)[:, 2:5]
    assert not chunk.is_contiguous() and row_major(densely_strided(chunk))


def test_the_loaded_models_head_reads_row_major_states_whatever_slices_them(tiny):
    """`logits_to_keep` hands the output head a strided slice; the loader's pre-hook (registered on every
    model it loads) makes it row-major before the head multiplies, and changes no logit."""
    model, tokenizer, _ = tiny
    head = model.get_output_embeddings()
    seen: list[bool] = []
    handle = head.register_forward_pre_hook(lambda _m, args: seen.append(row_major(args[0])))
    try:
        ids = torch.tensor([tokenizer("Round 1 of 8. Your action?", add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            kept = model(input_ids=ids, logits_to_keep=1).logits
            full = model(input_ids=ids).logits
    finally:
        handle.remove()
    assert seen == [True, True]
    torch.testing.assert_close(kept[:, -1], full[:, -1])
