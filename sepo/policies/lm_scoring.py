"""Teacher-forced scores of a language-model agent's continuations, and what is built on them: the constrained
fallback (docs/spec.md §5) and the probabilities of the actions the agent plays (docs/spec.md §6).

`Scoring` is a base of `LMPolicy` (sepo/policies/lm.py): its methods read the policy's model, tokenizer
settings (`model`, `pad_id`, `prefix_cache`, `prefix_tree`, the batch sizes) and its `render`; the layout of a
pass (`pack`, `pack_shared`, `shared_prefix_length`) is its own.

The constrained fallback: where the game's `parse_action` cannot read an answer, the answer becomes an
assistant turn, a user turn asks "State your final action (A/B/...):", and one batched forward pass picks the legal action whose
first token has the highest logit. With `model.prefix_cache` the pass encodes only what the
generate call's cache does not already hold (the question, after the prompt and the answer:
`Encoded`, `continued_next_token_logits`); otherwise `score_batch` padded rows at a time. When legal actions
share their first token (neg_v2 vectors such as "[1, 0, 2]"), the whole token sequence of
every legal action is scored (teacher-forced log-prob sum, in passes of `score_batch` rows)
and the best one is taken. Either way the action is legal.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from sepo.lm import batching
from sepo.lm.batching import common_prefix, score_passes
from sepo.lm.logprobs import next_token_logits, token_logprobs
from sepo.lm.prefix_tree import tree_token_logprobs
from sepo.lm.prompt_cache import continued_next_token_logits
from sepo.policies import played
from sepo.policies.base import DecisionRequest
from sepo.policies.lm_answers import Encoded, fallback_question
from sepo.policies.played import ActionEstimate


class Scoring:
    # ----------------------------------------------------------------- the layout of a pass
    def pack(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`sepo.lm.batching.pack` on the model's device: input ids, attention mask and the prompts' width."""
        ids, mask, width_p = batching.pack(prompts, self.pad_id, continuations)
        return ids.to(self.device), mask.to(self.device), width_p

    def _chunks(self, n: int, size: int | None = None) -> list[range]:
        size = max(1, size or self.batch_size or n)
        return [range(s, min(s + size, n)) for s in range(0, n, size)]

    def shared_prefix_length(self, prompts: Sequence[Sequence[int]]) -> int:
        """Tokens at the start of every prompt that one cached pass serves for all rows (0: none, or
        `model.prefix_cache` off): `sepo.lm.batching.shared_prefix_length`."""
        return batching.shared_prefix_length(prompts) if self.prefix_cache else 0

    def pack_split(
        self,
        prompts: Sequence[Sequence[int]],
        split: Sequence[int],
        continuations: Sequence[Sequence[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """`sepo.lm.batching.pack_split` on the model's device."""
        ids, mask, width_p, width_a = batching.pack_split(prompts, split, self.pad_id, continuations)
        return ids.to(self.device), mask.to(self.device), width_p, width_a

    def pack_shared(
        self, prompts: Sequence[Sequence[int]], shared: int, continuations: Sequence[Sequence[int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`pack_split` with the same split for every row: [shared prefix][padding][rest of the
        prompt][continuation][padding]; the prefix sits in the same columns in every row, so one
        pass over it serves the whole batch. Returns input ids, attention mask and P."""
        return self.pack_split(prompts, [shared] * len(prompts), continuations)[:3]

    # ----------------------------------------------------------------- constrained fallback
    def _fallback(
        self,
        requests: list[DecisionRequest],
        answers: list[str],
        encoded: Encoded | None = None,
        rows: Sequence[int] = (),
    ) -> list[str]:
        """docs/spec.md §5: re-ask for the action and choose among the legal ones only; returns the actions.

        Only the action is kept: the re-ask and the forced action were not sampled, so they are never
        part of a decision's record (module docstring). `encoded`: the generate call's cache, where
        `rows` are the requests' rows; the question is then encoded after the tokens it holds.
        """
        prompts = [
            self.render(
                r.messages
                + [
                    {"role": "assistant", "content": a},
                    {"role": "user", "content": fallback_question(r.game, r.legal)},
                ],
                answer_now=True,
            )
            for r, a in zip(requests, answers)
        ]
        tokenised = [[self.action_ids(a) for a in r.legal] for r in requests]
        choice: list[int | None] = [None] * len(requests)

        # Distinct first tokens: one forward pass, logits masked to those tokens, argmax.
        simple = [i for i, toks in enumerate(tokenised) if len({t[0] for t in toks}) == len(toks)]
        held = [i for i in simple if encoded is not None and encoded.row(rows[i]) is not None]
        whole = [i for i in simple if i not in held]  # rows no cache holds: their whole prompts encoded
        scored = itertools.chain(
            self._continued_logits(encoded, [encoded.row(rows[i]) for i in held], [prompts[i] for i in held], held)
            if held
            else (),
            self._next_token_logits([prompts[i] for i in whole], whole),
        )
        for keys, logits in scored:
            for row, i in enumerate(keys):
                firsts = torch.tensor([t[0] for t in tokenised[i]], device=logits.device)
                choice[i] = int(logits[row, firsts].argmax())

        # Shared first tokens: score every legal action's whole token sequence.
        rest = [i for i in range(len(requests)) if choice[i] is None]
        if rest:
            scores = self.action_scores([prompts[i] for i in rest], [tokenised[i] for i in rest], 1.0)
            for i, s in zip(rest, scores):
                choice[i] = int(torch.argmax(s))
        return [requests[i].legal[c] for i, c in enumerate(choice)]

    # ----------------------------------------------------------------- scoring
    def _next_token_logits(self, prompts: list[list[int]], keys: list[int]) -> Iterator[tuple[list[int], torch.Tensor]]:
        """(keys of some prompts, float32 logits [len, V] of the token after each), each prompt encoded whole,
        `score_batch` padded rows at a time (a generate call without `model.prefix_cache` hands no cache back)."""
        for part in self._chunks(len(prompts), self.score_batch):
            ids, mask, _ = self.pack([prompts[k] for k in part])
            with torch.no_grad():
                logits = next_token_logits(self.model, ids, mask, **self.extra_inputs(ids))
            yield [keys[k] for k in part], logits

    def _continued_logits(
        self, encoded: Encoded, rows: list[int], prompts: list[list[int]], keys: list[int]
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """`_next_token_logits`, each prompt encoded only after what its row of `encoded` already holds (a
        rambling answer's question costs its own tokens, not the rules, history and answer again)."""
        for part in self._chunks(len(prompts), self.score_batch):
            kept = [min(common_prefix(encoded.tokens[rows[k]], prompts[k]), len(prompts[k]) - 1) for k in part]
            logits = continued_next_token_logits(
                self.model,
                encoded.cache,
                encoded.columns,
                [rows[k] for k in part],
                kept,
                [prompts[k][n:] for k, n in zip(part, kept)],
                self.pad_id,
                self.extra_inputs,
            )
            yield [keys[k] for k in part], logits

    def sequence_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        temperature: float = 1.0,
        batch: int | None = None,
    ) -> list[torch.Tensor]:
        """Per-token log-probs (float32, CPU) of each continuation after its prompt, teacher-forced,
        `batch` (default `score_batch`) rows per pass."""
        out: list[torch.Tensor] = []
        for part in self._chunks(len(prompts), batch or self.score_batch):
            rows, conts = [prompts[i] for i in part], [continuations[i] for i in part]
            if self.prefix_tree:
                with torch.no_grad():
                    lp, _ = tree_token_logprobs(
                        self.model,
                        [list(p) + list(c) for p, c in zip(rows, conts)],
                        [len(p) for p in rows],
                        self.logprob_chunk,
                        temperature,
                    )
                out += [lp[row, : len(continuations[i])].cpu() for row, i in enumerate(part)]
                continue
            shared = self.shared_prefix_length(rows)
            ids, mask, width_p = self.pack_shared(rows, shared, conts) if shared else self.pack(rows, conts)
            if ids.shape[1] == width_p:  # nothing to score
                out += [torch.zeros(0) for _ in part]
                continue
            with torch.no_grad():
                lp = token_logprobs(
                    self.model,
                    ids,
                    mask,
                    width_p,
                    chunk=self.logprob_chunk,
                    temperature=temperature,
                    shared_prefix=shared,
                    **self.extra_inputs(ids),
                )
            out += [lp[row, : len(continuations[i])].cpu() for row, i in enumerate(part)]
        return out

    def action_scores(
        self,
        prompts: list[list[int]],
        actions: list[list[list[int]]],
        temperature: float = 1.0,
        batch: int | None = None,
    ) -> list[torch.Tensor]:
        """Log-prob sum of every candidate action's tokens after each prompt, batched over all pairs.

        Pairs are scored `batch` (default `score_batch`) rows at a time, so a large action set (neg_v2:
        up to 125 vectors) costs more passes, not more memory. A pass never mixes a part of one prompt's
        candidates with another prompt's (`score_passes`): its rows then share that whole prompt, encoded
        once for them, where a mixed pass would re-encode every row's own prompt (neg_v2 after a rambling
        answer: 16 rows of ~1,000 tokens, 3.4 GiB and 300 s of a SEPO step from Base).
        """
        pairs = [(i, a) for i, acts in enumerate(actions) for a in acts]
        lps: list[torch.Tensor] = []
        for part in score_passes([len(a) for a in actions], batch or self.score_batch):
            rows = [pairs[k] for k in part]
            lps += self.sequence_logprobs([prompts[i] for i, _ in rows], [a for _, a in rows], temperature, len(part))
        sums = torch.stack([lp.sum() for lp in lps])
        out, k = [], 0
        for acts in actions:
            out.append(sums[k : k + len(acts)])
            k += len(acts)
        return out

    def action_probabilities(
        self, requests: list[DecisionRequest], samples: int | None = None, seed: int | None = None
    ) -> list[ActionEstimate]:
        """The probability that the policy, as it plays, ends its answer with each legal action, with
        standard errors: `samples` (default `action_samples`) answers per request, Rao-Blackwellised
        (`sepo.policies.played`). `seed` (default the policy's) keys the sampling streams, so the
        same call gives the same estimate. This is what Kuhn poker's exact exploitability reads.
        """
        if not requests:
            return []
        return played.estimate(
            self, requests, int(samples or self.action_samples), self.seed if seed is None else int(seed)
        )

    def action_first_probabilities(self, requests: list[DecisionRequest]) -> list[dict[str, float]]:
        """The probability of each legal action as the FIRST thing the assistant says (thinking off),
        at the sampling temperature, renormalised over the legal actions.

        Not the policy that plays: a model that reasons before its action line never starts with it.
        Kept to compare with `action_probabilities` (they agree for a model that answers with the
        action alone, tested).
        """
        if not requests:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            prompts = [self.render(r.messages, answer_now=True) for r in requests]
            scores = self.action_scores(
                prompts, [[self.action_ids(a) for a in r.legal] for r in requests], self.logprob_temperature
            )
        finally:
            self.model.train(was_training)
        return [dict(zip(r.legal, torch.softmax(s.double(), dim=0).tolist())) for r, s in zip(requests, scores)]
