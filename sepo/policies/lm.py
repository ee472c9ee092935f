"""A Hugging Face causal language model as the agent (SPEC section 5).

One `act_batch` call answers every pending decision of the arena's lockstep loop:

1. Each request's chat messages are rendered with the tokenizer's chat template (generation prompt
   on), left-padded, and sampled with ONE `generate` call (or one per `batch_size` chunk). A
   per-sequence stopping criterion ends a row as soon as its last non-empty line holds a legal
   action (never while a `<think>` block is open), so short answers do not wait for long ones.
2. Each answer is parsed with the game's `parse_action`. Rows that do not parse go through the
   constrained fallback: the answer becomes an assistant turn, a user turn asks
   "State your final action (A/B/...):", and one batched forward pass (`score_batch` rows at a
   time) picks the legal action whose first token has the highest logit. When legal actions
   share their first token (neg_v2 vectors such as "[1, 0, 2]"), the whole token sequence of
   every legal action is scored (teacher-forced log-prob sum, in passes of `score_batch` rows)
   and the best one is taken. Either way the action is legal.
3. With `return_logprobs=True` (training), every decision also carries, in `Decision.extras`:
   - `prompt_ids` (1-D long tensor): the rendered prompt, unpadded;
   - `gen_ids` (1-D long tensor): the generated tokens, cut where the stopping criterion fired
     (or after the EOS the model wrote; padding dropped);
   - `logprobs` (1-D float32 tensor, one per `gen_ids` token): log p(token | prefix) under the
     sampling distribution, i.e. of logits / `logprob_temperature`, recomputed after generation by
     a chunked teacher-forced pass (`sepo.logprobs.token_logprobs`);
   - `logprob_temperature` (float): the sampling temperature, or 1.0 for greedy decoding;
   - `fallback` (bool): True when the action came from the fallback. The record still holds the
     tokens the policy sampled (its real, unparseable answer): the fallback's re-ask and forced
     action were not sampled, so they are part of the environment, never trained on (SPEC 4.3).
   A trainer scores `prompt_ids + gen_ids` with the same temperature to get its new log-probs.

Sampling is pure temperature sampling (no top-k/top-p, whatever the model's generation config
suggests) so that the recorded log-probs are those of the distribution actually sampled from.
Temperature 0 means greedy decoding. Each row samples with its own torch generator, seeded from
`seed` and one draw of its episode's agent stream (`DecisionRequest.rng`): an episode's answers do
not depend on which other episodes share the batch, on `batch_size` or on the order of calls, so
adding episodes to a lockstep batch (SEPO's auxiliary episodes) leaves the others unchanged, and
the global torch RNG is never touched.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from sepo.games.base import Game
from sepo.logprobs import next_token_logits, token_logprobs
from sepo.models import chat_template_kwargs, forward_extras
from sepo.policies.base import Decision, DecisionRequest

#: Logits processors a checkpoint's generation config may switch on (Qwen ships top_k 20, top_p 0.95),
#: switched off: what is sampled is exactly softmax(logits / T), whose log-probs training records.
PLAIN_SAMPLING = dict(top_k=None, top_p=None, min_p=None, typical_p=None, repetition_penalty=None,
                      no_repeat_ngram_size=None)

#: Above this many legal actions the fallback question shows the game's format hint instead.
MAX_LISTED_ACTIONS = 10


def think_open(text: str) -> bool:
    """Whether `text` has a `<think>` without a later `</think>` (the model is still reasoning)."""
    return text.rfind("<think>") > text.rfind("</think>")


def holds_action(text: str, game: Game, legal: list[str]) -> bool:
    """The stopping rule of SPEC section 5: a legal action on the last non-empty line, think closed."""
    return not think_open(text) and game.parse_action(text, legal) is not None


def answer_view(prompt_text: str, answer: str) -> str:
    """The answer as parsing must see it: with "<think>" in front when the prompt opened the block.

    Some chat templates (the tiny model's and Qwen's with thinking on) end the generation prompt
    with "<think>", so the model's answer holds only the closing tag; an action line written before
    it is still reasoning.
    """
    return "<think>" + answer if think_open(prompt_text) else answer


class ActionStoppingCriteria(StoppingCriteria):
    """Stops each row of a batch once its answer so far holds a legal action (transformers 5 API).

    Rows are independent: the returned bool tensor has one entry per row. `stop_at[i]` records how
    many tokens row i had generated when it first stopped, so the caller can cut what `generate`
    appended afterwards (padding, or more tokens where no EOS criterion pads finished rows).
    """

    def __init__(self, tokenizer: Any, prompt_length: int, requests: Sequence[DecisionRequest],
                 think_prefix: Sequence[bool] | None = None):
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.requests = list(requests)
        #: rows whose prompt already opened a <think> block (see `answer_view`)
        self.think_prefix = list(think_prefix or [False] * len(self.requests))
        self.stop_at: list[int | None] = [None] * len(self.requests)

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids[:, self.prompt_length:]
        open_rows = [i for i, s in enumerate(self.stop_at) if s is None]
        texts = self.tokenizer.batch_decode(generated[open_rows].tolist(), skip_special_tokens=True)
        for i, text in zip(open_rows, texts):
            request = self.requests[i]
            if holds_action("<think>" + text if self.think_prefix[i] else text, request.game, request.legal):
                self.stop_at[i] = generated.shape[1]
        done = [s is not None for s in self.stop_at]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class RowSampler(LogitsProcessor):
    """Temperature sampling with one generator per row, as a logits processor for greedy `generate`.

    `generate`'s own sampling draws every row from the global RNG in one call, so a row's tokens
    would depend on the rows beside it. Here each row draws from softmax(scores / T) with its own
    generator and the scores become -inf except at the drawn token, which greedy decoding then picks.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, device: torch.device):
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        drawn = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn[:, None], 0.0)


def fallback_question(game: Game, legal: list[str]) -> str:
    """The user turn of the constrained fallback, listing the legal actions when they are few."""
    options = "/".join(legal) if len(legal) <= MAX_LISTED_ACTIONS else (game.action_hint or "/".join(legal))
    return f"State your final action ({options}):"


class LMPolicy:
    """A language model answering decision requests in batches; see the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, model_cfg: Any, temperature: float, max_new_tokens: int,
                 seed: int, batch_size: int = 0, logprob_chunk: int = 32, score_batch: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.name = f"lm:{model_cfg.get('name', 'model')}"
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.logprob_chunk = int(logprob_chunk)
        #: rows per teacher-forced pass (fallback, log-probs, whole-action scores): a pass holds the
        #: activations of every row and position at once (and rows x `logprob_chunk` x vocab
        #: log-probs), unlike generate's one-token steps, so it is kept apart from `batch_size`
        self.score_batch = int(score_batch)
        #: log-probs are those of the sampled distribution; greedy decoding records the plain model's
        self.logprob_temperature = self.temperature if self.temperature > 0 else 1.0
        self.seed = int(seed)
        #: draws the stream of requests that bring none (`rng=None`); checkpoints save its state
        self.generator = torch.Generator().manual_seed(self.seed)
        self.model_cfg = model_cfg
        self.template_kwargs = chat_template_kwargs(model_cfg)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = set(eos) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ----------------------------------------------------------------- tensors
    def render_text(self, messages: list[dict[str, str]], answer_now: bool = False) -> str:
        """The chat prompt with the generation prompt appended.

        `answer_now` turns thinking off, so the next tokens are the answer itself (fallback and
        action probabilities score an action as the first thing the assistant says).
        """
        kwargs = dict(self.template_kwargs)
        if answer_now:
            kwargs["enable_thinking"] = False
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)

    def render(self, messages: list[dict[str, str]], answer_now: bool = False) -> list[int]:
        """Token ids of `render_text` (the template writes the special tokens itself)."""
        return self.tokenizer(self.render_text(messages, answer_now), add_special_tokens=False)["input_ids"]

    def action_ids(self, action: str) -> list[int]:
        return self.tokenizer(action, add_special_tokens=False)["input_ids"]

    def pack(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Prompts left-padded to a common length P, continuations right-padded after them.

        This is the layout of `generate`'s output, so a continuation's token t sits at column P + t
        in every row. Returns input ids, attention mask and P.
        """
        continuations = continuations or [[] for _ in prompts]
        width_p = max(len(p) for p in prompts)
        width_c = max(len(c) for c in continuations)
        ids = torch.full((len(prompts), width_p + width_c), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, c) in enumerate(zip(prompts, continuations)):
            ids[i, width_p - len(p):width_p] = torch.tensor(list(p), dtype=torch.long)
            ids[i, width_p:width_p + len(c)] = torch.tensor(list(c), dtype=torch.long)
            mask[i, width_p - len(p):width_p + len(c)] = 1
        return ids.to(self.device), mask.to(self.device), width_p

    def extra_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Gemma 4 wants all-zero token type ids (every token is text) in forward and generate."""
        return forward_extras(self.model, self.model_cfg, input_ids)

    def _chunks(self, n: int, size: int | None = None) -> list[range]:
        size = max(1, size or self.batch_size or n)
        return [range(s, min(s + size, n)) for s in range(0, n, size)]

    # ----------------------------------------------------------------- acting
    def act_batch(self, requests: list[DecisionRequest], return_logprobs: bool = False) -> list[Decision]:
        if not requests:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            return self._act(requests, return_logprobs)
        finally:
            self.model.train(was_training)

    def _act(self, requests: list[DecisionRequest], return_logprobs: bool) -> list[Decision]:
        answers: list[tuple[list[int], list[int], str, str]] = []
        for part in self._chunks(len(requests)):
            answers += self._generate([requests[i] for i in part])

        decisions: list[Decision] = []
        records: list[tuple[list[int], list[int]]] = []  # (prompt ids, generated ids) per decision
        failed: list[int] = []
        for i, (request, (prompt, generated, text, view)) in enumerate(zip(requests, answers)):
            action = request.game.parse_action(view, request.legal)
            if action is None:
                failed.append(i)
            # request.legal[0] is a placeholder, replaced by the fallback below
            decisions.append(Decision(action=action or request.legal[0], text=text, parsed=action is not None))
            records.append((prompt, generated))

        if failed:  # the action comes from the fallback; the record keeps the sampled answer
            forced = self._fallback([requests[i] for i in failed], [answers[i][2] for i in failed])
            for i, action in zip(failed, forced):
                decisions[i].action = action

        if return_logprobs:
            logprobs = self.sequence_logprobs([r[0] for r in records], [r[1] for r in records],
                                              self.logprob_temperature)
            for decision, (prompt, generated), lp in zip(decisions, records, logprobs):
                decision.extras.update(
                    prompt_ids=torch.tensor(prompt, dtype=torch.long),
                    gen_ids=torch.tensor(generated, dtype=torch.long),
                    logprobs=lp,
                    logprob_temperature=self.logprob_temperature,
                    fallback=not decision.parsed,
                )
        return decisions

    def _generate(self, requests: list[DecisionRequest]) -> list[tuple[list[int], list[int], str, str]]:
        """One generate call. Per request: prompt ids, generated ids cut at the stop, the decoded
        answer, and the answer as parsed (`answer_view`)."""
        texts = [self.render_text(r.messages) for r in requests]
        prompts = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        ids, mask, width_p = self.pack(prompts)
        stop = ActionStoppingCriteria(self.tokenizer, width_p, requests, [think_open(t) for t in texts])
        seeds = [self.row_seed(r) for r in requests]
        processors = LogitsProcessorList(
            [RowSampler(seeds, self.temperature, ids.device)] if self.temperature > 0 else [])
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, **self.extra_inputs(ids), do_sample=False, temperature=None,
                **PLAIN_SAMPLING, logits_processor=processors, max_new_tokens=self.max_new_tokens,
                stopping_criteria=StoppingCriteriaList([stop]), pad_token_id=self.pad_id)
        results = []
        for i, prompt in enumerate(prompts):
            generated = out[i, width_p:].tolist()
            cut = stop.stop_at[i] if stop.stop_at[i] is not None else len(generated)
            for j, token in enumerate(generated[:cut]):
                if token in self.eos_ids:  # the model ended its turn: keep the EOS, drop the padding
                    cut = j + 1
                    break
            generated = generated[:cut]
            answer = self.tokenizer.decode(generated, skip_special_tokens=True)
            results.append((prompt, generated, answer, answer_view(texts[i], answer)))
        return results

    def row_seed(self, request: DecisionRequest) -> int:
        """The sampling seed of one decision: `seed` mixed with a draw from the episode's stream."""
        if request.rng is not None:
            draw = int(request.rng.integers(2**63))
        else:
            draw = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        key = [self.seed, draw]
        return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> np.uint64(1))

    # ----------------------------------------------------------------- constrained fallback
    def _fallback(self, requests: list[DecisionRequest], answers: list[str]) -> list[str]:
        """SPEC section 5: re-ask for the action and choose among the legal ones only; returns the actions.

        Only the action is kept: the re-ask and the forced action were not sampled, so they are never
        part of a decision's record (module docstring).
        """
        prompts = [self.render(r.messages + [{"role": "assistant", "content": a},
                                             {"role": "user", "content": fallback_question(r.game, r.legal)}],
                               answer_now=True)
                   for r, a in zip(requests, answers)]
        tokenised = [[self.action_ids(a) for a in r.legal] for r in requests]
        choice: list[int | None] = [None] * len(requests)

        # Distinct first tokens: one forward pass, logits masked to those tokens, argmax.
        simple = [i for i, toks in enumerate(tokenised) if len({t[0] for t in toks}) == len(toks)]
        for part in self._chunks(len(simple), self.score_batch):
            rows = [simple[k] for k in part]
            ids, mask, _ = self.pack([prompts[i] for i in rows])
            with torch.no_grad():
                logits = next_token_logits(self.model, ids, mask, **self.extra_inputs(ids))
            for row, i in enumerate(rows):
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
    def sequence_logprobs(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                          temperature: float = 1.0, batch: int | None = None) -> list[torch.Tensor]:
        """Per-token log-probs (float32, CPU) of each continuation after its prompt, teacher-forced,
        `batch` (default `score_batch`) rows per pass."""
        out: list[torch.Tensor] = []
        for part in self._chunks(len(prompts), batch or self.score_batch):
            ids, mask, width_p = self.pack([prompts[i] for i in part], [continuations[i] for i in part])
            if ids.shape[1] == width_p:  # nothing to score
                out += [torch.zeros(0) for _ in part]
                continue
            with torch.no_grad():
                lp = token_logprobs(self.model, ids, mask, width_p, chunk=self.logprob_chunk,
                                    temperature=temperature, **self.extra_inputs(ids))
            out += [lp[row, :len(continuations[i])].cpu() for row, i in enumerate(part)]
        return out

    def action_scores(self, prompts: list[list[int]], actions: list[list[list[int]]],
                      temperature: float = 1.0) -> list[torch.Tensor]:
        """Log-prob sum of every candidate action's tokens after each prompt, batched over all pairs.

        Pairs are scored `score_batch` rows at a time, so a large action set (neg_v2: up to 125
        vectors) costs more passes, not more memory.
        """
        pairs = [(i, a) for i, acts in enumerate(actions) for a in acts]
        lps = self.sequence_logprobs([prompts[i] for i, _ in pairs], [a for _, a in pairs], temperature)
        sums = torch.stack([lp.sum() for lp in lps])
        out, k = [], 0
        for acts in actions:
            out.append(sums[k:k + len(acts)])
            k += len(acts)
        return out

    def action_probabilities(self, requests: list[DecisionRequest]) -> list[dict[str, float]]:
        """The model's probability of each legal action at each request's state (Kuhn exploitability).

        Definition: the probability of the action's token sequence as the first thing the assistant
        says after the generation prompt of the request's own prompt (thinking off), under the
        sampling temperature, renormalised over the legal actions. It is the masked scoring of the
        constrained fallback read as a distribution; it ignores any reasoning the model would write
        before its action line.
        """
        if not requests:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            prompts = [self.render(r.messages, answer_now=True) for r in requests]
            scores = self.action_scores(prompts, [[self.action_ids(a) for a in r.legal] for r in requests],
                                        self.logprob_temperature)
        finally:
            self.model.train(was_training)
        return [dict(zip(r.legal, torch.softmax(s.double(), dim=0).tolist())) for r, s in zip(requests, scores)]
