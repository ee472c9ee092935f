"""Seconds per SEPO step, by section, `python -m benchmarks step`.

`step` times SEPO steps of the tiny model (an SFT'd one with `--model-path <sft run>/merged`, else
the untrained build) exactly as `run_sepo` takes them (fresh rollouts, reference pass, update), after
one warm-up step, and splits each step's wall time into sections (`sepo.profiling`): prompt
processing and decoding inside generate, sampling (which records the behaviour log-probs), stopping
checks, fallback, rendering, reference log-probs, the update's forward pass, backward, optimizer, and
`other` (arena, games, advantages), plus `unaccounted` (wall time no section claimed), so the lines
partition the step. Kuhn's best-response read (`best_response_read`) runs on the steps `run_sepo`
runs it (the warm-up step always). Each section also reports the process's peak resident memory
while it ran (`peak_rss_gib`, Linux), over the warm-up and the timed steps, and `peak_rss_gib_max`
is the highest: the figure a memory target is checked against. Speed against this machine's limit:
the rate it multiplies matrices at in the model's dtype (`matmul_gflops`, measured in the same run
on the same threads) beside the rate each section of the model's passes reached (`gflops`: the
decoder layers' matmul work per token position carried, plus the output head's for decoded tokens;
attention scores left out, so it is a lower bound), and its share of the limit. Extra arguments are Hydra overrides (e.g. the side-by-side
setting `sepo.penalty_mode=per_rollout sepo.rollouts_per_opponent=2 sepo.refresh_steps=1`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from sepo.run.compose import compose_config as compose

HELP = "seconds and peak resident memory per SEPO step, with a breakdown by section"

GIB = 1024**3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", default=None, help="a merged model dir (e.g. <sft run>/merged); default: the build")
    p.add_argument("--model", default="tiny", help="model config group option")
    p.add_argument("--game", default="ipd")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sepo.rollouts_per_opponent=2")


def run(args: argparse.Namespace) -> dict:
    import torch

    from sepo.builders import load_model_and_tokenizer
    from sepo.games import make_game
    from sepo.models import attach_lora
    from sepo.policies.recording import RecordingPolicy
    from sepo.profiling import matmul_gflops, section, time_model_forwards
    from sepo.stages.sepo_loop import best_response_schedule, training_parts, update
    from sepo.training.objective import sepo_settings
    from sepo.training.passes import generated_tokens, reference_logprobs

    overrides = [f"model={args.model}", f"game={args.game}", "logger=none", *args.overrides]
    if args.model_path:
        overrides.append(f"model.path='{Path(args.model_path).resolve()}'")
    cfg = compose(overrides)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = sepo_settings(cfg)
    torch.manual_seed(int(s.seed))
    game = make_game(cfg.game)
    base, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    model = attach_lora(base, cfg.model.lora.target_modules, int(s.lora.r), int(s.lora.alpha), float(s.lora.dropout))
    policy, optimizer, estimator, builder = training_parts(cfg, s, model, tokenizer)
    best_response = best_response_schedule(builder, s)
    hooks = time_model_forwards(model)

    def one_step(index: int) -> tuple[int, int]:
        """Fresh rollouts and `refresh_steps` updates on them, as run_sepo takes them (no KL check)."""
        with section("other"):
            if best_response.due(index):
                best_response.refresh(game, policy, index)
            batch = builder.collect(game, RecordingPolicy(policy), index, estimator)
            ref = reference_logprobs(model, policy, batch, s)
            for _ in range(int(s.refresh_steps)):
                update(model, policy, optimizer, batch, ref, s, step=index)
        return len(batch.decisions), generated_tokens(batch)

    seconds, decisions, tokens, sections, peaks = timed_steps(one_step, args.steps)
    for h in hooks:
        h.remove()
    per_step = seconds / args.steps
    work = section_gflop(model, sections.tokens, args.steps)
    limit = matmul_gflops(
        next(p.dtype for p in model.parameters() if p.dtype.is_floating_point and not p.requires_grad)
    )
    # time no section claimed (the loop, the profiler's boundaries) is a line too: the breakdown sums to the step
    claimed = dict(sections.seconds)
    claimed["unaccounted"] = seconds - sum(claimed.values())
    breakdown = {k: round(v / args.steps, 3) for k, v in sorted(claimed.items(), key=lambda kv: -kv[1])}
    peak_gib = {k: round(v / GIB, 3) for k, v in sorted(peaks.items(), key=lambda kv: -kv[1])}
    rates = {k: round(work[k] / breakdown[k], 3) for k in work if breakdown.get(k)}
    print_table(breakdown, per_step, peak_gib, rates, limit)
    print(
        f"{'total':<22}{per_step:>9.3f}   ({decisions / args.steps:.0f} decisions, "
        f"{tokens / args.steps:.0f} generated tokens per step, {decisions / seconds:.2f} decisions/s; "
        f"{torch.get_num_threads()} threads; matmul limit {limit:.1f} GFLOP/s)",
        file=sys.stderr,
    )
    return {
        "seconds_per_step": round(per_step, 3),
        "breakdown": breakdown,
        "peak_rss_gib": peak_gib,
        "peak_rss_gib_max": max(peak_gib.values(), default=None),
        "decisions": decisions // args.steps,
        "decisions_per_s": round(decisions / seconds, 3),
        "matmul_gflops": round(limit, 1),
        "gflop_per_step": work,
        "gflops": rates,
        "share_of_matmul": {k: round(v / limit, 4) for k, v in rates.items()},
        "tokens": tokens // args.steps,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "overrides": overrides,
    }


def print_table(breakdown: dict, per_step: float, peak_gib: dict, rates: dict, limit: float) -> None:
    """Seconds per step by section, their share, peak resident memory and matmul rate (stderr)."""
    print(f"{'section':<22}{'s/step':>9}{'share':>8}{'peak RSS GiB':>14}{'GFLOP/s':>9}{'of limit':>9}", file=sys.stderr)
    for k, v in breakdown.items():
        rate = f"{rates[k]:>9.1f}{rates[k] / limit:>9.1%}" if k in rates else ""
        print(f"{k:<22}{v:>9.3f}{v / per_step:>8.1%}{peak_gib.get(k, float('nan')):>14.2f}{rate}", file=sys.stderr)


def timed_steps(one_step: Any, steps: int) -> tuple[float, int, int, Any, dict[str, int]]:
    """One warm-up step (first-call allocations and lazy imports are not a step's time), then `steps`
    timed ones: their seconds, decisions and generated tokens, the section profile, and each section's
    peak resident memory over both."""
    from sepo.profiling import profiled

    with profiled(memory=True) as warm_up:  # first-call allocations and lazy imports are not a step's time
        one_step(0)
        peaks = dict(warm_up.peak_rss)
    decisions = tokens = 0
    with profiled(memory=True) as sections:
        started = time.perf_counter()
        for index in range(1, steps + 1):
            d, t = one_step(index)
            decisions, tokens = decisions + d, tokens + t
        seconds = time.perf_counter() - started
        for name, peak in sections.peak_rss.items():
            peaks[name] = max(peaks.get(name, 0), peak)
    return seconds, decisions, tokens, sections, peaks


def section_gflop(model, tokens: dict[str, int], steps: int) -> dict[str, float]:
    """GFLOP per step of each section's model passes: 2 x decoder matmul weights per token position, the
    output head's too for decoded tokens (the other passes score only some positions), and the backward
    pass as `backward_passes` of its forward's work."""
    from sepo.profiling import backward_passes, matmul_parameters

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = matmul_parameters(base)
    flop = {k: 2.0 * body * n for k, n in tokens.items()}
    if "decoding" in flop:
        flop["decoding"] += 2.0 * head * tokens["decoding"]
    if "update_forward" in flop:
        trainable = sum(p.numel() for p in base.parameters() if p.requires_grad)
        full = trainable > body / 2  # a full fine-tune, not an adapter (LoRA's A and B are Linear layers too)
        flop["backward"] = flop["update_forward"] * backward_passes(full)
    return {k: round(v / steps / 1e9, 4) for k, v in flop.items()}
