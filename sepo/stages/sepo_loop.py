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
import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from sepo import distributed, penalties
from sepo.builders import load_model_and_tokenizer
from sepo.errors import Diverged, NonFiniteLogits
from sepo.games import Game, make_game
from sepo.heap import trim_heap
from sepo.lm.adapters import load_trained_weights
from sepo.lm.packed_linear import drop_packed_weights
from sepo.models import adapter_folded, attach_lora, quantized_reference
from sepo.policies.lm import LMPolicy
from sepo.policies.recording import RecordingPolicy
from sepo.profiling import gpu_peak_gib_since_last_call, section
from sepo.stages.evaluate import evaluate_checkpoint, evaluation_policy
from sepo.tracking import NO_TRACKING, NullTracker
from sepo.training.best_response import BestResponseSchedule
from sepo.training.checkpoints import load_checkpoint, save_checkpoint
from sepo.training.divergence import check_step, first_non_finite
from sepo.training.exact_values import ExactValueBuilder
from sepo.training.held_terms import (
    HeldState,
    hold_step,
    recovery_advantages,
    term_gradients,
)
from sepo.training.learned_exploiters import seat_learned_exploiters
from sepo.training.lr_schedule import learning_rate, set_learning_rate
from sepo.training.objective import (
    EstimatorState,
    sepo_settings,
)
from sepo.training.passes import generated_tokens, reference_logprobs
from sepo.training.rollouts import BatchBuilder, RolloutBatch
from sepo.training.update import (
    StepStart,
    accumulate_gradients,
    held_term_backward,
    old_policy_divergence,
    trust_region,
)

log = logging.getLogger(__name__)


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
        temperature=s.temperature,
        max_new_tokens=s.max_new_tokens,
        seed=cfg.generation_seed,
        batch_size=s.generate_batch,
        logprob_chunk=s.logprob_chunk,
        action_samples=s.best_response_samples,
        # the update scores the rollouts' tokens with SDPA; sampled with cascade attention, 2.0% of a fresh
        # batch's tokens had |ratio - 1| > 0.2 against 1.1% sampled with SDPA (docs/speed.md §5g)
        cascade_attention=False,
    )
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], s)
    estimator = EstimatorState(scale_decay=s.adv_scale_decay, switch_episodes=s.exploit_switch_episodes)
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
        return torch.optim.SGD(params, lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
    return torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)


def best_response_schedule(builder: BatchBuilder | ExactValueBuilder, s: DictConfig) -> BestResponseSchedule:
    """The run's best-response exploiters and their refresh: the opponents of the pools SEPO plays
    (`penalties.trained_pools()`: train, exploit, collusive) that respond to the agent; one in the robust pool is
    never played in training, and evaluation gives it the evaluated policy's table."""
    played = {n for pool in penalties.trained_pools() for n in builder.pools[pool]}
    responders = [
        st for name, st in builder.strategies.items() if name in played and getattr(st, "responds_to_agent", False)
    ]
    return BestResponseSchedule(responders, s.best_response_every, s.best_response_samples, s.seed)


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
    model = attach_lora(base, cfg.model.lora.target_modules, s.lora.r, s.lora.alpha, s.lora.dropout)
    if s.init_adapter:  # continue a policy (a PSRO iteration) rather than start from the SFT model
        load_trained_weights(model, s.init_adapter)
    # sepo.ref_4bit: the paper's frozen 4-bit reference; by default the reference is the adapter switched off
    ref_model = quantized_reference(model) if s.ref_4bit else None
    policy, optimizer, estimator, builder = training_parts(cfg, s, model, tokenizer)
    seat_learned_exploiters(model, s.learned_exploiters, lambda: evaluation_policy(cfg, model, tokenizer), builder)
    best_response = best_response_schedule(builder, s)
    held = HeldState(keep=s.held_average, z=s.held_level_z)
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
    lr = learning_rate(s.lr, s.lr_schedule, step, s.steps, s.lr_final_ratio)
    set_learning_rate(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    before: list[torch.Tensor] | None = [] if s.trust_region_kl > 0 else None
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
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, s.grad_clip))
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
    return reuse + 1 == s.refresh_steps or step in checkpoints or step >= s.steps


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
    when they are due (`BestResponseSchedule.answer_checkpoint_read`) and save everything a resume needs, on rank 0; every
    process answers the same read and waits for the save."""
    table = None
    if distributed.is_main():
        with adapter_folded(learner.model, cfg.sepo.fold_adapter_for_reads):
            result, table = evaluate_checkpoint(cfg, game, learner.model, learner.tokenizer, step, final)
        tracker.log({f"eval/{k}": v for k, v in result["metrics"].items()}, step=step)
        answered = learner.best_response.answer_checkpoint_read(cfg, sepo_settings(cfg), table, step)
        if answered:
            tracker.log({f"sepo/{k}": v for k, v in answered.items()}, step=step)
        save_checkpoint(out, learner, step, batch_index)
    table = distributed.all_gather(table)[0]
    if not distributed.is_main():
        learner.best_response.answer_checkpoint_read(cfg, sepo_settings(cfg), table, step)
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
    if s.debug_kill_after_step is not None and step == s.debug_kill_after_step:
        os.kill(os.getpid(), signal.SIGKILL)


def run_sepo(cfg: DictConfig, tracker: NullTracker = NO_TRACKING) -> dict[str, Any]:
    s = sepo_settings(cfg)
    out = Path(cfg.paths.output_dir)
    torch.manual_seed(s.seed)
    game = make_game(cfg.game)
    learner = build_learner(cfg, s)
    step, batch_index = resume_point(cfg, out, learner)
    answered = learner.best_response.answer_sft_read(cfg, s, game, step)
    if answered:
        tracker.log({f"sepo/{k}": v for k, v in answered.items()}, step=step)
    checkpoints = {*s.checkpoint_steps, s.steps}

    while step < s.steps:
        started = time.time()
        with diverged_if_unplayable(step):
            # the exploiter answers the policy as it is now
            refresh_best_response(learner, game, step, tracker, s.fold_adapter_for_reads)
            batch = learner.builder.collect(game, RecordingPolicy(learner.policy), batch_index, learner.estimator)
        batch_index += 1
        # each phase peaks on its own, not on the pages the one before freed: glibc's trim only, since a garbage
        # collection here scans every live object of the process (0.2-0.3 s a call) and found no tensor in cycles
        trim_heap()
        ref = reference_logprobs(learner.model, learner.policy, batch, s, learner.ref_model)
        tokens = generated_tokens(batch)
        drop_packed_weights(learner.model)  # the update takes gradients: its peak stays without the blocked copies
        for reuse in range(s.refresh_steps):
            trim_heap()
            stats = update(learner.model, learner.policy, learner.optimizer, batch, ref, s, step, learner.held)
            trim_heap()
            step += 1
            done_with_batch = batch_spent(s, reuse, step, checkpoints)
            if not done_with_batch:  # or has the policy moved more than refresh_kl from the batch's sampler?
                stats["kl_old_after"] = old_policy_divergence(learner.model, learner.policy, batch, s)
                done_with_batch = stats["kl_old_after"] > s.refresh_kl
            log_step(tracker, step, reuse, batch, stats, tokens, time.time() - started)
            started = time.time()
            if step in checkpoints:
                checkpoint(cfg, out, game, learner, step, batch_index, step == s.steps, tracker)
            crash_if_asked(s, step)
            if done_with_batch:
                break

    if not distributed.is_main():
        return {}
    learner.model.save_pretrained(out / "adapter")
    summary = json.loads((out / "eval" / f"step_{s.steps}" / "results.json").read_text())
    tracker.summary({f"final/{k}": v for k, v in summary["metrics"].items()})
    return summary
