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
2. Each answer is parsed with the game's `parse_action`; a row that does not parse goes through the
   constrained fallback (`sepo.policies.lm_scoring`), so the action is always legal.
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
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from sepo.forked import worker_count
from sepo.games.base import think_open
from sepo.lm.batching import end_of_turn_ids
from sepo.lm.cascade_attention import shared_prefix
from sepo.lm.graph_decoding import CudaGraphs, graph_decoding
from sepo.lm.prompt_cache import EncodedPrompt, PromptCache, start_cache
from sepo.lm.row_dropping import decode_dropping_stopped
from sepo.lm.sampling import PLAIN_SAMPLING, RowSampler
from sepo.models import chat_template_kwargs, forward_extras
from sepo.policies.base import Decision, DecisionRequest, TokenTrace
from sepo.policies.lm_answers import (
    ActionStoppingCriteria,
    Answer,
    Encoded,
    answer_view,
    encoded_by_dropping,
    encoded_by_generation,
)
from sepo.policies.lm_scoring import Scoring
from sepo.profiling import section


class LMPolicy(Scoring):
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
        self.name = f"lm:{model_cfg.name}"
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
        self._read_switches(model_cfg, cascade_attention)
        #: the encoded prompt of each episode's last decision, for its next one (`model.prefix_cache`)
        self.prompt_cache = PromptCache(self.prefix_cache)
        #: forked processes that share a Kuhn table's read, an evaluation's episodes and SEPO's rollouts on a
        #: CPU (`model.cpu_workers`, `sepo.forked`)
        self.workers = worker_count(model_cfg.cpu_workers, self.device)

    def _read_switches(self, model_cfg: Any, cascade_attention: bool | None) -> None:
        """The model's decoding switches (conf/model/<model>.yaml), each on only where what it needs is."""
        #: compute a prompt prefix shared by every row of a generate call once (`shared_prefix_length`)
        self.prefix_cache = model_cfg.prefix_cache
        #: teacher-forced passes encode their sequences as one prefix tree (`sepo.lm.prefix_tree`): each token
        #: that several share once, where padded rows encode every row's own prompt whole
        self.prefix_tree = model_cfg.prefix_tree and self.prefix_cache
        #: preallocate the KV cache instead of growing it at every decoding step (`start_cache`)
        self.static_cache = model_cfg.static_cache
        #: decode steps replayed as CUDA graphs (`sepo.lm.graph_decoding`); a GPU and a static cache only
        self.decode_graphs = model_cfg.decode_graphs and self.static_cache
        #: what makes the graphs: CUDA's capture (tests trace on a CPU instead)
        self.graph_backend = CudaGraphs
        #: decoding reads the rows' shared prefix once (`sepo.lm.cascade_attention`): `model.cascade_attention`
        #: unless the caller says otherwise (SEPO's rollouts do not: see `sepo.stages.sepo_loop.training_parts`)
        self.cascade_attention = self.prefix_cache and (
            model_cfg.cascade_attention if cascade_attention is None else cascade_attention
        )
        #: a generate call's rows leave its batch as they stop, once the open ones are at most this share of the
        #: batch (`sepo.lm.row_dropping`; `model.drop_stopped_rows`, plain full attention, not with graphs); 0: never
        self.drop_stopped_rows = model_cfg.drop_stopped_rows if self.prefix_cache and not self.decode_graphs else 0.0

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

    def extra_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Gemma 4 wants all-zero token type ids (every token is text) in forward and generate."""
        return forward_extras(self.model, self.model_cfg, input_ids)

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
        results = self._cut_answers(prompts, texts, rows, stop, sampler)
        if self.drop_stopped_rows:
            return results, encoded_by_dropping(self.model, prompts, decoded)
        return results, encoded_by_generation(
            cache, mask, results, out.shape[1] - width_p
        ) if self.prefix_cache else None

    def _cut_answers(
        self,
        prompts: list[list[int]],
        texts: list[str],
        rows: list[list[int]],
        stop: ActionStoppingCriteria,
        sampler: RowSampler,
    ) -> list[Answer]:
        """Each row's answer, cut where its stopping rule fired or after the end of turn the model wrote."""
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
        return results

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
