"""Sequences scored as one prefix tree (sepo/lm/prefix_tree.py) against padded rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sepo.lm.prefix_tree import (
    encode_root,
    pack_tree,
    root_length,
    tree_passes,
    tree_size,
    tree_token_logprobs,
)

from .conftest import scores_and_gradient

pytestmark = pytest.mark.usefixtures("one_thread")

#: an episode's decisions: the rules, then a history that grows, then an answer (the last tokens)
EPISODE = [
    [5, 6, 7, 8, 20, 21, 90, 91],
    [5, 6, 7, 8, 20, 21, 22, 23, 92],
    [5, 6, 7, 8, 20, 21, 22, 23, 24, 93, 94],
    [5, 6, 7, 8, 30, 95],  # another episode: shares the rules only
    [5, 6, 7, 8, 20, 21, 90, 91],  # the same sequence twice: nothing new to encode
]


def rules_then_random(tokenizer, lengths: tuple[int, ...], seed: int) -> tuple[list[int], list[list[int]]]:
    """A game's rules (tokens) and sequences that start with them, then random tokens of `lengths`."""
    rules = tokenizer(
        "You are playing an iterated prisoner's dilemma against one opponent for eight rounds.\n",
        add_special_tokens=False,
    )["input_ids"]
    g = torch.Generator().manual_seed(seed)
    return rules, [rules + torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in lengths]


def test_the_tree_holds_each_shared_token_once_and_every_sequence_on_its_path():
    tree = pack_tree(EPISODE)
    # 8 (first) + 3 (22, 23, 92 after "20 21") + 3 (24, 93, 94) + 2 (30, 95) + 0 (the repeat)
    assert tree.nodes == tree_size(EPISODE) == 16
    for sequence, path in zip(EPISODE, tree.paths):
        assert tree.ids[0, path].tolist() == sequence
        assert tree.positions[0, path].tolist() == list(range(len(sequence)))
    np.testing.assert_array_equal(tree.paths[4], tree.paths[0])


def test_a_node_attends_to_its_ancestors_and_itself_only():
    tree = pack_tree(EPISODE)
    attend = tree.attend[0, 0].numpy()
    for path in tree.paths:
        for depth, node in enumerate(path):
            assert set(np.flatnonzero(attend[node])) == set(path[: depth + 1].tolist())


def test_passes_are_runs_of_the_tree_within_the_node_budget():
    sequences = EPISODE[:4]
    # lexicographic order: the longest history first (…22 23 24 < …22 23 92 < …90), the other episode last
    assert tree_passes(sequences, size=32, budget=0) == [[2, 1, 0, 3]]
    passes = tree_passes(sequences, size=32, budget=12)
    assert sorted(i for p in passes for i in p) == [0, 1, 2, 3]
    assert all(tree_size([sequences[i] for i in p]) <= 12 for p in passes)
    assert passes == [[2, 1], [0, 3]]  # 11 + 1 nodes; then 8 + 2 (sharing the rules)
    assert tree_passes(sequences, size=1, budget=0) == [[2], [1], [0], [3]]


def test_tree_log_probs_and_gradients_are_the_padded_rows(tiny):
    """Every generated token's log-prob, and the parameters' gradient of their sum, as padded rows give
    them: the tree changes which positions are encoded, not what any token sees."""
    from sepo.lm.logprobs import token_logprobs
    from sepo.policies.lm import LMPolicy

    model, tokenizer, cfg = tiny
    policy = LMPolicy(model, tokenizer, cfg, 1.0, 8, 0)
    rules = "You are playing an iterated prisoner's dilemma against one opponent for eight rounds.\n"
    history = ["Round 1: you COOPERATE, opponent DEFECT.\n", "Round 2: you DEFECT, opponent DEFECT.\n"]
    prompts = [
        tokenizer(rules + "".join(history[:k]) + "Your action?", add_special_tokens=False)["input_ids"]
        for k in range(3)
    ]
    prompts.append(tokenizer(rules + "Round 1: you DEFECT.\nYour action?", add_special_tokens=False)["input_ids"])
    g = torch.Generator().manual_seed(2)
    gens = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (6, 11, 3, 7)]
    sequences = [p + a for p, a in zip(prompts, gens)]
    assert tree_size(sequences) < sum(map(len, sequences)) * 0.6

    def padded():
        ids, mask, start = policy.pack(prompts, gens)
        return token_logprobs(model, ids, mask, start, chunk=4), mask[:, start:].bool()

    def tree():
        lp, real = tree_token_logprobs(model, sequences, [len(p) for p in prompts], chunk=4)
        return lp, real.bool()

    (values, grads), (tree_values, tree_grads) = scores_and_gradient(model, padded), scores_and_gradient(model, tree)
    torch.testing.assert_close(tree_values, values, atol=1e-5, rtol=0)
    torch.testing.assert_close(tree_grads, grads, atol=1e-4, rtol=1e-4)


def test_the_root_ends_before_the_first_scored_predictor_and_is_long_enough_or_none():
    starts = [len(s) - 2 for s in EPISODE]  # two scored tokens each; the shortest starts at 4
    assert root_length(EPISODE, starts, minimum=1) == 3  # the rules are 4 tokens, but position 3 predicts a score
    assert root_length(EPISODE, [7, 7, 7, 5, 7], minimum=1) == 4  # the whole shared rules
    assert root_length(EPISODE, [7, 7, 7, 5, 7], minimum=5) == 0  # too short to be worth a pass of its own
    assert root_length([[1, 2, 3], [9, 2, 3]], [2, 2], minimum=1) == 0


def test_a_root_encoded_once_for_several_passes_gives_the_one_tree_pass(tiny):
    """Passes that attend to the batch's root, encoded once, score every token as the whole tree does,
    and their backwards plus one through the root give the same gradient: each pass leaves its share on
    the root's keys and values."""
    model, tokenizer, cfg = tiny
    rules, sequences = rules_then_random(tokenizer, (9, 4, 12, 6), seed=3)
    sequences[1] = sequences[0][: len(rules) + 5] + sequences[1]  # a later decision of the first episode
    starts = [len(s) - 3 for s in sequences]
    shared = root_length(sequences, starts)
    assert shared == len(rules)

    def whole():
        lp, real = tree_token_logprobs(model, sequences, starts, chunk=4)
        return lp, real.bool()

    def with_root():  # two passes (two backwards), the root once, as the SEPO update runs them
        model.zero_grad()
        root = encode_root(model, sequences[0][:shared])
        values = []
        for part in ([0, 1], [2, 3]):
            lp, real = tree_token_logprobs(
                model, [sequences[i] for i in part], [starts[i] for i in part], chunk=4, root=root
            )
            lp[real.bool()].sum().backward()
            values.append(lp[real.bool()].detach())
        root.backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
        model.zero_grad()
        return torch.cat(values), gradient

    values, grads = scores_and_gradient(model, whole)
    root_values, root_grads = with_root()
    torch.testing.assert_close(root_values, values, atol=1e-5, rtol=0)
    torch.testing.assert_close(root_grads, grads, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # without gradients the root's own tensors are read, and nothing waits for a backward
        root = encode_root(model, sequences[0][:shared])
        lp, real = tree_token_logprobs(model, sequences, starts, chunk=4, root=root)
    torch.testing.assert_close(lp[real.bool()], values, atol=1e-5, rtol=0)


def test_the_policys_action_scores_as_a_tree_are_the_padded_ones(tiny):
    """`model.prefix_tree` in `LMPolicy.sequence_logprobs`: the played table's exact scores and the fallback's
    whole-action scores (several candidates after each prompt) come out as padded rows give them."""
    from omegaconf import OmegaConf

    from sepo.policies.lm import LMPolicy

    model, tokenizer, cfg = tiny
    rules = "You are playing an iterated prisoner's dilemma against one opponent for eight rounds.\n"
    prompts = [
        tokenizer(rules + text, add_special_tokens=False)["input_ids"]
        for text in ("Your action?", "Round 1: you DEFECT.\nYour action?")
    ]
    actions = [[tokenizer(a, add_special_tokens=False)["input_ids"] for a in ("COOPERATE", "DEFECT")]] * 2
    scores = {}
    for tree in (False, True):
        policy = LMPolicy(model, tokenizer, OmegaConf.merge(cfg, {"prefix_tree": tree}), 1.0, 8, 0)
        assert policy.prefix_tree is tree
        scores[tree] = torch.cat(policy.action_scores(prompts, actions, temperature=0.8))
    torch.testing.assert_close(scores[True], scores[False], atol=1e-5, rtol=0)
