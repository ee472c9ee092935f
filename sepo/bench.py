"""Benchmarks of the language-model agent (docs/spec.md §6 and section 4, item 6).

    python -m sepo.bench rollout [--episodes 80] [--game ipd] [--max-new-tokens N]
    python -m sepo.bench logprob [--vocab 262144 --positions 512 --hidden 256 --chunk 32]
    python -m sepo.bench gradcheck [--batches 2000]
    python -m sepo.bench step [--model-path DIR] [--steps 3] [overrides ...]
    python -m sepo.bench gpu [--model gemma4|qwen|both]

`rollout` builds the tiny model and plays the same episodes against the game's train pool twice:
all in lockstep (`sepo.arena.play_matches`, one batched generate per decision point) and one
episode at a time (a `play_matches` call per match, same seeds). It reports decisions per second
of each, and whether both passes played the same games (`same_episodes`: each episode samples from
its own stream, so they should, up to float rounding under padding). The untrained tiny model almost never writes a legal action line, so nearly every answer
runs to `max_new_tokens` (default: `eval.max_new_tokens`, 256, which makes the sequential pass take
minutes; `--max-new-tokens 64` is a quick run) and then takes the fallback: both variants do the
same work per decision. The ratio grows with `max_new_tokens`, since batching amortises the
per-step cost of decoding while prompt processing costs the same either way. Torch runs on one
thread by default (`--threads`): the benchmark measures batching, not intra-op parallelism, and
stays stable on a busy machine.

`logprob` measures the peak memory of per-token log-probs over a large vocabulary, chunked
(`sepo.training.logprobs.chunked_logprobs_from_hidden`) against the unchunked reference. Torch's CPU
allocations are invisible to tracemalloc, so each variant runs in a fresh subprocess that
allocates its inputs, warms the kernels up on a sliver, resets the kernel's peak-RSS mark, computes,
and reports the growth of its peak resident set size (VmHWM) over the resident set size before the
computation. The workers run with glibc's mmap threshold at 1 MiB so that freed blocks are returned
at once and RSS follows the live tensors.

`gradcheck` runs docs/spec.md §4.4's gradient check (`sepo.training.gradcheck`): a parametric scripted IPD agent
through the training batch code, the mean estimated update of each term against finite differences
of the exact J, for the default estimator and the paper's variants.

`step` times SEPO steps of the tiny model (an SFT'd one with `--model-path <sft run>/merged`, else
the untrained build) exactly as `run_sepo` takes them (fresh rollouts, reference pass, update), after
one warm-up step, and splits each step's wall time into sections (`sepo.profiling`): prompt
processing and decoding inside generate, sampling (which records the behaviour log-probs), stopping
checks, fallback, rendering, reference log-probs, the update's forward pass, backward, optimizer, and
`other` (arena, games, advantages), plus `unaccounted` (wall time no section claimed), so the lines
partition the step. Extra arguments are Hydra overrides (e.g. the side-by-side
setting `sepo.penalty_mode=per_rollout sepo.rollouts_per_opponent=2 sepo.refresh_steps=1`).

`gpu` (`sepo.gpu_bench`) measures the full-size Gemma 4 and Qwen 3.5 architectures with random
weights on a CUDA device; it exits with a message where there is none.

Each command prints a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sepo.paths import CONF_DIR


# --------------------------------------------------------------------- rollout throughput
def compose(overrides: list[str]):
    """The project's Hydra config with `overrides`, outside of a Hydra run."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def rollout(args: argparse.Namespace) -> dict:
    import torch

    from sepo.arena import Match, play_matches
    from sepo.games import make_game
    from sepo.models import load_model_and_tokenizer
    from sepo.policies.lm import LMPolicy
    from sepo.strategies import make_strategy

    cfg = compose([f"model={args.model}", f"game={args.game}", "logger=none"])
    if args.threads:
        torch.set_num_threads(args.threads)
    max_new = args.max_new_tokens or int(cfg.eval.max_new_tokens)
    model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.paths.cache_dir)
    game = make_game(cfg.game)
    pool = list(cfg.game.pools.train)
    per_opponent = max(1, args.episodes // len(pool))
    matches = [Match(name, make_strategy(cfg.game, name), k) for name in pool for k in range(per_opponent)]
    mirrored = bool(cfg.game.get("mirrored", False))

    def policy() -> LMPolicy:
        return LMPolicy(model, tokenizer, cfg.model, args.temperature, max_new, cfg.generation_seed)

    # Warm-up (first-call allocations, lazy imports) so neither variant pays for it.
    play_matches(game, policy(), matches[:1], cfg.seed, mirrored)

    start = time.perf_counter()
    records = play_matches(game, policy(), matches, cfg.seed, mirrored)
    batched_s = time.perf_counter() - start
    batched_decisions = sum(r.decisions for r in records)

    # The same episodes (same seeds and opponent streams), one play call each.
    agent = policy()
    start = time.perf_counter()
    sequential = [r for m in matches for r in play_matches(game, agent, [m], cfg.seed, mirrored)]
    sequential_s = time.perf_counter() - start
    sequential_decisions = sum(r.decisions for r in sequential)
    # each episode samples from its own stream, so both passes should play the very same games
    same = [[x.actions for x in r.rounds] for r in records] == [[x.actions for x in r.rounds] for r in sequential]

    batched_rate, sequential_rate = batched_decisions / batched_s, sequential_decisions / sequential_s
    return {"batched_per_s": round(batched_rate, 3), "sequential_per_s": round(sequential_rate, 3),
            "ratio": round(batched_rate / sequential_rate, 3), "episodes": per_opponent * len(pool),
            "same_episodes": same,
            "decisions": batched_decisions, "max_new_tokens": max_new, "game": game.name,
            "batched_s": round(batched_s, 2), "sequential_s": round(sequential_s, 2)}


# --------------------------------------------------------------------- log-prob memory
def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS: now, VmHWM: peak) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0) so earlier peaks (imports) do not hide ours."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def logprob_worker(args: argparse.Namespace) -> dict:
    """One variant in this (fresh) process: peak memory growth of the computation in MiB."""
    import torch

    from sepo.training.logprobs import chunked_logprobs_from_hidden, logprobs_from_hidden_reference

    def compute(hidden, weight, targets):
        with torch.no_grad():
            if args.variant == "chunked":
                return chunked_logprobs_from_hidden(hidden, weight, targets, chunk=args.chunk)
            return logprobs_from_hidden_reference(hidden, weight, targets)

    torch.manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden).mul_(0.02)
    hidden = torch.randn(1, args.positions, args.hidden)
    targets = torch.randint(args.vocab, (1, args.positions))
    # warm-up on a sliver: the first call pages in kernels and thread pools, which is not our memory
    compute(hidden[:, :2], weight[:64], targets[:, :2] % 64)
    # without a reset, the baseline is the peak so far: growth below it would read as 0
    baseline = _status_mb("VmRSS") if _reset_peak() else _status_mb("VmHWM")
    lp = compute(hidden, weight, targets)
    return {"variant": args.variant, "peak_mb": max(0.0, _status_mb("VmHWM") - baseline),
            "checksum": float(lp.sum())}


def logprob(args: argparse.Namespace) -> dict:
    peaks = {}
    for variant in ("chunked", "unchunked"):
        cmd = [sys.executable, "-m", "sepo.bench", "_logprob_worker", "--variant", variant,
               "--vocab", str(args.vocab), "--positions", str(args.positions),
               "--hidden", str(args.hidden), "--chunk", str(args.chunk)]
        # Large blocks straight from mmap: a freed chunk goes back to the OS at once, so RSS follows the
        # live tensors instead of glibc's heap, which can keep growing under a stream of equal blocks.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        peaks[variant] = json.loads(out.strip().splitlines()[-1])
    if abs(peaks["chunked"]["checksum"] - peaks["unchunked"]["checksum"]) > 1e-2 * args.positions:
        raise RuntimeError(f"chunked and unchunked log-probs disagree: {peaks}")
    chunked, unchunked = peaks["chunked"]["peak_mb"], peaks["unchunked"]["peak_mb"]
    return {"chunked_peak_mb": round(chunked, 1), "unchunked_peak_mb": round(unchunked, 1),
            "ratio": round(chunked / unchunked, 4) if unchunked else None,
            "vocab": args.vocab, "positions": args.positions, "hidden": args.hidden, "chunk": args.chunk}


# --------------------------------------------------------------------- gradient check
def gradcheck(args: argparse.Namespace) -> dict:
    """docs/spec.md §4.4: the estimator's mean update against finite differences of the exact J (sepo/training/gradcheck.py)."""
    from sepo.training.gradcheck import print_table, report

    started = time.perf_counter()
    result = report(lambda overrides: compose([*overrides, "logger=none"]), args.batches, args.burn_in,
                    progress=lambda line: print(line, file=sys.stderr, flush=True))
    print_table(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


# --------------------------------------------------------------------- SEPO step profile
def step(args: argparse.Namespace) -> dict:
    import torch

    from sepo.games import make_game
    from sepo.models import attach_lora, load_model_and_tokenizer
    from sepo.profiling import profiled, section, time_model_forwards
    from sepo.training.objective import sepo_settings
    from sepo.stages.sepo_loop import (RecordingPolicy, generated_tokens, optimisation_step, reference_logprobs,
                           training_parts)

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
    hooks = time_model_forwards(model)

    def one_step(index: int) -> tuple[int, int]:
        """Fresh rollouts and `refresh_steps` updates on them, as run_sepo takes them (no KL check)."""
        with section("other"):
            batch = builder.collect(game, RecordingPolicy(policy), index, estimator)
            ref = reference_logprobs(model, policy, batch, s)
            for _ in range(int(s.refresh_steps)):
                optimisation_step(model, policy, optimizer, batch, ref, s)
        return len(batch.decisions), generated_tokens(batch)

    one_step(0)  # warm-up: first-call allocations and lazy imports are not a step's cost
    decisions = tokens = 0
    with profiled() as sections:
        started = time.perf_counter()
        for index in range(1, args.steps + 1):
            d, t = one_step(index)
            decisions, tokens = decisions + d, tokens + t
        seconds = time.perf_counter() - started
    for h in hooks:
        h.remove()
    per_step = seconds / args.steps
    # the wall time no section claimed (the loop itself, the profiler's own boundaries) is reported as
    # its own line, so the breakdown partitions the step whatever the machine's fixed costs
    claimed = dict(sections.seconds)
    claimed["unaccounted"] = seconds - sum(claimed.values())
    breakdown = {k: round(v / args.steps, 3) for k, v in sorted(claimed.items(), key=lambda kv: -kv[1])}
    print(f"{'section':<22}{'s/step':>9}{'share':>8}", file=sys.stderr)
    for k, v in breakdown.items():
        print(f"{k:<22}{v:>9.3f}{v / per_step:>8.1%}", file=sys.stderr)
    print(f"{'total':<22}{per_step:>9.3f}   ({decisions / args.steps:.0f} decisions, "
          f"{tokens / args.steps:.0f} generated tokens per step; {torch.get_num_threads()} threads)", file=sys.stderr)
    return {"seconds_per_step": round(per_step, 3), "breakdown": breakdown,
            "decisions": decisions // args.steps, "tokens": tokens // args.steps, "steps": args.steps,
            "threads": torch.get_num_threads(), "overrides": overrides}


# --------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sepo.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("rollout", help="batched lockstep vs one-episode-at-a-time rollout throughput")
    p.add_argument("--episodes", type=int, default=80, help="total episodes, split over the train pool")
    p.add_argument("--game", default="ipd")
    p.add_argument("--model", default="tiny", help="model config group option")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: eval.max_new_tokens")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (0: torch's default); 1 measures batching, not intra-op parallelism, "
                        "and stays stable on a busy machine")

    for name in ("logprob", "_logprob_worker"):
        p = sub.add_parser(name, help="peak memory of chunked vs unchunked log-probs" if name == "logprob" else None)
        p.add_argument("--vocab", type=int, default=262144)
        p.add_argument("--positions", type=int, default=512)
        p.add_argument("--hidden", type=int, default=256)
        p.add_argument("--chunk", type=int, default=32)
        if name == "_logprob_worker":
            p.add_argument("--variant", choices=("chunked", "unchunked"), required=True)

    p = sub.add_parser("gradcheck", help="docs/spec.md §4.4: the SEPO estimator's mean update vs finite differences of J")
    p.add_argument("--batches", type=int, default=2000, help="rollout batches averaged per point and variant")
    p.add_argument("--burn-in", type=int, default=20, help="batches that only fill the running statistics first")

    p = sub.add_parser("step", help="seconds per SEPO step of the tiny model, with a breakdown by section")
    p.add_argument("--model-path", default=None, help="a merged model dir (e.g. <sft run>/merged); default: the build")
    p.add_argument("--model", default="tiny", help="model config group option")
    p.add_argument("--game", default="ipd")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sepo.rollouts_per_opponent=2")

    p = sub.add_parser("gpu", help="full-size Gemma 4 / Qwen 3.5 on CUDA: decode speed vs the bandwidth floor, "
                                   "SEPO step time and memory, SFT tokens/s")
    from sepo import gpu_bench
    gpu_bench.add_arguments(p)

    args = parser.parse_args(argv)
    run = {"rollout": rollout, "logprob": logprob, "_logprob_worker": logprob_worker, "gradcheck": gradcheck,
           "step": step, "gpu": gpu_bench.run}[args.command]
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
