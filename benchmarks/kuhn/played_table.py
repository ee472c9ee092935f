"""Is Kuhn poker's table the policy that plays? Action-first scoring vs the played estimate vs play.

At each of the 12 information sets (hand 1), three readings of P(BET or CALL) for one checkpoint:
  action_first   the old reading: the action as the first thing the model says (not what it plays)
  played         `LMPolicy.action_probabilities`: K sampled answers, Rao-Blackwellised, +- SE
  frequency      the share of N decisions sampled with `act_batch` (how the arena plays), +- binomial SE
and the exact exploitability of each table, with the estimate's SE and its cost in seconds.

    python -m benchmarks.kuhn.played_table --model-path <sft run>/merged
    python -m benchmarks.kuhn.played_table --model-path <run>/merged --samples 128 --decisions 400 --threads 2

The last line is a JSON object {"model_path", "samples", "decisions", "states": {key: {...}},
"exploit_exact": {...}, "z_max", "seconds": {...}}.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository


def main() -> None:
    args = parse_args()
    import torch
    from omegaconf import OmegaConf

    from sepo.builders import load_model_and_tokenizer
    from sepo.games import make_game
    from sepo.games.kuhn.exact import exploitability
    from sepo.policies.lm import LMPolicy
    from sepo.policies.played_table import infoset_requests, table_from_probs

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = OmegaConf.load(ROOT / "conf" / "model" / "tiny.yaml")
    cfg.path = args.model_path
    model, tokenizer = load_model_and_tokenizer(cfg, ROOT / ".cache")
    game = make_game(OmegaConf.load(ROOT / "conf" / "game" / "kuhn.yaml"))
    policy = LMPolicy(model, tokenizer, cfg, args.temperature, 48, seed=0, action_samples=args.samples)
    keyed = infoset_requests(game)
    requests = [r for _, r in keyed]

    first, played, decisions, seconds = three_estimates(policy, game, requests, args.decisions)
    states, z_max, frequency_probs = compare(keyed, first, played, decisions, args.decisions)
    out = {
        "model_path": args.model_path,
        "samples": args.samples,
        "decisions": args.decisions,
        "rao_blackwellised": round(played.rao_blackwellised, 4),
        "states": states,
        "exploit_exact": {
            "action_first": round(exploitability(table_from_probs({k: p for (k, _), p in zip(keyed, first)})), 4),
            "played": round(played.exploitability, 4),
            "played_se": round(played.exploitability_se, 4),
            "frequency": round(exploitability(table_from_probs(frequency_probs)), 4),
        },
        "z_max": round(z_max, 2),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    print(f"{'state':6} {'action':6} {'first':>7} {'played':>15} {'frequency':>15} {'z':>5}")
    for key, row in states.items():
        print(
            f"{key:6} {row['action']:6} {row['action_first']:7.3f} {row['played']:7.3f} ± {row['played_se']:.3f} "
            f"{row['frequency']:7.3f} ± {row['frequency_se']:.3f} {row['z']:5.2f}"
        )
    print(json.dumps(out))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="a merged checkpoint of tiny trained on Kuhn poker")
    parser.add_argument("--samples", type=int, default=128, help="K of the played estimate")
    parser.add_argument("--decisions", type=int, default=400, help="decisions sampled per state for the frequency")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args()


def three_estimates(policy: Any, game: Any, requests: list, per_state: int) -> tuple:
    """The action-first probabilities, the played table, and `per_state` decisions played per state, with
    the seconds each took."""
    from sepo.policies.played_table import played_table

    started = time.time()
    first = policy.action_first_probabilities(requests)
    seconds = {"action_first": time.time() - started}
    started = time.time()
    played = played_table(game, policy, seed=42)
    seconds["played"] = time.time() - started
    started = time.time()
    copies = [
        replace(r, rng=np.random.default_rng([7, i, k])) for i, r in enumerate(requests) for k in range(per_state)
    ]
    _, decisions = policy.answer(copies)
    seconds["frequency"] = time.time() - started
    return first, played, decisions, seconds


def compare(keyed: list, first: list, played: Any, decisions: list, per_state: int) -> tuple[dict, float, dict]:
    """Per state: the three estimates of the aggressive action's probability and the z of played against
    the frequency; the largest z; the frequency table."""
    from sepo.games.kuhn.rules import ACTION_INDEX

    states, z_max = {}, 0.0
    frequency_probs = {}
    for i, (key, request) in enumerate(keyed):
        aggressive = next(a for a in request.legal if ACTION_INDEX[a] == 1)
        acts = [d.action for d in decisions[i * per_state : (i + 1) * per_state]]
        f = sum(a == aggressive for a in acts) / len(acts)
        f_se = math.sqrt(f * (1 - f) / len(acts))
        q, q_se = float(played.table[key][1]), played.se[key]
        z = abs(q - f) / math.sqrt(q_se**2 + f_se**2) if q_se or f_se else 0.0
        z_max = max(z_max, z)
        frequency_probs[key] = {aggressive: f, next(a for a in request.legal if a != aggressive): 1 - f}
        states[key] = {
            "action": aggressive,
            "action_first": round(first[i][aggressive], 4),
            "played": round(q, 4),
            "played_se": round(q_se, 4),
            "frequency": round(f, 4),
            "frequency_se": round(f_se, 4),
            "z": round(z, 2),
        }
    return states, z_max, frequency_probs


if __name__ == "__main__":
    main()
