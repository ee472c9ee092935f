"""Many token sequences as one prefix tree, scored in one row: a token two sequences share is encoded once.

A SEPO batch holds every decision of every episode, and an episode's prompts grow by a history line per
round: its later prompts repeat the rules and the whole earlier history of the earlier ones. Padded rows
encode each prompt whole (with `model.prefix_cache`, all but the rules every prompt shares). Here the
sequences of a pass (prompt + answer) become one prefix tree (a trie), laid out as one row in depth-first
order: each token attends to itself and its ancestors only (a 4-D attention mask) and sits at its depth
(position ids), so every token sees exactly the context it has in its own sequence, and its log-prob is
the one a padded row gives, up to the order of floating-point sums. On Kuhn poker's and IPD's scripted
play, a pass then encodes 1.6 and 2.0 times fewer positions (docs/speed.md §5f).

The root every sequence of a batch shares (the game's rules) would otherwise head every pass's tree
again: `encode_root` encodes it once per batch and every pass attends to its keys and values
(`EncodedRoot`); with gradients, each pass leaves its share of the root's gradient on them and one
backward through the root's own pass carries the sum (docs/speed.md §5i).

Only for plain full attention (`model.prefix_cache`): a sliding window counts columns, and a
linear-attention layer's recurrent state runs through every earlier token of the row, tree or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sepo.lm.batching import MIN_SHARED_PREFIX, common_prefix, common_prefix_length
from sepo.lm.prompt_cache import prefix_pass


def tree_order(sequences: Sequence[Sequence[int]]) -> list[int]:
    """Indices of `sequences` in lexicographic order: neighbours then share their longest prefixes, so
    each adds to the tree only where it leaves the one before (`tree_size`)."""
    return sorted(range(len(sequences)), key=lambda i: list(sequences[i]))


def tree_size(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens of the prefix tree of `sequences`, taken in lexicographic order."""
    ordered = [sequences[i] for i in tree_order(sequences)]
    return sum(len(s) - (common_prefix(s, ordered[k - 1]) if k else 0) for k, s in enumerate(ordered))


@dataclass
class PackedTree:
    """Sequences laid out as one prefix tree.

    `ids`, `positions`: [1, N] token ids and depths of the N tree nodes; `attend`: [1, 1, N, N] bool,
    node j attends to node i iff i is j or one of its ancestors; `paths[k]`: the nodes of sequence k, in
    order (len(paths[k]) == len(sequences[k])).
    """

    ids: torch.Tensor
    positions: torch.Tensor
    attend: torch.Tensor
    paths: list[np.ndarray]

    @property
    def nodes(self) -> int:
        return int(self.ids.shape[1])


def pack_tree(sequences: Sequence[Sequence[int]]) -> PackedTree:
    """The prefix tree of `sequences` (each at least one token long), depth first in lexicographic order.

    In that order a sequence's new nodes are one contiguous run after the tree built so far, and its
    shared part is the path of the sequence before it, up to their common prefix.
    """
    ids: list[int] = []
    positions: list[int] = []
    rows: list[tuple[np.ndarray, np.ndarray, int]] = []  # (new nodes, whole path, shared length) per sequence
    paths: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(sequences)
    previous: Sequence[int] = []
    previous_path = np.zeros(0, dtype=np.int64)
    for k in tree_order(sequences):
        sequence = sequences[k]
        shared = common_prefix(sequence, previous)
        new = np.arange(len(ids), len(ids) + len(sequence) - shared, dtype=np.int64)
        paths[k] = np.concatenate([previous_path[:shared], new])
        rows.append((new, paths[k], shared))
        ids += list(sequence[shared:])
        positions += range(shared, len(sequence))
        previous, previous_path = sequence, paths[k]

    attend = np.zeros((len(ids), len(ids)), dtype=bool)
    for new, path, shared in rows:  # a new node attends to the path up to itself
        attend[new[:, None], path[None, :]] = np.tri(len(path), dtype=bool)[shared:]
    return PackedTree(
        ids=torch.tensor([ids], dtype=torch.long),
        positions=torch.tensor([positions], dtype=torch.long),
        attend=torch.from_numpy(attend)[None, None],
        paths=paths,
    )


def tree_passes(sequences: Sequence[Sequence[int]], size: int, budget: int) -> list[list[int]]:
    """Indices of `sequences` in passes of at most `size` sequences and, when `budget` is not 0, at most
    `budget` tree nodes (what a pass encodes, so what its activations grow with). Passes are runs of the
    lexicographic order, so each is one subtree of the batch's prefix tree: the rules once, each history
    once."""
    passes: list[list[int]] = []
    nodes, previous = 0, None
    for i in tree_order(sequences):
        added = len(sequences[i]) - (common_prefix(sequences[i], sequences[previous]) if previous is not None else 0)
        if not passes or len(passes[-1]) >= size or (budget and nodes + added > budget):
            passes.append([])
            nodes, added = 0, len(sequences[i])
        passes[-1].append(i)
        nodes, previous = nodes + added, i
    return passes


def root_length(sequences: Sequence[Sequence[int]], starts: Sequence[int], minimum: int = MIN_SHARED_PREFIX) -> int:
    """Tokens at the start of every sequence that `encode_root` can encode once for all their passes (0:
    fewer than `minimum`): their common prefix, ending before the first scored token's predictor, so
    every scored position's hidden state comes from a pass."""
    if not sequences:
        return 0
    shared = common_prefix_length(sequences, min(starts) - 1)
    return shared if shared >= minimum else 0


@dataclass
class EncodedRoot:
    """A prefix every sequence of a batch shares, encoded once for all the batch's passes.

    `computed`: each layer's keys and values as the root's own pass made them (with its graph when it
    ran with gradients); `read`: what the passes attend to, detached leaves in that case, so each pass's
    backward stops there and leaves its share of the root's gradient on them.
    """

    length: int
    computed: list[tuple[torch.Tensor, torch.Tensor]]
    read: list[tuple[torch.Tensor, torch.Tensor]]

    def cache(self, model: torch.nn.Module):
        """A fresh KV cache holding the root, for one pass to extend (the root's own tensors stay as they are)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        for layer, (keys, values) in enumerate(self.read):
            cache.update(keys, values, layer)
        return cache

    def backward(self) -> None:
        """Carry the gradient the passes left on the root's keys and values through the root's own pass,
        once (after the batch's last pass): the sum over passes, as if each had encoded the root itself."""
        outputs, grads = [], []
        for made, leaves in zip(self.computed, self.read):
            for tensor, leaf in zip(made, leaves):
                if leaf is not tensor and leaf.grad is not None:
                    outputs.append(tensor)
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)


def encode_root(model: torch.nn.Module, ids: Sequence[int]) -> EncodedRoot:
    """One pass over `ids` (gradients as the caller has them enabled), kept for `tree_token_logprobs`."""
    device = next(model.parameters()).device
    cache = prefix_pass(model, torch.tensor([list(ids)], dtype=torch.long, device=device))
    computed = [(layer.keys, layer.values) for layer in cache.layers]
    if torch.is_grad_enabled():
        read = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in computed]
    else:
        read = computed
    return EncodedRoot(len(ids), computed, read)


def tree_hidden_states(
    model: torch.nn.Module, sequences: Sequence[Sequence[int]], root: EncodedRoot | None = None
) -> tuple[torch.Tensor, PackedTree]:
    """The final hidden states [N, H] of one pass over the prefix tree of `sequences` (after `root.length`
    tokens each when a root is given: every node then also attends to the root's keys and values), and
    the tree, whose `paths` say which node is which sequence's token."""
    from sepo.lm.logprobs import head_inputs

    device = next(model.parameters()).device
    skip = root.length if root is not None else 0
    tree = pack_tree([s[skip:] for s in sequences])
    attend, extra = tree.attend, {"use_cache": False}
    if root is not None:
        attend = torch.cat([torch.ones((1, 1, tree.nodes, skip), dtype=torch.bool), attend], dim=-1)
        extra = {"past_key_values": root.cache(model), "use_cache": True}
    with head_inputs(model) as captured:
        model(
            input_ids=tree.ids.to(device),
            attention_mask=attend.to(device),
            position_ids=(tree.positions + skip).to(device),
            **extra,
        )
    return captured[-1][0], tree


def tree_token_logprobs(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    starts: Sequence[int],
    chunk: int = 32,
    temperature: float = 1.0,
    root: EncodedRoot | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(sequence[t] | sequence[:t]) for t in [start, len) of every sequence, from one pass over their
    prefix tree: float32 [D, L] (L the longest scored part; padded positions hold values callers must mask
    out) and the mask of real positions [D, L]. Gradients flow when enabled, as in `token_logprobs`.

    With `root` (`encode_root` of the sequences' first `root.length` tokens, at most `root_length`), the
    tree holds the rest of each sequence only and every node also attends to the root's keys and values."""
    from sepo.lm.logprobs import _softcap, chunked_logprobs_from_hidden

    device = next(model.parameters()).device
    skip = root.length if root is not None else 0
    hidden, tree = tree_hidden_states(model, sequences, root)
    width = max(len(s) - start for s, start in zip(sequences, starts))
    predictors = torch.zeros((len(sequences), width), dtype=torch.long)
    targets = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros((len(sequences), width))
    for k, (sequence, start) in enumerate(zip(sequences, starts)):
        scored = len(sequence) - start
        predictors[k, :scored] = torch.from_numpy(tree.paths[k][start - 1 - skip : len(sequence) - 1 - skip])
        targets[k, :scored] = torch.tensor(list(sequence[start:]), dtype=torch.long)
        mask[k, :scored] = 1.0
    lp = chunked_logprobs_from_hidden(
        hidden[predictors.to(device)],
        model.get_output_embeddings(),
        targets.to(device),
        chunk,
        temperature,
        _softcap(model),
    )
    return lp, mask.to(lp)
