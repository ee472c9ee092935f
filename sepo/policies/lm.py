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
   the earlier history), so only the new history lines are encoded (`sepo.lm.prompt_cache`).
   With `model.static_cache` the KV cache is preallocated (`start_cache`).
2. Each answer is parsed with the game's `parse_action`. Rows that do not parse go through the
   constrained fallback: the answer becomes an assistant turn, a user turn asks
   "State your final action (A/B/...):", and one batched forward pass picks the legal action whose
   first token has the highest logit. With `model.prefix_cache` the pass encodes only what the
   generate call's cache does not already hold (the question, after the prompt and the answer:
   `Encoded`, `continued_next_token_logits`); otherwise `score_batch` padded rows at a time. When legal actions
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

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from sepo.forked import worker_count
from sepo.games.base import Game, holds_action, think_open  # noqa: F401  (the stopping rule; re-exported)
from sepo.lm import batching
from sepo.lm.batching import MIN_SHARED_PREFIX, common_prefix, end_of_turn_ids, score_passes  # noqa: F401  (re-exported)
from sepo.lm.cascade_attention import shared_prefix
from sepo.lm.graph_decoding import CudaGraphs, graph_decoding
from sepo.lm.logprobs import next_token_logits, token_logprobs
from sepo.lm.prefix_tree import tree_token_logprobs
from sepo.lm.prompt_cache import EncodedPrompt, PromptCache, continued_next_token_logits, start_cache
from sepo.lm.row_dropping import RowsDecoded, decode_dropping_stopped, held_rows_cache
from sepo.lm.sampling import PLAIN_SAMPLING, RowSampler
from sepo.lm.stopping import StopWhen
from sepo.models import chat_template_kwargs, forward_extras
from sepo.policies import played
from sepo.policies.base import Decision, DecisionRequest, TokenTrace
from sepo.policies.played import ActionEstimate
from sepo.profiling import section

#: Above this many legal actions the fallback question shows the game's format hint instead.
MAX_LISTED_ACTIONS = 10


@dataclass
class Answer:
    """One generated answer: prompt ids, generated ids (cut at the stop), their behaviour
    log-probs, the decoded text and the text as parsing sees it (`answer_view`)."""

    prompt: list[int]
    generated: list[int]
    logprobs: torch.Tensor
    text: str
    view: str


@dataclass
class Encoded:
    """What a generate call left encoded: its KV cache and, per row, the tokens its columns hold (the prompt,
    then the answer up to the last token fed back), marked in `columns` (bool [rows, cache columns]) in order.
    The constrained fallback asks its question after them (`LMPolicy._fallback`)."""

    cache: Any
    columns: torch.Tensor
    tokens: list[list[int]]
    #: the cache row of each request row it holds, where it holds only some (`model.drop_stopped_rows` keeps those
    #: that left without an action); None: every request row, in order
    rows: dict[int, int] | None = None

    def row(self, request_row: int) -> int | None:
        """The cache row holding request row `request_row`'s tokens, or None where none does."""
        return request_row if self.rows is None else self.rows.get(request_row)


def answer_view(prompt_text: str, answer: str) -> str:
    """The answer as parsing must see it: with "<think>" in front when the prompt opened the block.

    Some chat templates (the tiny model's and Qwen's with thinking on) end the generation prompt
    with "<think>", so the model's answer holds only the closing tag; an action line written before
    it is still reasoning.
    """
    return "<think>" + answer if think_open(prompt_text) else answer


def encoded_by_generation(cache: Any, prompt_mask: torch.Tensor, answers: list[Answer], steps: int) -> Encoded:
    """`Encoded` of a generate call that ran `steps` steps after prompts laid out as `prompt_mask` says: a row's
    answer tokens sit in the columns after the prompts', up to the last token fed back (the last sampled
    token of the call never is, nor are the padding tokens fed to rows already stopped)."""
    rows, width_p = prompt_mask.shape
    columns = torch.zeros((rows, width_p + max(steps - 1, 0)), dtype=torch.bool, device=prompt_mask.device)
    columns[:, :width_p] = prompt_mask.bool()
    tokens = []
    for i, answer in enumerate(answers):
        fed = min(len(answer.generated), max(steps - 1, 0))
        columns[i, width_p : width_p + fed] = True
        tokens.append(list(answer.prompt) + list(answer.generated[:fed]))
    return Encoded(cache, columns, tokens)


def encoded_by_dropping(model: Any, prompts: Sequence[Sequence[int]], decoded: RowsDecoded) -> Encoded | None:
    """`Encoded` of a decoding that let rows go as they stopped: the rows that left without an action, each with
    its prompt and the answer tokens it fed back (None when every row stopped on an action)."""
    if not decoded.held:
        return None
    cache, columns, order = held_rows_cache(model, decoded.held)
    tokens = [list(prompts[r]) + decoded.tokens[r][: decoded.fed(r)] for r in order]
    return Encoded(cache, columns, tokens, {r: i for i, r in enumerate(order)})


class ActionStoppingCriteria(StopWhen):
    """Stops each row of a batch once its answer so far holds a legal action (`StopWhen`); a row whose
    prompt opened a <think> block (`think_prefix`) is read as `answer_view` reads it."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_length: int,
        requests: Sequence[DecisionRequest],
        think_prefix: Sequence[bool] | None = None,
    ):
        think = list(think_prefix or [False] * len(requests))

        def holds(i: int, text: str) -> bool:
            return holds_action("<think>" + text if think[i] else text, requests[i].game, requests[i].legal)

        super().__init__(tokenizer, prompt_length, len(requests), holds)


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
        cascade_attention: bool | None = None,
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
        self.eos_ids = end_of_turn_ids(model, tokenizer)
        #: compute a prompt prefix shared by every row of a generate call once (`shared_prefix_length`)
        self.prefix_cache = bool(model_cfg.get("prefix_cache", False))
        #: teacher-forced passes encode their sequences as one prefix tree (`sepo.lm.prefix_tree`): each token
        #: that several share once, where padded rows encode every row's own prompt whole
        self.prefix_tree = bool(model_cfg.get("prefix_tree", False)) and self.prefix_cache
        #: preallocate the KV cache instead of growing it at every decoding step (`start_cache`)
        self.static_cache = bool(model_cfg.get("static_cache", False))
        #: decode steps replayed as CUDA graphs (`sepo.lm.graph_decoding`); a GPU and a static cache only
        self.decode_graphs = bool(model_cfg.get("decode_graphs", False)) and self.static_cache
        #: what makes the graphs: CUDA's capture (tests trace on a CPU instead)
        self.graph_backend = CudaGraphs
        #: decoding reads the rows' shared prefix once (`sepo.lm.cascade_attention`): `model.cascade_attention`
        #: unless the caller says otherwise (SEPO's rollouts do not: see `sepo.stages.sepo_loop.training_parts`)
        self.cascade_attention = self.prefix_cache and bool(
            model_cfg.get("cascade_attention", False) if cascade_attention is None else cascade_attention
        )
        #: a generate call's rows leave its batch as they stop, once the open ones are at most this share of the
        #: batch (`sepo.lm.row_dropping`; `model.drop_stopped_rows`, plain full attention, not with graphs); 0: never
        self.drop_stopped_rows = (
            float(model_cfg.get("drop_stopped_rows", 0) or 0) if self.prefix_cache and not self.decode_graphs else 0.0
        )
        #: the encoded prompt of each episode's last decision, for its next one (`model.prefix_cache`)
        self.prompt_cache = PromptCache(self.prefix_cache)
        #: forked processes that share a Kuhn table's read, an evaluation's episodes and SEPO's rollouts on a
        #: CPU (`model.cpu_workers`, `sepo.forked`)
        self.workers = worker_count(int(model_cfg.get("cpu_workers", 1)), self.device)

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
        """`sepo.lm.batching.pack` on the model's device: input ids, attention mask and the prompts' width."""
        ids, mask, width_p = batching.pack(prompts, self.pad_id, continuations)
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
        self.prompt_cache.clear()

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
            self._trace(answers, decisions)
        return decisions

    def _trace(self, answers: list[Answer], decisions: list[Decision]) -> None:
        """Give every decision its answer's tokens and behaviour log-probs, for training."""
        for decision, answer in zip(decisions, answers):
            decision.tokens = TokenTrace(
                prompt_ids=torch.tensor(answer.prompt, dtype=torch.long),
                gen_ids=torch.tensor(answer.generated, dtype=torch.long),
                logprobs=answer.logprobs,
                logprob_temperature=self.logprob_temperature,
                fallback=not decision.parsed,
            )

    def _answer(self, requests: list[DecisionRequest]) -> tuple[list[Answer], list[Decision]]:
        """Sample, parse and (where nothing parses) fall back: every request's answer and decision."""
        answers: list[Answer] = []
        decisions: list[Decision] = []
        for part in self._chunks(len(requests)):
            chunk = [requests[i] for i in part]
            got, encoded = self._generate(chunk)
            answers += got
            decisions += self._decide(chunk, got, encoded)  # while the call's cache is at hand
        self.prompt_cache.round_over()
        return answers, decisions

    def _decide(
        self, requests: list[DecisionRequest], answers: list[Answer], encoded: Encoded | None
    ) -> list[Decision]:
        """Each answer's action as parsed, or the constrained fallback's where none parses."""
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
                forced = self._fallback(
                    [requests[i] for i in failed], [answers[i].text for i in failed], encoded, failed
                )
            for i, action in zip(failed, forced):
                decisions[i].action = action
        return decisions

    def answer(
        self, requests: list[DecisionRequest], return_logprobs: bool = False
    ) -> tuple[list[Answer], list[Decision]]:
        """Answers and decisions exactly as `act_batch` plays them, for estimates outside an episode
        (`action_probabilities`, and a SEPO batch that trains on the answers it reads the table from):
        eval mode, and the arena's encoded prompts left as they were."""
        was_training, encoded = self.model.training, dict(self.prompt_cache.held)  # a copy: `_generate` pops
        self.model.eval()
        try:
            answers, decisions = self._answer(requests)
            if return_logprobs:
                self._trace(answers, decisions)
            return answers, decisions
        finally:
            self.model.train(was_training)
            self.prompt_cache.held = encoded

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

    def start_cache(
        self, ids: torch.Tensor, width_a: int, shared: int, reused: Sequence[EncodedPrompt | None], split: Sequence[int]
    ) -> Any:
        """`sepo.lm.prompt_cache.start_cache`; None (transformers' dynamic cache) when neither
        `model.prefix_cache` nor `model.static_cache` is on."""
        if not (self.prefix_cache or self.static_cache):
            return None
        static_tokens = self.max_new_tokens if self.static_cache else None
        return start_cache(self.model, ids, width_a, shared, reused, split, static_tokens, self.extra_inputs)

    def _generate(self, requests: list[DecisionRequest]) -> tuple[list[Answer], Encoded | None]:
        """One generate call; per request its prompt ids, generated ids cut at the stop, their
        behaviour log-probs, the decoded answer and the answer as parsed (`answer_view`); and what the
        call left encoded (None without `model.prefix_cache`: transformers' own cache is not handed back)."""
        with section("render"):
            texts = [self.render_text(r.messages) for r in requests]
            prompts = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        states = [r.state for r in requests]
        reused, split = self.prompt_cache.plan(states, prompts)
        shared = 0 if any(split) else self.shared_prefix_length(prompts)
        if shared:
            split = [shared] * len(prompts)
        ids, mask, width_p, width_a = self.pack_split(prompts, split)
        with section("generate"), section("prompt_processing"):
            cache = self.start_cache(ids, width_a, shared, reused, split)
        self.prompt_cache.release(states, reused)
        del reused
        stop = ActionStoppingCriteria(self.tokenizer, width_p, requests, [think_open(t) for t in texts])
        sampler = RowSampler([self.row_seed(r) for r in requests], self.temperature, self.logprob_temperature)

        def remember(cache: Any) -> None:  # each row's encoded prompt, for its episode's next decision
            if self.prefix_cache:
                with section("remember"):
                    self.prompt_cache.keep(states, prompts, cache, split, width_a, width_p)

        with (
            torch.no_grad(),
            section("generate"),
            shared_prefix(shared if self.cascade_attention else 0),
            self.graphs(),
        ):
            if self.drop_stopped_rows:
                decoded = decode_dropping_stopped(
                    self.model,
                    ids,
                    mask,
                    width_a,
                    cache,
                    sampler,
                    stop,
                    self.eos_ids,
                    self.max_new_tokens,
                    self.drop_stopped_rows,
                    self.pad_id,
                    self.extra_inputs,
                    after_prompts=remember,
                )
                rows = decoded.tokens
            else:
                out = self._sample_with_generate(ids, mask, cache, stop, sampler)
                remember(cache)
                rows = out[:, width_p:].tolist()
        results = []
        for i, (prompt, generated) in enumerate(zip(prompts, rows)):
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
        if self.drop_stopped_rows:
            return results, encoded_by_dropping(self.model, prompts, decoded)
        return results, encoded_by_generation(
            cache, mask, results, out.shape[1] - width_p
        ) if self.prefix_cache else None

    def _sample_with_generate(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: Any, stop: ActionStoppingCriteria, sampler: RowSampler
    ) -> torch.Tensor:
        """transformers' `generate` with the policy's sampler and stopping rule: prompts and answers [rows, columns]."""
        return self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            **self.extra_inputs(ids),
            **({"past_key_values": cache} if cache is not None else {}),
            do_sample=False,
            temperature=None,
            **PLAIN_SAMPLING,
            logits_processor=LogitsProcessorList([sampler]),
            max_new_tokens=self.max_new_tokens,
            stopping_criteria=StoppingCriteriaList([stop]),
            pad_token_id=self.pad_id,
            disable_compile=True,  # on a GPU transformers would torch.compile a static cache's steps (minutes a shape)
        )

    def graphs(self) -> contextlib.AbstractContextManager:
        """`graph_decoding` for a generate call where its decode steps are replayed as graphs: `model.decode_graphs`
        on a GPU, or wherever a test gives its own `graph_backend`."""
        made_here = self.device.type == "cuda" or self.graph_backend is not CudaGraphs
        return (
            graph_decoding(self.model, self.graph_backend)
            if self.decode_graphs and made_here
            else contextlib.nullcontext()
        )

    def row_seed(self, request: DecisionRequest) -> int:
        """The sampling seed of one decision: `seed` mixed with a draw from the episode's stream."""
        if request.rng is not None:
            draw = int(request.rng.integers(2**63))
        else:
            draw = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        key = [self.seed, draw]
        return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> np.uint64(1))

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
