"""Stage `sepo`: GRPO-style RL on the SEPO objective (docs/spec.md §4), read top to bottom.

`run_sepo` loads the merged SFT model and attaches a fresh LoRA adapter (dropout 0, so that the
importance ratio is exactly 1 on a fresh batch). Every outer iteration plays one rollout batch
(`sepo.training.rollouts.BatchBuilder.collect`: every group of every pool in lockstep, one generate call per
decision point, behaviour log-probs recorded while sampling), whose decisions carry the advantages
of docs/spec.md §4.2, and takes up to
`sepo.refresh_steps` optimizer steps on it.

Refresh ("5 steps or KL > 0.5"): a batch is reused for at most `refresh_steps` optimizer steps, and
fresh rollouts are drawn as soon as KL(pi_theta || pi_old), measured over the batch's tokens with
the parameters AFTER the update, passes `refresh_kl`. A checkpoint step also ends the batch, so a
checkpoint never has to store rollouts; it stores the estimator's running statistics (the exploit
switch and the advantage scale), so a resumed run continues exactly as the uninterrupted one.

The reference policy is the same model with its adapter disabled (`model.disable_adapter()`), or
with `sepo.ref_4bit` a 4-bit copy of the base (`sepo.models.quantized_reference`, CUDA only), and
its pass is skipped when `sepo.beta` is 0; log-probs of the behaviour, current and reference policies
are all taken at the sampling temperature, over generated tokens only, in chunks of
`sepo.logprob_chunk` positions. A decision
whose answer needed the constrained fallback is trained on the tokens the policy sampled, never on
the fallback's action tokens (which it did not sample).

Checkpoint evaluations and the best responders' reads play the policy with its adapter folded into the
weights (`sepo.models.adapter_folded`, `sepo.fold_adapter_for_reads`): the merged model a checkpoint
deploys, without the adapter's per-step cost in decoding. The rollouts play through the adapter, the
pass the update differentiates.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from sepo import distributed
from sepo.builders import load_model_and_tokenizer
from sepo.errors import Diverged, NonFiniteLogits
from sepo.games import Game, make_game
from sepo.games.kuhn import PlayedTable
from sepo.heap import trim_heap
from sepo.lm.logprobs import token_logprobs
from sepo.lm.packed_linear import drop_packed_weights
from sepo.lm.prefix_tree import EncodedRoot, encode_root, root_length, tree_passes, tree_token_logprobs
from sepo.models import adapter_folded, attach_lora, forward_extras, quantized_reference
from sepo.policies.base import Decision, DecisionRequest
from sepo.policies.lm import LMPolicy
from sepo.policies.played import ActionEstimate, estimates_from_answers
from sepo.profiling import gpu_peak_gib_since_last_call, section
from sepo.stages.evaluate import evaluate_and_write, evaluation_policy, played_table_of, split_seed
from sepo.tracking import NO_TRACKING, NullTracker
from sepo.training.best_response import BestResponseSchedule
from sepo.training.checkpoints import load_checkpoint, save_checkpoint
from sepo.training.divergence import check_step, first_non_finite, non_finite_inputs
from sepo.training.exact_values import ExactValueBuilder
from sepo.training.held_terms import (
    HeldState,
    hold_step,
    recovery_advantages,
    term_gradients,
)
from sepo.training.lr_schedule import learning_rate, set_learning_rate
from sepo.training.objective import (
    LOG_RATIO_LIMIT,
    EstimatorState,
    masked,
    old_policy_kl,
    sepo_settings,
    token_loss,
)
from sepo.training.rollouts import BatchBuilder, RolloutBatch

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ settings
class RecordingPolicy:
    """Lets the arena drive an LMPolicy while keeping token ids and behaviour log-probs."""

    def __init__(self, policy: LMPolicy):
        self.policy, self.name = policy, policy.name

    @property
    def workers(self) -> int:
        """The policy's forked workers: the episodes' traces come back from them whole."""
        return self.policy.workers

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        return self.policy.act_batch(requests, return_logprobs=True)

    def read_answers(self, copies: list[DecisionRequest], samples: int) -> tuple[list[Decision], list[ActionEstimate]]:
        """`samples` answers to each request (`sample_requests`' copies), with their training traces, and the
        estimate of the policy's action probabilities read from those very answers (Rao-Blackwellised): what
        an exact-value batch (`sepo.training.exact_values`) trains on and values."""
        answers, decisions = self.policy.answer(copies, return_logprobs=True)
        return decisions, estimates_from_answers(self.policy, copies, answers, decisions, samples)

    def episodes_over(self) -> None:
        self.policy.episodes_over()


# ------------------------------------------------------------------------------ log-probs
def _micro_batches(decisions: list[Decision], size: int, budget: int, shared: int = 0) -> list[list[int]]:
    """Decision indices in passes of at most `size` decisions (`sepo.micro_batch`) and, when `budget` is
    not 0, at most `budget` token positions (`sepo.micro_batch_tokens`), grouped by length (prompt +
    answer tokens).

    A pass holds the activations of every position it encodes for the backward pass, so its memory
    grows with the positions: the token cap bounds it whatever the prompts' length (a long game's late
    rounds get fewer rows per pass). `shared` tokens at the start of every prompt (the rules, with
    `model.prefix_cache`) are encoded once per pass, not once per row, so a pass counts them once and
    each row's own tokens (padded to the pass's longest row) after them. A batch mixes every round of
    every episode (prompts grow by a history line per round), so passes over similar lengths waste
    far less on padding. Every quantity computed per pass is a sum over decisions, so the grouping
    changes nothing else.
    """
    length = [len(d.tokens.prompt_ids) + len(d.tokens.gen_ids) for d in decisions]
    passes: list[list[int]] = []
    for i in sorted(range(len(decisions)), key=length.__getitem__):
        current = passes[-1] if passes else None
        # sorted by length, so row i is the longest of its pass: the pass would encode its prefix once,
        # then (rows + 1) x its own part
        if (
            current is None
            or len(current) >= size
            or (budget and shared + (len(current) + 1) * (length[i] - shared) > budget)
        ):
            passes.append([i])
        else:
            current.append(i)
    return passes


def _passes(
    policy: LMPolicy, decisions: list[Decision], s: DictConfig, grad: bool = True, root: EncodedRoot | None = None
) -> list[list[int]]:
    """`_micro_batches` with the prefix every decision's prompt shares (what each pass encodes once), or,
    with `model.prefix_tree`, runs of the decisions' prefix tree (`tree_passes`: every token shared
    within a pass once; the batch's `root`, encoded once for all passes, counts in none); a pass
    without gradients keeps no activations, so it takes `sepo.no_grad_micro_batch_tokens` when set
    (`grad=True` gives the update's layout, which the reference takes too)."""
    budget = int(s.micro_batch_tokens) if grad else int(s.no_grad_micro_batch_tokens or s.micro_batch_tokens)
    if policy.prefix_tree:
        skip = root.length if root is not None else 0
        return tree_passes([_sequence(d)[skip:] for d in decisions], int(s.micro_batch), budget)
    shared = policy.shared_prefix_length([d.tokens.prompt_ids.tolist() for d in decisions])
    return _micro_batches(decisions, int(s.micro_batch), budget, shared)


def _sequence(decision: Decision) -> list[int]:
    return decision.tokens.prompt_ids.tolist() + decision.tokens.gen_ids.tolist()


def _root(model: Any, policy: LMPolicy, decisions: list[Decision]) -> EncodedRoot | None:
    """With `model.prefix_tree`, the prefix every decision of the batch shares (the game's rules), encoded
    once by `model` as it is now for all the batch's passes (with gradients when they are enabled)."""
    if not policy.prefix_tree or not decisions:
        return None
    sequences = [_sequence(d) for d in decisions]
    shared = root_length(sequences, [len(d.tokens.prompt_ids) for d in decisions])
    return encode_root(model, sequences[0][:shared]) if shared else None


def _policy_logprobs(
    model: Any, policy: LMPolicy, decisions: list[Decision], s: DictConfig, root: EncodedRoot | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[D, L] log-probs of the decisions' generated tokens under `model` as it is now, and their mask
    (`root`: the batch's shared root, `_root`, with `model.prefix_tree`)."""
    if policy.prefix_tree:
        starts = [len(d.tokens.prompt_ids) for d in decisions]
        return tree_token_logprobs(
            model, [_sequence(d) for d in decisions], starts, int(s.logprob_chunk), float(s.temperature), root
        )
    prompts = [d.tokens.prompt_ids.tolist() for d in decisions]
    gens = [d.tokens.gen_ids.tolist() for d in decisions]
    shared = policy.shared_prefix_length(prompts)  # the rules, encoded once per pass (model.prefix_cache)
    ids, mask, start = policy.pack_shared(prompts, shared, gens) if shared else policy.pack(prompts, gens)
    lp = token_logprobs(
        model,
        ids,
        mask,
        start,
        chunk=int(s.logprob_chunk),
        temperature=float(s.temperature),
        shared_prefix=shared,
        **forward_extras(model, policy.model_cfg, ids),
    )
    return lp, mask[:, start:].to(lp.dtype)


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def reference_logprobs(
    model: Any, policy: LMPolicy, batch: RolloutBatch, s: DictConfig, ref_model: Any = None
) -> list[torch.Tensor] | None:
    """log pi_ref of every trained decision's tokens: the same model with the adapter switched off,
    or `ref_model` (the 4-bit copy of `sepo.ref_4bit`) when given.

    Scored in the update's own passes (`like_update`): float sums round by the layout of a pass, and the
    KL term clips max(0, log pi - log pi_ref) per token, so a reference laid out otherwise would leave it
    a floor of rounding where the policy is the reference (Kuhn on smollm2 in bfloat16: 0.0076 at step
    1, where the fresh adapter adds exactly zero; in one layout, exactly 0).

    None when `sepo.beta` is 0: the KL term is then absent, so the pass would be wasted.
    """
    if float(s.beta) == 0.0:
        return None
    out: list[torch.Tensor] = [torch.zeros(0)] * len(batch.decisions)
    scorer = ref_model if ref_model is not None else model
    adapter_off = model.disable_adapter() if ref_model is None else contextlib.nullcontext()
    with torch.no_grad(), adapter_off, section("reference_logprobs"):
        for part, lp, mask in scored_passes(scorer, policy, batch.decisions, s, like_update=True):
            for i, row, m in zip(part, lp, mask):
                out[i] = row[m.bool()]
    return out


def scored_passes(
    scorer: Any, policy: LMPolicy, decisions: list[Decision], s: DictConfig, like_update: bool = False
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Every decision's answer log-probs under `scorer`, pass by pass without gradients, the batch's root
    (the rules) encoded once: (the pass's decision indices, their log-probs, their answer mask). What the
    reference pass and the KL check after an update share; call it under `torch.no_grad()`. `like_update`:
    in the update's passes (`sepo.micro_batch_tokens`), not the wider ones a pass without gradients may
    take (`sepo.no_grad_micro_batch_tokens`)."""
    root = _root(scorer, policy, decisions)
    for part in _passes(policy, decisions, s, grad=like_update, root=root):
        lp, mask = _policy_logprobs(scorer, policy, [decisions[i] for i in part], s, root)
        yield part, lp, mask


def generated_tokens(batch: RolloutBatch) -> int:
    """Tokens generated in the whole batch (summed over processes when data parallel: each holds its share)."""
    return int(distributed.sum_floats(sum(len(d.tokens.gen_ids) for d in batch.decisions))[0])


# ------------------------------------------------------------------------------ the update
def accumulate_gradients(
    model: Any,
    policy: LMPolicy,
    batch: RolloutBatch,
    ref: list[torch.Tensor] | None,
    s: DictConfig,
    before: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """Backward of the batch loss (docs/spec.md §4.3) into `.grad`, micro-batch by micro-batch.

    The policy term is a sum over decisions, so micro-batches simply add up; the KL term is a mean
    over all the batch's tokens, so each micro-batch divides by the batch's token count. `before`, when
    given, receives every decision's token log-probs as this pass scored them (the trust region's anchor).
    """
    model.train()
    tokens = generated_tokens(batch)
    per_answer = answer_divisor(s)
    sums = {
        "loss": 0.0,
        "policy_loss": 0.0,
        "kl_old": 0.0,
        "clip_fraction": 0.0,
        **({"kl_ref": 0.0} if ref is not None else {}),
    }
    anomaly = bool(s.get("debug_detect_anomaly", False))
    with section("update_forward"), torch.autograd.set_detect_anomaly(anomaly):
        root = _root(model, policy, batch.decisions)
    passes, diagnosis = _passes(policy, batch.decisions, s, root=root), ""
    for k, part in enumerate(passes):
        decisions = [batch.decisions[i] for i in part]
        with (
            section("update_forward"),
            torch.autograd.set_detect_anomaly(anomaly),
        ):  # in the forward too: its traceback names the layer
            lp, mask = _policy_logprobs(model, policy, decisions, s, root)
        if before is not None:
            before.extend([None] * (len(batch.decisions) - len(before)))
            for i, row, m in zip(part, lp.detach(), mask):
                before[i] = row[m.bool()]
        width = lp.shape[1]
        old = _pad([d.tokens.logprobs.float() for d in decisions], width).to(lp)
        reference = _pad([ref[i] for i in part], width).to(lp) if ref is not None else None
        adv = torch.tensor([float(batch.advantages[i]) for i in part], dtype=lp.dtype, device=lp.device)
        loss, stats = token_loss(
            lp, old, reference, adv, mask, float(s.clip_eps), float(s.beta), kl_tokens=tokens, answer_tokens=per_answer
        )
        value = loss.item()
        sums["loss"] += value
        if not math.isfinite(value):  # no backward: the step is lost; say what in this pass made it so
            diagnosis = f"the loss of pass {k + 1} of {len(passes)} ({len(part)} decisions) is {value}: "
            diagnosis += non_finite_inputs(lp, old, reference, adv, mask)
            break
        with section("backward"), torch.autograd.set_detect_anomaly(anomaly):
            loss.backward()
        bad = first_non_finite_gradient(model)
        if bad is not None:  # name the first pass that made it so, with what its inputs held
            diagnosis = f"pass {k + 1} of {len(passes)} ({len(part)} decisions, {width} positions) made the gradient of {bad} non-finite, its loss {value:.4g}: "
            diagnosis += non_finite_inputs(lp, old, reference, adv, mask)
            break
        share = float(mask.sum()) / max(tokens, 1)  # token-mean statistics: weight by this part's tokens
        sums["policy_loss"] += float(stats["policy_loss"])
        for key in ("kl_ref", "kl_old", "clip_fraction"):
            if key in stats:
                sums[key] += float(stats[key]) * share
    if root is not None and not diagnosis:  # the passes' shares of the root's gradient, through its pass once
        with section("backward"), torch.autograd.set_detect_anomaly(anomaly):
            root.backward()
        bad = first_non_finite_gradient(model)
        if bad is not None:
            diagnosis = (
                f"the backward through the shared root ({root.length} tokens) made the gradient of {bad} non-finite"
            )
    del root
    model.eval()
    # each process held a share of the sums; every process reaches this sum, so a NaN reaches them all
    summed = dict(zip(sums, distributed.sum_floats(*sums.values())))
    if diagnosis:
        raise Diverged(diagnosis)
    return summed


def held_term_backward(model: Any, policy: LMPolicy, part: RolloutBatch, s: DictConfig) -> None:
    """The gradient of a held term's part of the batch (`sepo.training.held_terms`): its policy loss alone,
    no KL, summed over processes."""
    accumulate_gradients(model, policy, part, None, s)
    distributed.sum_gradients([p for p in model.parameters() if p.requires_grad])


def first_non_finite_gradient(model: Any) -> str | None:
    """The first trainable parameter whose gradient holds a NaN or an infinity, checked with one device sync."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.requires_grad and p.grad is not None]
    if not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all()):
        return None
    return first_non_finite(named)


def answer_divisor(s: DictConfig) -> float | None:
    """What each answer's summed token terms are divided by (`sepo.length_norm`): its own length (None) or the budget."""
    return float(s.max_new_tokens) if s.length_norm == "budget" else None


def old_policy_divergence(model: Any, policy: LMPolicy, batch: RolloutBatch, s: DictConfig) -> float:
    """KL(pi_theta || pi_old) over the batch's tokens with the parameters as they are now (no gradient)."""
    total, tokens = 0.0, 0
    with torch.no_grad(), section("kl_after_update"):
        for part, lp, mask in scored_passes(model, policy, batch.decisions, s):
            old = _pad([batch.decisions[i].tokens.logprobs.float() for i in part], lp.shape[1]).to(lp)
            total += float(masked(old_policy_kl(lp, old), mask.bool()).sum())
            tokens += int(mask.sum())
    total, tokens = distributed.sum_floats(total, tokens)
    return total / max(tokens, 1)


# ------------------------------------------------------------------------------ the trust region
def policy_change(
    model: Any,
    policy: LMPolicy,
    batch: RolloutBatch,
    s: DictConfig,
    before: list[torch.Tensor],
    advantages: np.ndarray,
) -> tuple[float, float]:
    """(KL(pi_theta || pi_before) per decision, the surrogate's gain) on the batch, the parameters as they are now
    against the log-probs the update scored before its step (`before`, in the update's own passes, so that no
    step reads exactly 0 and no rounding of another pass layout reads as a step).

    The KL is between answer distributions, summed over an answer's tokens (the chain rule) and averaged over
    decisions, TRPO's mean KL over states: a mean over tokens would dilute the one token that says the action
    in the templated reasoning around it. The gain is the importance-weighted estimate of what the step adds
    to the objective whose advantages A are `advantages` (J's, `batch.advantages`, or a recovery step's lowered
    terms'): sum_d A_d * mean_t (ratio_t - 1), as the loss weighs each decision's tokens (`sepo.length_norm`)."""
    divisor = answer_divisor(s)
    kl, gain, decisions = 0.0, 0.0, 0
    with torch.no_grad(), section("trust_region"):
        for part, lp, mask in scored_passes(model, policy, batch.decisions, s, like_update=True):
            real = mask.bool()
            old = _pad([before[i] for i in part], lp.shape[1]).to(lp)
            kl += float(masked(old_policy_kl(lp, old), real).sum())
            ratio = torch.exp(torch.clamp(lp - old, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
            per_answer = masked(ratio - 1.0, real).sum(dim=1) / (
                real.sum(dim=1).clamp(min=1) if divisor is None else divisor
            )
            adv = torch.tensor([float(advantages[i]) for i in part], dtype=per_answer.dtype)
            gain += float((adv * per_answer.cpu()).sum())
            decisions += len(part)
    kl, gain, decisions = distributed.sum_floats(kl, gain, decisions)
    return kl / max(decisions, 1), gain


@dataclass
class StepStart:
    """The trainable parameters and the optimizer's state before a step, to shrink the step or undo it."""

    params: list[torch.Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def of(cls, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> StepStart:
        return cls([p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()))


def trust_region(
    model: Any,
    policy: LMPolicy,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    batch: RolloutBatch,
    s: DictConfig,
    start: StepStart,
    before: list[torch.Tensor],
    advantages: np.ndarray,
) -> dict[str, float]:
    """TRPO's line search on the optimizer's step: keep the largest of 1, 1/2, 1/4, ... of it
    (`sepo.line_search_steps` halvings) whose KL(pi_new || pi_old) per decision on the batch is within
    `sepo.trust_region_kl` and whose surrogate gain under `advantages` (J's, or a recovery step's terms')
    is not negative; if none is, undo the step (its
    parameters and the optimizer's moments). With a fresh batch every step the PPO clip never acts (every
    ratio is 1 when the gradient is taken), so without this nothing but the learning rate bounds how far
    one noisy batch moves the policy."""
    full = [p.detach().clone() for p in params]
    fraction = 1.0
    for _ in range(int(s.line_search_steps) + 1):
        kl, gain = policy_change(model, policy, batch, s, before, advantages)
        if kl <= float(s.trust_region_kl) and gain >= 0.0:
            moved = math.sqrt(sum(float((p.detach() - p0).pow(2).sum()) for p, p0 in zip(params, start.params)))
            return {"step_fraction": fraction, "kl_step": kl, "surrogate_gain": gain, "step_norm": moved}
        fraction /= 2
        with torch.no_grad():
            for p, p0, p1 in zip(params, start.params, full):
                p.copy_(p0 + fraction * (p1 - p0))
    with torch.no_grad():
        for p, p0 in zip(params, start.params):
            p.copy_(p0)
    optimizer.load_state_dict(start.optimizer)
    return {"step_fraction": 0.0, "kl_step": 0.0, "surrogate_gain": 0.0, "step_norm": 0.0}


def evaluate_checkpoint(
    cfg: DictConfig, game: Game, model: Any, tokenizer: Any, step: int, final: bool
) -> tuple[dict, Any]:
    """The checkpoint on the validation episodes (`eval.validation_seed`: validation.json, what picks the
    best checkpoint) and on the test episodes (`seed`: results.json, what the tables report); returns the
    test payload and the test read of the played table (None where the game has none)."""
    out = Path(cfg.paths.output_dir) / "eval" / f"step_{step}"
    checkpoint = "final" if final else f"step_{step}"
    for split, name in (("validation", "validation.json"), ("test", "results.json")):
        # validation episodes are sampled from their own stream too, so nothing of them leaks into the test's
        seed = split_seed(cfg, split)
        policy = evaluation_policy(cfg, model, tokenizer, generation_seed=None if split == "test" else seed)
        table = played_table_of(game, policy, seed)
        payload = evaluate_and_write(cfg, game, policy, out / name, "sepo", checkpoint, step, split, table)
    return payload, table


def refresh_read(s: DictConfig) -> dict[str, Any]:
    """How the best responders' refresh reads the played table (`played_table` in results.json records the
    same keys): answers a state, temperature and answer budget."""
    return {
        "samples_per_state": int(s.best_response_samples),
        "temperature": float(s.temperature),
        "max_new_tokens": int(s.max_new_tokens),
    }


def reads_alike(cfg: DictConfig, s: DictConfig) -> bool:
    """Whether an evaluation reads the played table as the best responders' refresh does (cascade attention
    aside, which moves roundings only)."""
    evaluation = {
        "samples_per_state": int(cfg.eval.action_samples),
        "temperature": float(cfg.eval.temperature),
        "max_new_tokens": int(cfg.eval.max_new_tokens),
    }
    return evaluation == refresh_read(s)


def answer_read(learner: Learner, table: Any, step: int, tracker: NullTracker, what: str) -> None:
    """The best responders answer `table`, a read of the policy as it is at `step` made elsewhere (`what`)."""
    cost = learner.best_response.adopt(table, step)
    tracker.log({f"sepo/{k}": v for k, v in cost.items()}, step=step)
    log.info(
        "step %d  best response answers %s: exploit_exact %.3f ± %.3f",
        step,
        what,
        cost["best_response/exploit_exact"],
        cost["best_response/exploit_exact_se"],
    )


def answer_sft_read(cfg: DictConfig, learner: Learner, game: Game, step: int, tracker: NullTracker) -> None:
    """At step 0 the policy is the SFT model (its fresh adapter adds nothing). Where the SFT run that made
    `model.path` (its `merged/`) read that model's table as the best responders would
    (`eval/sft/results.json`: the SFT row's test evaluation, with the same answers a state, temperature and
    budget), they answer that read instead of reading the same model again."""
    if step != 0 or not cfg.model.path or not learner.best_response.due(0):
        return
    path = Path(cfg.model.path).parent / "eval" / "sft" / "results.json"
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # no SFT evaluation beside the model (or an unreadable one): the run reads the table itself
    read = payload.get("played_table") or {}
    if (
        payload.get("stage") != "sft"
        or payload.get("game") != cfg.game.name
        or any(read.get(k) != v for k, v in refresh_read(sepo_settings(cfg)).items())
    ):
        return
    table = PlayedTable.from_json(read, game.ante, game.bet)
    answer_read(learner, table, 0, tracker, f"the SFT evaluation's test read ({path})")


def answer_checkpoint_read(cfg: DictConfig, learner: Learner, table: Any, step: int, tracker: NullTracker) -> None:
    """Where the best responders are due to re-read the policy at a checkpoint's step, they answer the
    checkpoint's test read instead: the same policy read by the same estimator, so a second read (a
    minute of a Kuhn run on smollm2) would only draw other samples. The read's samples are the policy's
    own answers at the 12 information sets, no test episode: the episodes the tables report stay unseen."""
    if table is None or not learner.best_response.due(step) or not reads_alike(cfg, sepo_settings(cfg)):
        return
    answered = f"the checkpoint's test read ({table.samples * len(table.table)} sampled answers)"
    answer_read(learner, table, step, tracker, answered)


# ------------------------------------------------------------------------------ the stage
def training_parts(
    cfg: DictConfig, s: DictConfig, model: Any, tokenizer: Any
) -> tuple[LMPolicy, torch.optim.Optimizer, EstimatorState, BatchBuilder | ExactValueBuilder]:
    """The rollout policy, optimizer, estimator statistics and batch builder of a SEPO run on `model`
    (with its adapter attached); the benchmarks take their steps with the very same parts."""
    policy = LMPolicy(
        model,
        tokenizer,
        cfg.model,
        temperature=float(s.temperature),
        max_new_tokens=int(s.max_new_tokens),
        seed=int(cfg.generation_seed),
        batch_size=int(s.generate_batch),
        logprob_chunk=int(s.logprob_chunk),
        action_samples=int(s.best_response_samples),
        # the update scores the rollouts' tokens with SDPA; sampled with cascade attention, 2.0% of a fresh
        # batch's tokens had |ratio - 1| > 0.2 against 1.1% sampled with SDPA (docs/speed.md §5g)
        cascade_attention=False,
    )
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], s)
    estimator = EstimatorState(scale_decay=float(s.adv_scale_decay), switch_episodes=int(s.exploit_switch_episodes))
    return policy, optimizer, estimator, batch_builder(cfg, s)


def batch_builder(cfg: DictConfig, s: DictConfig) -> BatchBuilder | ExactValueBuilder:
    """`sepo.estimator`: rollouts (episodes against the pools, docs/spec.md §4.2) or exact_values (Kuhn poker:
    answers at the 12 information sets, each action valued exactly, `sepo.training.exact_values`)."""
    return ExactValueBuilder(cfg, s) if s.estimator == "exact_values" else BatchBuilder(cfg, s)


def make_optimizer(params: list[torch.Tensor], s: DictConfig) -> torch.optim.Optimizer:
    """`sepo.optimizer`: AdamW, the paper's, or SGD with momentum. Adam divides each coordinate of the step by
    that coordinate's own running scale, so its first steps are about the sign of each coordinate: where one
    batch's gradient is mostly noise (the main job's SFT model: signal-to-noise 0.34), that sign vector is not
    the gradient's direction (benchmarks/studies/sepo_signal.py measured a cosine of -0.24 with the mean of
    other batches' gradients, against +0.55 for the gradient itself). SGD's step is the gradient, scaled."""
    if s.optimizer == "sgd":
        return torch.optim.SGD(params, lr=float(s.lr), momentum=float(s.momentum), weight_decay=float(s.weight_decay))
    return torch.optim.AdamW(params, lr=float(s.lr), weight_decay=float(s.weight_decay))


def best_response_schedule(builder: BatchBuilder | ExactValueBuilder, s: DictConfig) -> BestResponseSchedule:
    """The run's best-response exploiters and their refresh: the opponents of the pools SEPO plays
    (train, exploit, collusive) that respond to the agent; one in the robust pool is never played
    in training, and evaluation gives it the evaluated policy's table."""
    played = {n for pool in ("train", "exploit", "collusive") for n in builder.pools[pool]}
    responders = [
        st for name, st in builder.strategies.items() if name in played and getattr(st, "responds_to_agent", False)
    ]
    return BestResponseSchedule(responders, int(s.best_response_every), int(s.best_response_samples), int(s.seed))


@dataclass
class Learner:
    """Everything a SEPO step touches, built once per run and restored from its latest checkpoint."""

    model: Any  # the merged SFT model with a fresh LoRA adapter (the policy's weights)
    ref_model: Any  # None: the reference is the adapter switched off; else a 4-bit copy (sepo.ref_4bit)
    tokenizer: Any
    policy: LMPolicy  # samples the rollouts (and their behaviour log-probs)
    optimizer: torch.optim.Optimizer
    estimator: EstimatorState  # running statistics: the exploit switch, the advantage scale
    builder: BatchBuilder | ExactValueBuilder  # builds one training batch
    best_response: BestResponseSchedule  # keeps the pools' best responders answering the current policy
    held: HeldState  # held terms' running gradients and levels (`sepo.held_terms`, `held_average`, `held_at_start`)


def build_learner(cfg: DictConfig, s: DictConfig) -> Learner:
    base, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    model = attach_lora(base, cfg.model.lora.target_modules, int(s.lora.r), int(s.lora.alpha), float(s.lora.dropout))
    # sepo.ref_4bit: the paper's frozen 4-bit reference; by default the reference is the adapter switched off
    ref_model = quantized_reference(model) if s.ref_4bit else None
    policy, optimizer, estimator, builder = training_parts(cfg, s, model, tokenizer)
    best_response = best_response_schedule(builder, s)
    held = HeldState(keep=float(s.held_average))
    return Learner(model, ref_model, tokenizer, policy, optimizer, estimator, builder, best_response, held)


def resume_point(cfg: DictConfig, out: Path, learner: Learner) -> tuple[int, int]:
    """(optimizer step, rollout batch index) to continue from: the newest loadable checkpoint's, or 0."""
    if cfg.resume != "auto":
        return 0, 0
    return load_checkpoint(out, learner)


def refresh_best_response(learner: Learner, game: Game, step: int, tracker: NullTracker, fold: bool) -> None:
    """Every `best_response_every` steps the best responders re-read the policy as it plays now (`fold`:
    its adapter folded into the weights, `sepo.fold_adapter_for_reads`)."""
    if not learner.best_response.due(step):
        return
    with adapter_folded(learner.model, fold):
        cost = learner.best_response.refresh(game, learner.policy, step)
    tracker.log({f"sepo/{k}": v for k, v in cost.items()}, step=step)
    log.info(
        "step %d  best response re-read in %.1f s (%d sampled answers): exploit_exact %.3f ± %.3f",
        step,
        cost["best_response/seconds"],
        cost["best_response/decisions_sampled"],
        cost["best_response/exploit_exact"],
        cost["best_response/exploit_exact_se"],
    )


def update(
    model: Any,
    policy: LMPolicy,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    ref: list[torch.Tensor] | None,
    s: DictConfig,
    step: int,
    held_state: HeldState | None = None,
) -> dict[str, float]:
    """One optimizer step on the whole rollout batch, at this step's learning rate (a function of the step
    alone): micro-batch -> loss -> backward (`accumulate_gradients`), then the gradient summed over
    processes, clipped, and the step, projected so that it raises no held term (`sepo.held_terms`) and then
    shrunk to the trust region; a batch that reads a held term above its level at the start takes the recovery
    step instead (`sepo.held_at_start`; `held_state`: the held terms' running gradients and levels, None: this
    batch's alone). A non-finite loss or gradient takes no step and ends the run as diverged: the
    weights, and every checkpoint so far, stay finite."""
    lr = learning_rate(float(s.lr), str(s.lr_schedule), step, int(s.steps), float(s.lr_final_ratio))
    set_learning_rate(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    before: list[torch.Tensor] | None = [] if float(s.trust_region_kl) > 0 else None
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in trainable]
    try:
        held = term_gradients(
            params, list(s.held_terms), batch, lambda part: held_term_backward(model, policy, part, s)
        )
        stats = accumulate_gradients(model, policy, batch, ref, s, before)
        if not math.isfinite(stats["loss"]):  # summed over processes: another one's pass was not finite
            raise Diverged(f"the loss is {stats['loss']} (another process's pass)")
        distributed.sum_gradients(params)  # data parallel: every process now holds the whole batch's gradient
        bad = first_non_finite((n, p.grad) for n, p in trainable)
        if bad is not None:
            raise Diverged(f"the loss is {stats['loss']} but the gradient of {bad} is not finite")
    except Diverged as err:
        optimizer.zero_grad(set_to_none=True)
        raise Diverged(f"diverged at step {step + 1}: {err}; the checkpoints before it are kept") from None
    with section("optimizer"):
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, float(s.grad_clip)))
        start = StepStart.of(params, optimizer) if before is not None or held else None
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gain_advantages = batch.advantages
    if held:
        state = held_state or HeldState(keep=0.0)
        held, agreement = state.update(held)
        stats.update(agreement)
        above, levels = state.above_budget(batch.stats, held, list(s.held_at_start))
        stats.update(levels)
        stats.update(hold_step(params, start.params, held, above))
        if above:
            gain_advantages = recovery_advantages(batch, above)
    if before is not None:
        stats.update(trust_region(model, policy, optimizer, params, batch, s, start, before, gain_advantages))
    check_step(step + 1, None, model, when="after")
    return {**stats, "lr": lr}


def batch_spent(s: DictConfig, reuse: int, step: int, checkpoints: set[int]) -> bool:
    """Fresh rollouts are due after `refresh_steps` updates on a batch, at a checkpoint, and at the end
    of the run (a checkpoint never stores rollouts). The refresh rule's other half ("5 steps or KL > 0.5")
    is measured in the loop: the updated policy's KL from the one that sampled the batch."""
    return reuse + 1 == int(s.refresh_steps) or step in checkpoints or step >= int(s.steps)


def log_step(
    tracker: NullTracker, step: int, reuse: int, batch: RolloutBatch, stats: dict, tokens: int, seconds: float
):
    gpu_peak = gpu_peak_gib_since_last_call()
    tracker.log(
        {
            **{f"sepo/{k}": v for k, v in {**batch.stats, **stats}.items()},
            "sepo/reuse": reuse,
            "sepo/tokens_generated": tokens,
            "sepo/seconds_per_step": seconds,
            **({"sepo/gpu_peak_gib": gpu_peak} if gpu_peak is not None else {}),
        },
        step=step,
    )
    trust = f"  kl_step {stats['kl_step']:.4f}  step {stats['step_fraction']:.3g}" if "kl_step" in stats else ""
    read = f"  exploit_exact {batch.stats['exploit_exact']:.3f}" if "exploit_exact" in batch.stats else ""
    held = "".join(
        f"  held {k.split('/')[1]} cos {v:+.3f}{' removed' if stats.get(k.replace('cosine', 'removed')) else ''}"
        f"{' recovery' if stats.get('held/recovery') else ''}"
        f" agreement {stats.get(k.replace('cosine', 'agreement'), math.nan):+.3f}"
        for k, v in stats.items()
        if k.startswith("held/") and k.endswith("/cosine")
    )
    terms = " ".join(
        f"{k.split('/')[1]} {batch.stats[k]:.3f}" for k in ("train/u", "exploit/e", "collusive/c", "train/x")
    )
    log.info(
        "step %d  loss %.4f  objective %.3f (%s)%s  kl_ref %.4f  kl_after %s  clip %.3f%s%s  %.1f s%s",
        step,
        stats["loss"],
        batch.stats["objective"],
        terms,
        read,
        stats.get("kl_ref", 0.0),
        f"{stats['kl_old_after']:.4f}" if "kl_old_after" in stats else "-",
        stats["clip_fraction"],
        held,
        trust,
        seconds,
        f"  gpu peak {gpu_peak:.1f} GiB" if gpu_peak is not None else "",
    )


def checkpoint(
    cfg: DictConfig,
    out: Path,
    game: Game,
    learner: Learner,
    step: int,
    batch_index: int,
    final: bool,
    tracker: NullTracker,
) -> None:
    """Evaluate the policy (test and validation episodes), let the best responders answer its test read
    when they are due (`answer_checkpoint_read`) and save everything a resume needs, on rank 0; every
    process answers the same read and waits for the save."""
    table = None
    if distributed.is_main():
        with adapter_folded(learner.model, bool(cfg.sepo.fold_adapter_for_reads)):
            result, table = evaluate_checkpoint(cfg, game, learner.model, learner.tokenizer, step, final)
        tracker.log({f"eval/{k}": v for k, v in result["metrics"].items()}, step=step)
        answer_checkpoint_read(cfg, learner, table, step, tracker)
        save_checkpoint(out, learner, step, batch_index)
    table = distributed.all_gather(table)[0]
    if not distributed.is_main():
        answer_checkpoint_read(cfg, learner, table, step, NO_TRACKING)
    distributed.barrier()


@contextlib.contextmanager
def diverged_if_unplayable(step: int):
    """Weights that stay finite can still be too large to play (`sepo.lr=1e30`): the next rollout then
    meets NaN scores, which is the divergence of the update before it."""
    try:
        yield
    except NonFiniteLogits as err:
        raise Diverged(f"diverged at step {step}: {err}; the checkpoints before it are kept") from None


def crash_if_asked(s: DictConfig, step: int) -> None:
    """Test hook (`sepo.debug_kill_after_step`): die here like a preempted job, to check resume."""
    if s.get("debug_kill_after_step") is not None and step == int(s.debug_kill_after_step):
        os.kill(os.getpid(), signal.SIGKILL)


def run_sepo(cfg: DictConfig, tracker: NullTracker = NO_TRACKING) -> dict[str, Any]:
    s = sepo_settings(cfg)
    out = Path(cfg.paths.output_dir)
    torch.manual_seed(int(s.seed))
    game = make_game(cfg.game)
    learner = build_learner(cfg, s)
    step, batch_index = resume_point(cfg, out, learner)
    answer_sft_read(cfg, learner, game, step, tracker)
    checkpoints = {int(k) for k in s.checkpoint_steps} | {int(s.steps)}

    while step < int(s.steps):
        started = time.time()
        with diverged_if_unplayable(step):
            # the exploiter answers the policy as it is now
            refresh_best_response(learner, game, step, tracker, bool(s.fold_adapter_for_reads))
            batch = learner.builder.collect(game, RecordingPolicy(learner.policy), batch_index, learner.estimator)
        batch_index += 1
        # each phase peaks on its own, not on the pages the one before freed: glibc's trim only, since a garbage
        # collection here scans every live object of the process (0.2-0.3 s a call) and found no tensor in cycles
        trim_heap()
        ref = reference_logprobs(learner.model, learner.policy, batch, s, learner.ref_model)
        tokens = generated_tokens(batch)
        drop_packed_weights(learner.model)  # the update takes gradients: its peak stays without the blocked copies
        for reuse in range(int(s.refresh_steps)):
            trim_heap()
            stats = update(learner.model, learner.policy, learner.optimizer, batch, ref, s, step, learner.held)
            trim_heap()
            step += 1
            done_with_batch = batch_spent(s, reuse, step, checkpoints)
            if not done_with_batch:  # or has the policy moved more than refresh_kl from the batch's sampler?
                stats["kl_old_after"] = old_policy_divergence(learner.model, learner.policy, batch, s)
                done_with_batch = stats["kl_old_after"] > float(s.refresh_kl)
            log_step(tracker, step, reuse, batch, stats, tokens, time.time() - started)
            started = time.time()
            if step in checkpoints:
                checkpoint(cfg, out, game, learner, step, batch_index, step == int(s.steps), tracker)
            crash_if_asked(s, step)
            if done_with_batch:
                break

    if not distributed.is_main():
        return {}
    learner.model.save_pretrained(out / "adapter")
    summary = json.loads((out / "eval" / f"step_{int(s.steps)}" / "results.json").read_text())
    tracker.summary({f"final/{k}": v for k, v in summary["metrics"].items()})
    return summary
