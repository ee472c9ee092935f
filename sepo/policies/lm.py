"""A Hugging Face causal language model as the agent (docs/spec.md §5).

One `act_batch` call answers every pending decision of the arena's lockstep loop:

1. Each request's chat messages are rendered with the tokenizer's chat template (generation prompt
   on), left-padded, and sampled with ONE `generate` call (or one per `batch_size` chunk). A
   per-sequence stopping criterion ends a row as soon as its last non-empty line holds a legal
   action (never while a `<think>` block is open), so short answers do not wait for long ones; it
   decodes only each row's newest token (`IncrementalText`). With `model.prefix_cache` on, prompt
   tokens already encoded are not encoded again: in an episode's first decision the prefix shared
   by every row (the game's rules) is encoded once, as a batch of one, and its KV cache repeated
   (`shared_prefix_length`); at its later decisions each episode's previous prompt, kept with its
   keys and values (`EncodedPrompt`), serves the part the new prompt shares with it (the rules and
   the earlier history), so only the new history lines are encoded (`reuse_plan`, `pack_split`).
   With `model.static_cache` the KV cache is preallocated (`start_cache`).
2. Each answer is parsed with the game's `parse_action`. Rows that do not parse go through the
   constrained fallback: the answer becomes an assistant turn, a user turn asks
   "State your final action (A/B/...):", and one batched forward pass (`score_batch` rows at a
   time) picks the legal action whose first token has the highest logit. When legal actions
   share their first token (neg_v2 vectors such as "[1, 0, 2]"), the whole token sequence of
   every legal action is scored (teacher-forced log-prob sum, in passes of `score_batch` rows)
   and the best one is taken. Either way the action is legal.
3. With `return_logprobs=True` (training), every decision also carries, in `Decision.tokens` (a `TokenTrace`):
   - `prompt_ids` (1-D long tensor): the rendered prompt, unpadded;
   - `gen_ids` (1-D long tensor): the generated tokens, cut where the stopping criterion fired
     (or after the EOS the model wrote; padding dropped);
   - `logprobs` (1-D float32 tensor, one per `gen_ids` token): log p(token | prefix) under the
     sampling distribution, i.e. of logits / `logprob_temperature`, recorded by the sampler while
     it drew the token (`RowSampler`): no second pass. They agree with a teacher-forced pass
     (`sequence_logprobs`) up to float rounding (tested within 1e-5);
   - `logprob_temperature` (float): the sampling temperature, or 1.0 for greedy decoding;
   - `fallback` (bool): True when the action came from the fallback. The record still holds the
     tokens the policy sampled (its real, unparseable answer): the fallback's re-ask and forced
     action were not sampled, so they are part of the environment, never trained on (docs/spec.md §4.3).
   A trainer scores `prompt_ids + gen_ids` with the same temperature to get its new log-probs.

Sampling is pure temperature sampling (no top-k/top-p, whatever the model's generation config
suggests) so that the recorded log-probs are those of the distribution actually sampled from.
Temperature 0 means greedy decoding. Each row samples from its own counter-based stream
(`sepo.lm.sampling.counter_uniforms`), keyed by `seed` and one draw of its episode's agent stream
(`DecisionRequest.rng`), all rows in one vectorised draw per step: an episode's answers do
not depend on which other episodes share the batch, on `batch_size` or on the order of calls, so
adding episodes to a lockstep batch (SEPO's auxiliary episodes) leaves the others unchanged, and
the global torch RNG is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from sepo.games.base import Game, holds_action, think_open  # noqa: F401  (the stopping rule; re-exported)
from sepo.lm.decoding import IncrementalText
from sepo.lm.logprobs import next_token_logits, token_logprobs
from sepo.lm.sampling import PLAIN_SAMPLING, RowSampler
from sepo.models import chat_template_kwargs, forward_extras
from sepo.policies import played
from sepo.policies.base import Decision, DecisionRequest, TokenTrace
from sepo.policies.played import ActionEstimate
from sepo.profiling import section

#: Above this many legal actions the fallback question shows the game's format hint instead.
MAX_LISTED_ACTIONS = 10

#: A prompt prefix shared by every row is computed once only when it is at least this long: below
#: it the extra forward pass costs more than it saves.
MIN_SHARED_PREFIX = 16


def _prompt_columns(t: torch.Tensor, row: int, shared: int, width_a: int, own: int, width_p: int) -> torch.Tensor:
    """Row `row`'s prompt in a cache laid out [shared part | own part]: the last `shared` columns of the
    first `width_a`, then the last `own` of the first `width_p` (both parts are left-padded)."""
    return torch.cat([t[row, :, width_a - shared : width_a], t[row, :, width_p - own : width_p]], dim=1)


@dataclass
class EncodedPrompt:
    """An episode's last prompt and its keys and values per layer ([heads, tokens, head dim]).

    Holding the episode's state object keeps its id from being reused by another object while the
    entry lives. The entry is valid only for the weights that computed it: the arena never changes
    weights in the middle of an episode, and every new episode has a new state.
    """

    state: Any
    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def common_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading tokens `prompt` shares with this entry's prompt."""
        n = min(len(self.ids), len(prompt))
        differ = np.flatnonzero(np.asarray(self.ids[:n]) != np.asarray(prompt[:n]))
        return int(differ[0]) if len(differ) else n


@dataclass
class Answer:
    """One generated answer: prompt ids, generated ids (cut at the stop), their behaviour
    log-probs, the decoded text and the text as parsing sees it (`answer_view`)."""

    prompt: list[int]
    generated: list[int]
    logprobs: torch.Tensor
    text: str
    view: str


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
    appended afterwards (padding, or more tokens where no EOS criterion pads finished rows). Each
    open row's text grows by the tokens it did not see yet (`IncrementalText`: inside `generate`,
    the newest one), and a row is checked only when they added text.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_length: int,
        requests: Sequence[DecisionRequest],
        think_prefix: Sequence[bool] | None = None,
    ):
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.requests = list(requests)
        #: rows whose prompt already opened a <think> block (see `answer_view`)
        self.think_prefix = list(think_prefix or [False] * len(self.requests))
        self.stop_at: list[int | None] = [None] * len(self.requests)
        self.texts = [IncrementalText(tokenizer) for _ in self.requests]
        self.seen = 0  # generated columns already pushed into `texts`

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        with section("stopping"):
            length = input_ids.shape[1] - self.prompt_length
            # the columns not seen yet: one per call inside generate, all of them on a first call
            fresh = input_ids[:, self.prompt_length + self.seen :].tolist()
            self.seen = length
            for i, stop in enumerate(self.stop_at):
                if stop is not None or not "".join([self.texts[i].push(t) for t in fresh[i]]):
                    continue
                text = self.texts[i].text
                request = self.requests[i]
                if holds_action("<think>" + text if self.think_prefix[i] else text, request.game, request.legal):
                    self.stop_at[i] = length
            done = [s is not None for s in self.stop_at]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def score_passes(candidates: Sequence[int], batch: int) -> list[range]:
    """Pair indices (prompt by prompt, `candidates[i]` pairs each) in passes of at most `batch`: prompts
    with few candidates share a pass, and a prompt whose candidates do not fit into the current pass
    starts its own passes, so no pass holds part of one prompt's candidates beside another prompt's."""
    passes: list[range] = []
    start, open_to_more = 0, False  # open_to_more: the last pass holds whole prompts only
    for count in candidates:
        if count == 0:
            continue
        if open_to_more and len(passes[-1]) + count <= batch:
            passes[-1] = range(passes[-1].start, start + count)
        else:
            passes += [range(k, min(k + batch, start + count)) for k in range(start, start + count, batch)]
            open_to_more = count <= batch
        start += count
    return passes


def fallback_question(game: Game, legal: list[str]) -> str:
    """The user turn of the constrained fallback, listing the legal actions when they are few."""
    options = "/".join(legal) if len(legal) <= MAX_LISTED_ACTIONS else (game.action_hint or "/".join(legal))
    return f"State your final action ({options}):"


class LMPolicy:
    """A language model answering decision requests in batches; see the module docstring."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_cfg: Any,
        temperature: float,
        max_new_tokens: int,
        seed: int,
        batch_size: int = 0,
        logprob_chunk: int = 32,
        score_batch: int = 16,
        action_samples: int = 128,
    ):
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
        #: answers sampled per state by `action_probabilities` (K of the played-action estimate)
        self.action_samples = int(action_samples)
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
        #: compute a prompt prefix shared by every row of a generate call once (`shared_prefix_length`)
        self.prefix_cache = bool(model_cfg.get("prefix_cache", False))
        #: preallocate the KV cache instead of growing it at every decoding step (`start_cache`)
        self.static_cache = bool(model_cfg.get("static_cache", False))
        #: the encoded prompt of each episode's last decision, by id of its state (`reuse_plan`)
        self._encoded: dict[int, EncodedPrompt] = {}
        self._encoded_next: dict[int, EncodedPrompt] = {}

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

    def pack(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]] | None = None
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
            ids[i, width_p - len(p) : width_p] = torch.tensor(list(p), dtype=torch.long)
            ids[i, width_p : width_p + len(c)] = torch.tensor(list(c), dtype=torch.long)
            mask[i, width_p - len(p) : width_p + len(c)] = 1
        return ids.to(self.device), mask.to(self.device), width_p

    def extra_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Gemma 4 wants all-zero token type ids (every token is text) in forward and generate."""
        return forward_extras(self.model, self.model_cfg, input_ids)

    def _chunks(self, n: int, size: int | None = None) -> list[range]:
        size = max(1, size or self.batch_size or n)
        return [range(s, min(s + size, n)) for s in range(0, n, size)]

    # ----------------------------------------------------------------- acting
    def episodes_over(self) -> None:
        """Drop the prompt encodings kept for the episodes' next decisions: the arena calls this once every
        episode of a `play` is over. Kept, they would hold one KV cache per episode (a 135M Llama: ~10 MB
        for a 450-token prompt) through whatever runs next, such as SEPO's update."""
        self._encoded, self._encoded_next = {}, {}

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
        answers, decisions = self._answer(requests)
        if return_logprobs:
            for decision, answer in zip(decisions, answers):
                decision.tokens = TokenTrace(
                    prompt_ids=torch.tensor(answer.prompt, dtype=torch.long),
                    gen_ids=torch.tensor(answer.generated, dtype=torch.long),
                    logprobs=answer.logprobs,
                    logprob_temperature=self.logprob_temperature,
                    fallback=not decision.parsed,
                )
        return decisions

    def _answer(self, requests: list[DecisionRequest]) -> tuple[list[Answer], list[Decision]]:
        """Sample, parse and (where nothing parses) fall back: every request's answer and decision."""
        answers: list[Answer] = []
        self._encoded_next = {}
        for part in self._chunks(len(requests)):
            answers += self._generate([requests[i] for i in part])
        # only the episodes that just acted can act next (the arena's lockstep): the rest are over
        self._encoded = self._encoded_next

        decisions: list[Decision] = []
        failed: list[int] = []
        for i, (request, answer) in enumerate(zip(requests, answers)):
            action = request.game.parse_action(answer.view, request.legal)
            if action is None:
                failed.append(i)
            # request.legal[0] is a placeholder, replaced by the fallback below
            decisions.append(Decision(action=action or request.legal[0], text=answer.text, parsed=action is not None))

        if failed:  # the action comes from the fallback; the record keeps the sampled answer
            with section("fallback"):
                forced = self._fallback([requests[i] for i in failed], [answers[i].text for i in failed])
            for i, action in zip(failed, forced):
                decisions[i].action = action
        return answers, decisions

    def answer(self, requests: list[DecisionRequest]) -> tuple[list[Answer], list[Decision]]:
        """Answers and decisions exactly as `act_batch` plays them, for estimates outside an episode
        (`action_probabilities`): eval mode, and the arena's encoded prompts left as they were."""
        was_training, encoded = self.model.training, dict(self._encoded)  # a copy: `_generate` pops what it reuses
        self.model.eval()
        try:
            return self._answer(requests)
        finally:
            self.model.train(was_training)
            self._encoded = encoded

    def shared_prefix_length(self, prompts: Sequence[Sequence[int]]) -> int:
        """Tokens at the start of every prompt that one cached pass can serve for all rows (0: none).

        Only with `model.prefix_cache` on, at least `MIN_SHARED_PREFIX` tokens long, and leaving
        every row at least one token of its own (generate needs a new token per row to start from).
        """
        if not self.prefix_cache or len(prompts) < 2:
            return 0
        first, shortest = prompts[0], min(len(p) for p in prompts)
        length = shortest - 1
        for other in prompts[1:]:
            k = 0
            while k < length and other[k] == first[k]:
                k += 1
            length = k
        return length if length >= MIN_SHARED_PREFIX else 0

    def pack_split(
        self,
        prompts: Sequence[Sequence[int]],
        split: Sequence[int],
        continuations: Sequence[Sequence[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Rows laid out as [padding][prompt[:split]] [padding][prompt[split:]][continuation][padding].

        The first region (width A) holds what is served from a cache: a prefix shared by every row,
        or each episode's earlier prompt; the second is encoded now. Position ids follow the
        attention mask (`position_ids_from_mask`), so padding between the regions changes nothing,
        and a continuation's token t sits at column P + t in every row, as in `pack`. Returns input
        ids, attention mask, the prompts' width P and the first region's width A.
        """
        heads = [list(p[:k]) for p, k in zip(prompts, split)]
        width_a = max(map(len, heads), default=0)
        ids, mask, width = self.pack([list(p[k:]) for p, k in zip(prompts, split)], continuations)
        if width_a == 0:
            return ids, mask, width, 0
        head_ids = torch.full((len(prompts), width_a), self.pad_id, dtype=torch.long)
        head_mask = torch.zeros_like(head_ids)
        for i, h in enumerate(heads):
            if h:
                head_ids[i, width_a - len(h) :] = torch.tensor(h, dtype=torch.long)
                head_mask[i, width_a - len(h) :] = 1
        return (
            torch.cat([head_ids.to(ids.device), ids], dim=1),
            torch.cat([head_mask.to(mask.device), mask], dim=1),
            width_a + width,
            width_a,
        )

    def pack_shared(
        self, prompts: Sequence[Sequence[int]], shared: int, continuations: Sequence[Sequence[int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`pack_split` with the same split for every row: [shared prefix][padding][rest of the
        prompt][continuation][padding]; the prefix sits in the same columns in every row, so one
        pass over it serves the whole batch. Returns input ids, attention mask and P."""
        return self.pack_split(prompts, [shared] * len(prompts), continuations)[:3]

    def start_cache(
        self, ids: torch.Tensor, width_a: int, shared: int, reused: Sequence[EncodedPrompt | None], split: Sequence[int]
    ) -> Any:
        """The KV cache `generate` starts from, holding the first `width_a` columns; None: transformers'
        default (a dynamic cache).

        With a shared prefix (`shared` > 0), one pass over it (a batch of one) fills the cache for
        every row; otherwise row i gets the first `split[i]` positions of its episode's earlier
        prompt (`reused[i]`), right-aligned. With `model.static_cache` the cache is preallocated for
        the prompt and the whole answer budget and written in place: a dynamic cache concatenates
        (copies) every layer's keys and values at every decoding step.
        """
        from transformers import DynamicCache, StaticCache

        if not (self.prefix_cache or self.static_cache):
            return None
        rows = ids.shape[0]
        cache = (
            StaticCache(config=self.model.config, max_cache_len=ids.shape[1] + self.max_new_tokens)
            if self.static_cache
            else DynamicCache(config=self.model.config)
        )
        if shared:
            prefix = DynamicCache(config=self.model.config)
            with torch.no_grad():
                self.model(
                    input_ids=ids[:1, :shared],
                    past_key_values=prefix,
                    use_cache=True,
                    logits_to_keep=1,  # only the cache is wanted: not [shared, vocabulary] logits
                    **self.extra_inputs(ids[:1, :shared]),
                )
            for index, layer in enumerate(prefix.layers):
                cache.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), index)
        elif width_a:
            first = next(e for e in reused if e is not None)
            for index in range(len(first.keys)):
                keys = first.keys[index].new_zeros(
                    (rows, first.keys[index].shape[0], width_a, first.keys[index].shape[2])
                )
                values = first.values[index].new_zeros(
                    (rows, first.values[index].shape[0], width_a, first.values[index].shape[2])
                )
                for i, (entry, k) in enumerate(zip(reused, split)):
                    if entry is not None and k:
                        keys[i, :, width_a - k :] = entry.keys[index][:, :k]
                        values[i, :, width_a - k :] = entry.values[index][:, :k]
                cache.update(keys, values, index)
        return cache

    def reuse_plan(
        self, requests: Sequence[DecisionRequest], prompts: Sequence[Sequence[int]]
    ) -> tuple[list[EncodedPrompt | None], list[int]]:
        """Per request: its episode's encoded earlier prompt and how many of its leading tokens the
        new prompt shares (at least `MIN_SHARED_PREFIX`, leaving one token to encode), or (None, 0)."""
        reused: list[EncodedPrompt | None] = []
        split: list[int] = []
        for request, prompt in zip(requests, prompts):
            entry = self._encoded.get(id(request.state)) if self.prefix_cache else None
            k = entry.common_prefix(prompt) if entry is not None and entry.state is request.state else 0
            k = min(k, len(prompt) - 1)
            reused.append(entry if k >= MIN_SHARED_PREFIX else None)
            split.append(k if k >= MIN_SHARED_PREFIX else 0)
        return reused, split

    def remember(
        self,
        requests: Sequence[DecisionRequest],
        prompts: Sequence[Sequence[int]],
        cache: Any,
        split: Sequence[int],
        width_a: int,
        width_p: int,
    ) -> None:
        """Keep each row's encoded prompt (its columns of the cache) for its episode's next decision."""
        for i, (request, prompt) in enumerate(zip(requests, prompts)):
            shared, own = split[i], len(prompt) - split[i]
            self._encoded_next[id(request.state)] = EncodedPrompt(
                request.state,
                list(prompt),
                [_prompt_columns(layer.keys, i, shared, width_a, own, width_p) for layer in cache.layers],
                [_prompt_columns(layer.values, i, shared, width_a, own, width_p) for layer in cache.layers],
            )

    def _generate(self, requests: list[DecisionRequest]) -> list[Answer]:
        """One generate call; per request its prompt ids, generated ids cut at the stop, their
        behaviour log-probs, the decoded answer and the answer as parsed (`answer_view`)."""
        with section("render"):
            texts = [self.render_text(r.messages) for r in requests]
            prompts = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        reused, split = self.reuse_plan(requests, prompts)
        shared = 0 if any(split) else self.shared_prefix_length(prompts)
        if shared:
            split = [shared] * len(prompts)
        ids, mask, width_p, width_a = self.pack_split(prompts, split)
        with section("generate"), section("prompt_processing"):
            cache = self.start_cache(ids, width_a, shared, reused, split)
        for request, entry in zip(requests, reused):
            if entry is not None:  # copied into the cache: its episode's next entry replaces it (`remember`)
                del self._encoded[id(request.state)]
        del reused
        cache_kwargs = {"past_key_values": cache} if cache is not None else {}
        stop = ActionStoppingCriteria(self.tokenizer, width_p, requests, [think_open(t) for t in texts])
        sampler = RowSampler([self.row_seed(r) for r in requests], self.temperature, self.logprob_temperature)
        with torch.no_grad(), section("generate"):
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                **self.extra_inputs(ids),
                **cache_kwargs,
                do_sample=False,
                temperature=None,
                **PLAIN_SAMPLING,
                logits_processor=LogitsProcessorList([sampler]),
                max_new_tokens=self.max_new_tokens,
                stopping_criteria=StoppingCriteriaList([stop]),
                pad_token_id=self.pad_id,
            )
        if self.prefix_cache:
            with section("remember"):
                self.remember(requests, prompts, cache, split, width_a, width_p)
        results = []
        for i, prompt in enumerate(prompts):
            generated = out[i, width_p:].tolist()
            cut = stop.stop_at[i] if stop.stop_at[i] is not None else len(generated)
            for j, token in enumerate(generated[:cut]):
                if token in self.eos_ids:  # the model ended its turn: keep the EOS, drop the padding
                    cut = j + 1
                    break
            generated = generated[:cut]
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            results.append(
                Answer(prompt, generated, sampler.row_logprobs(i, len(generated)), text, answer_view(texts[i], text))
            )
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
        """docs/spec.md §5: re-ask for the action and choose among the legal ones only; returns the actions.

        Only the action is kept: the re-ask and the forced action were not sampled, so they are never
        part of a decision's record (module docstring).
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
