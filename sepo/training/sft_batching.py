"""Fast SFT batches for stage `sft` (sepo/stages/sft.py): the same examples, batches and loss, less compute.

The plain way (transformers' default) right-pads a batch, runs the causal LM over every position,
projects every position onto the vocabulary and averages the cross-entropy over the answer tokens.
On the games' data most of that is waste: an answer is ~20 tokens of a ~240-token sequence, the
rows of a batch have different lengths, and examples of one game start with the same long rules
prompt. This module computes the same loss with less work, without changing what is learned:

- **examples encoded once** (`encode_examples`): the chat template and the tokenizer run once per
  example, not once per batch and epoch.
- **logits on the answer positions only** (`sft_logits`): rows are left-padded, so every row's
  predicted positions sit in the last `K` columns, and the model's own head runs on those only
  (`logits_to_keep=K`; the head, softcapping included, is the model's). Position ids follow the
  attention mask, so a token sees the same positions and keys as in the right-padded batch.
- **shared prefixes computed once** (`prefix_groups`, opt-in per model: `sft.prefix_sharing`): rows
  whose token ids start alike (the same game's rules) form a group; one forward pass over the
  group's common prefix fills a KV cache, which is repeated for the group's rows (with gradients:
  the repeat's backward sums the rows' contributions), and the rest of every row runs on top of it.
  A causal model's states on a prefix do not depend on what follows, so this is the same function;
  it needs plain full attention in every layer and no dropout (one pass means one dropout mask for
  every row of the group), which `check_prefix_sharing` enforces.
- **passes of alike lengths** (`length_runs`, opt-in: `sft.pass_cost`): a group's rows, sorted by
  length, are cut into several passes where the padding saved outweighs a pass; each pass extends
  its own copy of the group's one prefix pass (SmolLM2 on Kuhn: 0.80x the positions, 1.15x faster).

Batch layout (`SFTBatchCollator`): `labels` = `shift_labels` [rows, K], the target of each kept
logit (-100 where none), so the Trainer counts the trained tokens exactly as for the plain batch;
`prefixes`, the shared groups' prefix ids [1, P] each; `groups`, one forward pass each: `rows`
(their indices in the batch), `input_ids` and `position_ids` [pass rows, R] (left-padded; each
row's part after the prefix), `attention_mask` [pass rows, P + R], and for a shared group `prefix`
(its index in `prefixes`). At least one pass per group, not one for the whole batch: a group's rows
are padded to their pass's longest rest and attend to their own prefix only (measured: 8-16 % less
time per step than one pass with every prefix padded to the longest). Batch composition and order
are the Trainer's seeded sampler's; nothing here reorders data.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sepo.lm.batching import left_pad
from sepo.lm.logprobs import position_ids_from_mask
from sepo.lm.prompt_cache import prefix_pass, repeated_cache
from sepo.models import render_chat

log = logging.getLogger(__name__)

IGNORE = -100
#: a position's matrix products in units of one query-key pair of attention, for `length_runs`: one SmolLM2
#: SFT step of 8 Kuhn rows spent 1.46 ms a position in its products and 2.0 us a query-key pair in attention
#: (forward and backward, 2 threads; what these passes gained: docs/speed.md §5l)
LINEAR_WEIGHT = 730


# --------------------------------------------------------------------------- encoding
def encode_examples(
    encode: Callable[[Sequence[dict[str, str]]], tuple[list[int], list[int]]], examples: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each example's (input ids, labels), computed once: `{"ids": [...], "labels": [...]}`."""
    out = []
    for ex in examples:
        ids, labels = encode(ex["messages"])
        out.append({"ids": ids, "labels": labels})
    return out


def first_predicted(labels: Sequence[int]) -> int:
    """The first position whose next token is trained (the last prompt token with an assistant-only
    loss); len(labels) - 1 when none is. Positions before it need no logits."""
    for t in range(1, len(labels)):
        if labels[t] != IGNORE:
            return t - 1
    return len(labels) - 1


def prefix_groups(rows: Sequence[Sequence[int]], limits: Sequence[int], min_shared: int) -> list[tuple[list[int], int]]:
    """Groups of rows that share a token prefix, as (row indices, prefix length).

    Rows sorted by their ids; neighbours sharing at least `min_shared` leading tokens join a group,
    whose prefix is the longest one common to all its rows, capped at each row's `limits` entry
    (its first predicted position, so every predicted position stays in the row's own part). A
    row that shares too little is a group of its own; its prefix is then just its own prompt.
    Every row is in exactly one group; groups and members come in the rows' original order.
    """
    order = sorted(range(len(rows)), key=lambda i: list(rows[i]))

    def common(a: Sequence[int], b: Sequence[int]) -> int:
        n = min(len(a), len(b))
        k = 0
        while k < n and a[k] == b[k]:
            k += 1
        return k

    groups: list[tuple[list[int], int]] = []
    members, shared = [order[0]], len(rows[order[0]])
    for prev, i in zip(order, order[1:]):
        k = common(rows[prev], rows[i])
        if k >= min_shared and min(shared, k) >= min_shared:
            members.append(i)
            shared = min(shared, k)
        else:
            groups.append((members, shared))
            members, shared = [i], len(rows[i])
    groups.append((members, shared))
    out = [(sorted(m), min([p] + [int(limits[i]) for i in m])) for m, p in groups]
    return sorted(out, key=lambda g: g[0][0])


# --------------------------------------------------------------------------- collation
class SFTBatchCollator:
    """Collates pre-encoded examples (`encode_examples`) into the layout `sft_logits` reads.

    `share_prefix` groups rows by common prefix (`prefix_groups`, at least `min_shared` tokens);
    a group of two or more rows gets its prefix tensors, the rows sharing with no other row form
    one plain group. (Token type ids, Gemma 4, are added by `sft_logits`.)
    """

    def __init__(self, pad_id: int, share_prefix: bool = False, min_shared: int = 1, pass_cost: float = 0.0):
        self.pad_id = int(pad_id)
        self.share_prefix = bool(share_prefix)
        self.min_shared = max(int(min_shared), 1)
        self.pass_cost = float(pass_cost)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [list(it["ids"]) for it in items]
        labels = [list(it["labels"]) for it in items]
        first = [first_predicted(lab) for lab in labels]
        keep = max(len(i) - f for i, f in zip(ids, first))  # kept logit columns, the last of each row included
        targets = torch.full((len(items), keep), IGNORE, dtype=torch.long)
        for r, (lab, n) in enumerate(zip(labels, map(len, ids))):
            shifted = lab[1:] + [IGNORE]  # the target of position t is the label of t + 1
            lo = max(0, n - keep)
            targets[r, keep - n + lo :] = torch.tensor(shifted[lo:], dtype=torch.long)
        found = prefix_groups(ids, first, self.min_shared) if self.share_prefix else [(list(range(len(ids))), 0)]
        shared = [(m, p) for m, p in found if len(m) > 1 and p > 0]
        alone = sorted(r for m, p in found if not (len(m) > 1 and p > 0) for r in m)
        groups, prefixes = [], []
        for members, p in shared + ([(alone, 0)] if alone else []):
            if p:
                prefixes.append(torch.tensor([ids[members[0]][:p]], dtype=torch.long))
            for rows in length_runs(members, [len(ids[r]) - p for r in members], p, self.pass_cost):
                rests = [ids[r][p:] for r in rows]
                r_ids, r_mask = left_pad(rests, max(map(len, rests)), self.pad_id)
                group = {
                    "rows": torch.tensor(rows, dtype=torch.long),
                    "input_ids": r_ids,
                    "position_ids": position_ids_from_mask(r_mask, p),
                }
                if p:
                    group["prefix"] = len(prefixes) - 1
                    r_mask = torch.cat([torch.ones(len(rows), p, dtype=torch.long), r_mask], dim=1)
                group["attention_mask"] = r_mask
                groups.append(group)
        # `labels` first: the Trainer takes the batch size from the first tensor it finds
        return {"labels": targets, "shift_labels": targets, "groups": groups, "prefixes": prefixes}


def length_runs(members: Sequence[int], lengths: Sequence[int], prefix: int, pass_cost: float) -> list[list[int]]:
    """The rows of one group split into passes of neighbours in length, so few padded positions are computed.

    Rows sorted by length (ties by index) are cut into contiguous runs; a run of `n` rows padded to its
    longest `L` costs `n * L * (LINEAR_WEIGHT + prefix + L)` (its positions' products and their
    attention over prefix and rest) plus `pass_cost` per pass in the same units, and the cut of least
    total cost is taken (dynamic programming: a group has a batch's few rows). `pass_cost` 0 keeps one
    pass per group, as without splitting.
    """
    if pass_cost <= 0 or len(members) < 2:
        return [list(members)]
    order = sorted(range(len(members)), key=lambda i: (lengths[i], members[i]))
    sizes = [int(lengths[i]) for i in order]

    def run_cost(lo: int, hi: int) -> float:  # rows order[lo:hi], padded to the longest (the last)
        longest = sizes[hi - 1]
        return (hi - lo) * longest * (LINEAR_WEIGHT + prefix + longest) + pass_cost

    best = [0.0] + [float("inf")] * len(sizes)
    cut = [0] * (len(sizes) + 1)
    for hi in range(1, len(sizes) + 1):
        for lo in range(hi):
            c = best[lo] + run_cost(lo, hi)
            if c < best[hi]:
                best[hi], cut[hi] = c, lo
    runs, hi = [], len(sizes)
    while hi > 0:
        runs.append(sorted(members[order[i]] for i in range(cut[hi], hi)))
        hi = cut[hi]
    return runs[::-1]


# --------------------------------------------------------------------------- the loss
def _extras(type_ids_key: str | None, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {type_ids_key: torch.zeros_like(ids)} if type_ids_key else {}


def sft_logits(model: Any, batch: dict[str, Any], type_ids_key: str | None = None) -> torch.Tensor:
    """Logits [rows, K, vocab] of the kept (answer) positions of a `SFTBatchCollator` batch, one
    forward pass per group (and one over each group's prefix), in the batch's row order."""
    keep = batch["labels"].shape[1]
    passes = Counter(int(group["prefix"]) for group in batch["groups"] if "prefix" in group)
    encoded: dict[int, Any] = {}
    parts, rows = [], []
    for group in batch["groups"]:
        kwargs: dict[str, Any] = {"use_cache": False}
        if "prefix" in group:  # the backward sums what every row reading the prefix leaves
            k = int(group["prefix"])
            if k not in encoded:  # its one pass, just before its first group's (as with one pass per group)
                encoded[k] = prefix_pass(model, batch["prefixes"][k], lambda ids: _extras(type_ids_key, ids))
            if passes[k] == 1:  # the prefix's own cache, repeated in place
                cache = encoded[k]
                cache.batch_repeat_interleave(len(group["rows"]))
            else:  # each pass extends its own copy
                cache = repeated_cache(model, encoded[k], len(group["rows"]))
            kwargs = {"past_key_values": cache, "use_cache": True}
        out = model(
            input_ids=group["input_ids"],
            attention_mask=group["attention_mask"],
            position_ids=group["position_ids"],
            logits_to_keep=keep,
            **kwargs,
            **_extras(type_ids_key, group["input_ids"]),
        )
        short = keep - out.logits.shape[1]  # a group's rests can be narrower than the batch's K (its
        # rows' targets then start inside them anyway): the missing columns' targets are all -100
        parts.append(torch.nn.functional.pad(out.logits, (0, 0, short, 0)) if short > 0 else out.logits)
        rows.append(group["rows"])
    logits = torch.cat(parts) if len(parts) > 1 else parts[0]
    order = torch.cat(rows)
    if len(parts) > 1 or not torch.equal(order, torch.arange(len(order), device=order.device)):
        logits = logits[torch.argsort(order)]
    return logits


def token_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """transformers' causal-LM loss on already shifted targets: the summed cross-entropy divided by
    `num_items_in_batch` (the trained tokens of the whole accumulated batch) when given, else the
    mean over this batch's trained tokens."""
    logits = logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1).to(logits.device),
        ignore_index=IGNORE,
        reduction="sum" if num_items_in_batch is not None else "mean",
    )
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def check_prefix_sharing(model: Any, training: bool = True) -> str | None:
    """Why sharing prefixes would not be exact for `model` (None: it is). In training, dropout would
    draw one mask for a whole group's prefix; sliding-window, linear or shared-KV attention layers do
    not keep a plain per-token KV cache that can be repeated and extended across padding."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if training:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Dropout) and module.p > 0:
                return f"{name or 'the model'} has dropout p={module.p}"
        if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
            return f"attention dropout {config.attention_dropout}"
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"layer types {sorted(kinds)} (only full attention keeps a plain KV cache)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"sliding window {config.sliding_window}"
    if getattr(config, "num_kv_shared_layers", 0):
        return "layers share KV states"
    return None


def sft_trainer_class():
    """A transformers `Trainer` whose loss is `token_cross_entropy(sft_logits(...))`: transformers'
    causal-LM loss, normalised by the same trained-token count, on the batches above."""
    from transformers import Trainer

    class SFTTrainer(Trainer):
        type_ids_key: str | None = None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            logits = sft_logits(model, inputs, self.type_ids_key)
            loss = token_cross_entropy(logits, inputs["labels"], num_items_in_batch)
            if (
                self.args.average_tokens_across_devices
                and self.model_accepts_loss_kwargs
                and num_items_in_batch is not None
            ):  # as Trainer.compute_loss does for the model's own loss
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            return (loss, {"logits": logits}) if return_outputs else loss

    return SFTTrainer


class ChatSFTCollator:
    """Tokenises chat examples through the chat template and masks the loss to the answer.

    `encode` gives (input ids, labels) of one example: prompt = the chat template of every turn but
    the last with the generation prompt; answer = the last (assistant) turn's content followed by
    what the template writes after it, up to and including the first end-of-turn token. Labels are
    -100 on the prompt (`assistant_only`). Over-long sequences drop tokens from the left of the
    prompt. `__call__` right-pads a batch and adds the all-zero token type ids when `type_ids_key`
    names the model's argument (Gemma 4).
    """

    def __init__(
        self,
        tokenizer: Any,
        model_cfg: Any,
        max_length: int,
        eos_ids: set[int],
        type_ids_key: str | None = None,
        assistant_only: bool = True,
    ):
        self.tokenizer = tokenizer
        self.model_cfg = model_cfg
        self.max_length = int(max_length)
        self.eos_ids = set(eos_ids)
        self.type_ids_key = type_ids_key
        self.assistant_only = assistant_only
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._warned = False

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def split(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
        """Prompt ids and answer ids (content + end of turn) of one example."""
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("an SFT example must end with an assistant turn")
        messages = [dict(m) for m in messages]
        prompt = render_chat(self.tokenizer, self.model_cfg, messages[:-1], add_generation_prompt=True)
        full = render_chat(self.tokenizer, self.model_cfg, messages, add_generation_prompt=False)
        content = messages[-1]["content"]
        at = full.rfind(content)
        tail = full[at + len(content) :] if at >= 0 else ""
        answer = self._ids(content + tail)
        stop = next((i + 1 for i, t in enumerate(answer) if t in self.eos_ids), None)
        if stop is not None:
            answer = answer[:stop]
        elif self.tokenizer.eos_token_id is not None:  # the template wrote no end-of-turn token: add one
            answer.append(self.tokenizer.eos_token_id)
        return self._ids(prompt), answer

    def encode(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
        prompt, answer = self.split(messages)
        if len(answer) > self.max_length:  # cannot happen with the games' short answers
            if not self._warned:
                log.warning(
                    "sft: an answer of %d tokens exceeds sft.max_length=%d and is cut", len(answer), self.max_length
                )
                self._warned = True
            answer = answer[: self.max_length]
        budget = self.max_length - len(answer)
        prompt = prompt[len(prompt) - budget :] if len(prompt) > budget else prompt
        prompt = prompt if budget > 0 else []
        labels = ([-100] * len(prompt) if self.assistant_only else list(prompt)) + answer
        return prompt + answer, labels

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        encoded = [self.encode(ex["messages"]) for ex in examples]
        width = max(len(ids) for ids, _ in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(encoded), width), -100, dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, (ids, lab) in enumerate(encoded):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
            mask[row, : len(ids)] = 1
        batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
        if self.type_ids_key:
            batch[self.type_ids_key] = torch.zeros_like(input_ids)
        return batch


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[dict[str, Any]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]
