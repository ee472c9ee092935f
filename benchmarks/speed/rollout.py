"""Rollout throughput, `python -m benchmarks rollout`.

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
"""

from __future__ import annotations

import argparse
import time

from sepo.run.compose import compose_config as compose

HELP = "batched lockstep vs one-episode-at-a-time rollout throughput"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--episodes", type=int, default=80, help="total episodes, split over the train pool")
    p.add_argument("--game", default="ipd")
    p.add_argument("--model", default="tiny", help="model config group option")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: eval.max_new_tokens")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (0: torch's default); 1 measures batching, not intra-op parallelism, "
        "and stays stable on a busy machine",
    )


def run(args: argparse.Namespace) -> dict:
    import torch

    from sepo.arena import Match, play_matches
    from sepo.builders import load_model_and_tokenizer
    from sepo.games import make_game
    from sepo.games.strategy import make_strategy
    from sepo.policies.lm import LMPolicy

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
    return {
        "batched_per_s": round(batched_rate, 3),
        "sequential_per_s": round(sequential_rate, 3),
        "ratio": round(batched_rate / sequential_rate, 3),
        "episodes": per_opponent * len(pool),
        "same_episodes": same,
        "decisions": batched_decisions,
        "max_new_tokens": max_new,
        "game": game.name,
        "batched_s": round(batched_s, 2),
        "sequential_s": round(sequential_s, 2),
    }
