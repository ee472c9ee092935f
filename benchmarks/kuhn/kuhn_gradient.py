"""Does SEPO's batch estimate follow the gradient of J on Kuhn poker, best responder included, and how
noisy is one batch? (docs/spec.md §4.4's gradient check, for Kuhn's pools.)

A table agent (P(BET or CALL) = sigmoid(theta_i) at each of the 12 information sets, the same in
every hand) plays through the training batch code (`BatchBuilder`: pooled groups with shared deals,
credit, leave-one-out baseline, weights, lagged exploit switch), against Kuhn's pools, with the
best responder answering the agent's table. Its mean update over many batches is compared with the
exact gradient of J (expected values and the best response from `sepo.games.kuhn.exact`, central
differences in theta, the best response held at the point's, as training holds it between two reads;
where it is unique that is also the gradient with the response re-solved), and with the exact
gradient of the exploitability. Then the noise: how many batches must be averaged before the update's direction
agrees with the exact gradient (cosine 0.9), for each credit and group size asked.

    python -m benchmarks.kuhn.kuhn_gradient --results <sft eval>/results.json   # at the SFT model's played table
    python -m benchmarks.kuhn.kuhn_gradient --results R --batches 2000 --variants return_to_go:4 round:4 return_to_go:8
    python -m benchmarks.kuhn.kuhn_gradient --results R game.pools.exploit=[NashApx,AlwaysBet] --batches 300  # paper pool
    python -m benchmarks.kuhn.kuhn_gradient --results R --variants return_to_go:4 --ascent --optimum 30  # where J points

(Hydra overrides go before the options.)

The last line is a JSON object {"point", "exact": {"grad_J", "grad_exploitability"}, "variants":
{name: {"estimate", "se", "cosine", "relative_error", "batches_for_cosine_0.9"}}, ["ascent"], ["optimum"]}.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository


class TableAgent:
    """A Kuhn policy given by one logit per information set; records d log pi / d theta per decision."""

    name = "table"

    def __init__(self, theta: np.ndarray):
        self.theta = np.asarray(theta, dtype=float)

    def table(self):
        from sepo.games.kuhn.exact import INFOSETS

        q = 1.0 / (1.0 + np.exp(-self.theta))
        return {k: np.array([1.0 - p, p]) for k, p in zip(INFOSETS, q)}

    def act_batch(self, requests):
        from benchmarks.estimator.finite_differences import ScoredDecision
        from sepo.games.kuhn.exact import INFOSETS
        from sepo.games.kuhn.rules import ACTION_INDEX, node_of

        out = []
        for request in requests:
            obs = request.observation
            i = INFOSETS.index(f"{'JQK'.index(obs['card'])}{node_of(obs['betting'])}")
            p = 1.0 / (1.0 + math.exp(-self.theta[i]))
            aggressive = request.rng.random() < p
            action = next(a for a in request.legal if ACTION_INDEX[a] == int(aggressive))
            score = np.zeros(len(self.theta))
            score[i] = (1.0 - p) if aggressive else -p
            out.append(ScoredDecision(action, score=score))
        return out


def played(results: Path) -> np.ndarray:
    """A Kuhn results.json's played table: P(BET or CALL) at each information set, in `sepo.games.kuhn.exact.INFOSETS` order."""
    from sepo.games.kuhn.exact import INFOSETS

    table = json.loads(Path(results).read_text())["played_table"]["bet_or_call"]
    return np.array([table[k] for k in INFOSETS])


def played_point(results: Path) -> tuple[np.ndarray, np.ndarray]:
    """The played table as a starting point: its probabilities clipped to [0.01, 0.99], so that the logits
    stay finite, and those logits."""
    q = np.clip(played(results), 0.01, 0.99)
    return q, np.log(q / (1 - q))


def exact_objective(table, cfg, response=None) -> tuple[float, float]:
    """J of docs/spec.md §4.1 for a history-independent table, and its exploitability, from expected values.

    `response`: the best responder's table held fixed (as training holds it between two reads of the
    policy); None solves it for `table`. Where the best response is unique the two have the same
    gradient (Danskin); where it is not, the exploitability has a kink and only the fixed one is
    what the estimator follows.
    """
    from sepo.games import make_game
    from sepo.games.kuhn import exact as K
    from sepo.games.strategy import make_strategy
    from sepo.policies import ScriptedPolicy
    from sepo.policies.played_table import policy_table

    game = make_game(cfg.game)

    def opponent(name):
        if name == "BestResponse":
            return response if response is not None else K.best_response_table(table)
        return policy_table(game, ScriptedPolicy(make_strategy(cfg.game, name)))

    s = float(cfg.sepo.reward_scale) / float(cfg.game.max_payoff)
    lam = cfg.lambdas.train
    u = np.mean([K.seat_values(table, opponent(n))["mean"] for n in cfg.game.pools.train])
    advs = [max(0.0, -2.0 * K.seat_values(table, opponent(n))["mean"]) for n in cfg.game.pools.exploit]
    e = float(np.mean(advs)) if advs else 0.0
    return s * u - float(lam.e) * s * e, K.exploitability(table)


def exact_gradients(theta: np.ndarray, cfg, h: float = 1e-4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Central differences in theta: of J with the point's best response held fixed, of J with it
    re-solved at every point, and of the exploitability."""
    from sepo.games.kuhn.exact import best_response_table

    response = best_response_table(TableAgent(theta).table())
    g_fixed, g_solved, g_x = (np.zeros(len(theta)) for _ in range(3))
    for i in range(len(theta)):
        up, down = theta.copy(), theta.copy()
        up[i] += h
        down[i] -= h
        hi, lo = TableAgent(up).table(), TableAgent(down).table()
        g_fixed[i] = (exact_objective(hi, cfg, response)[0] - exact_objective(lo, cfg, response)[0]) / (2 * h)
        (j1, x1), (j0, x0) = exact_objective(hi, cfg), exact_objective(lo, cfg)
        g_solved[i], g_x[i] = (j1 - j0) / (2 * h), (x1 - x0) / (2 * h)
    return g_fixed, g_solved, g_x


def table_of(q: np.ndarray):
    from sepo.games.kuhn.exact import INFOSETS

    return {k: np.array([1.0 - x, x]) for k, x in zip(INFOSETS, q)}


def exact_ascent(q0: np.ndarray, cfg, step: float = 0.01, length: float = 1.0) -> list[float]:
    """Follow the exact gradient of J in table coordinates (steps of `step`, clipped to [0, 1], the
    best response re-solved at every point); the exploitability after every 0.25 of path length."""
    q, out = q0.copy(), []
    for i in range(int(round(length / step))):
        g = np.zeros(len(q))
        for j in range(len(q)):
            up, down = q.copy(), q.copy()
            up[j], down[j] = min(1.0, q[j] + 1e-5), max(0.0, q[j] - 1e-5)
            g[j] = (exact_objective(table_of(up), cfg)[0] - exact_objective(table_of(down), cfg)[0]) / (up[j] - down[j])
        q = np.clip(q + step * g / (np.linalg.norm(g) + 1e-12), 0.0, 1.0)
        if (i + 1) % int(round(0.25 / step)) == 0:
            out.append(round(float(exact_objective(table_of(q), cfg)[1]), 4))
    return out


def exact_optimum(cfg, restarts: int, iterations: int = 3000, seed: int = 0) -> dict:
    """The table that maximises J (random-direction hill climbing from `restarts` uniform starts;
    J is piecewise smooth in the table), with its J and exploitability."""
    rng = np.random.default_rng(seed)
    best = None
    for _ in range(restarts):
        q, width = rng.random(12), 0.05
        value = exact_objective(table_of(q), cfg)[0]
        for it in range(iterations):
            candidate = np.clip(q + rng.normal(size=12) * width, 0.0, 1.0)
            v = exact_objective(table_of(candidate), cfg)[0]
            if v > value:
                q, value = candidate, v
            if it % 500 == 499:
                width /= 2
        if best is None or value > best[1]:
            best = (q, value)
    q, value = best
    return {
        "J": round(float(value), 4),
        "exploitability": round(float(exact_objective(table_of(q), cfg)[1]), 4),
        "table": np.round(q, 3).tolist(),
    }


def batch_updates(theta: np.ndarray, cfg, batches: int, burn_in: int) -> np.ndarray:
    """[batches, 12]: each batch's unscaled update (sum over decisions of A * d log pi / d theta)."""
    from sepo.games import make_game
    from sepo.training.objective import EstimatorState, sepo_settings
    from sepo.training.rollouts import BatchBuilder

    s = sepo_settings(cfg)
    game, builder, agent = make_game(cfg.game), BatchBuilder(cfg, s), TableAgent(theta)
    for strategy in builder.strategies.values():
        if getattr(strategy, "responds_to_agent", False):
            strategy.respond_to(agent.table())
    state = EstimatorState(scale_decay=float(s.adv_scale_decay), switch_episodes=int(s.exploit_switch_episodes))
    out = []
    for b in range(burn_in + batches):
        batch = builder.collect(game, agent, b, state)
        if b >= burn_in:
            out.append(batch.unscaled["total"] @ np.stack([d.score for d in batch.decisions]))
    return np.stack(out)


def main() -> None:
    args = parse_args()
    from sepo.run.compose import compose_config

    q, theta = played_point(args.results)

    def config(credit: str, n: int):
        return compose_config(
            [
                "game=kuhn",
                "model=scripted",
                "logger=none",
                f"sepo.credit={credit}",
                f"sepo.rollouts_per_opponent={n}",
                *args.overrides,
            ]
        )

    out, g_j = exact_at_point(theta, q, config("return_to_go", 4))
    out["batches"], out["variants"] = args.batches, {}
    for variant in args.variants:
        credit, n = variant.split(":")
        row = out["variants"][variant] = estimate_row(theta, config(credit, int(n)), g_j, args)
        print(
            f"{variant:16} cosine {row['cosine']:+.3f}  relative error {row['relative_error']:.3f}  "
            f"max |z| {row['max_abs_z']:.2f}  batches for cosine 0.9: {row['batches_for_cosine_0.9']:.0f}"
        )
    objectives = {
        "best_responder": [],
        "paper_pool": ["game.pools.exploit=[NashApx,AlwaysBet]"],
        "payoff_only": ["lambdas=zero"],
    }
    for name, extra in objectives.items():
        cfg = compose_config(["game=kuhn", "model=scripted", "logger=none", *args.overrides, *extra])
        if args.ascent:
            out.setdefault("ascent", {})[name] = exact_ascent(q, cfg)
            print(f"exact ascent of J ({name}): exploitability every 0.25 of path {out['ascent'][name]}")
        if args.optimum and name != "payoff_only":
            out.setdefault("optimum", {})[name] = exact_optimum(cfg, args.optimum)
            print(f"argmax J ({name}): {out['optimum'][name]}")
    print(json.dumps(out))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, help="a Kuhn results.json with played_table (the point)")
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--burn-in", type=int, default=20, help="batches that fill the lagged exploit switch first")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["return_to_go:4", "round:4", "return_to_go:8"],
        help="credit:n pairs (sepo.credit, sepo.rollouts_per_opponent)",
    )
    parser.add_argument(
        "--ascent",
        action="store_true",
        help="also follow the exact gradient of J from the point: with the best responder, with the "
        "paper's exploit pool and payoff-only (exploitability every 0.25 of path length)",
    )
    parser.add_argument(
        "--optimum",
        type=int,
        default=0,
        metavar="RESTARTS",
        help="also find the table maximising J from this many random starts (minutes)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="extra Hydra overrides (e.g. game.pools.exploit=[NashApx,AlwaysBet])"
    )
    return parser.parse_args()


def exact_at_point(theta: np.ndarray, q: np.ndarray, cfg: Any) -> tuple[dict, np.ndarray]:
    """The point's J, exploitability and exact gradients (the output's head), and the exact grad J."""
    from sepo.games.kuhn.exact import INFOSETS

    g_j, g_solved, g_x = exact_gradients(theta, cfg)
    j, x = exact_objective(TableAgent(theta).table(), cfg)
    out = {
        "point": dict(zip(INFOSETS, np.round(q, 4).tolist())),
        "J": round(j, 4),
        "exploitability": round(x, 4),
        "exact": {
            "grad_J": np.round(g_j, 4).tolist(),
            "grad_exploitability": np.round(g_x, 4).tolist(),
            "best_response_unique": bool(np.allclose(g_j, g_solved, atol=1e-6)),
            "cosine_grad_J_with_minus_grad_exploitability": round(
                float(-g_j @ g_x / np.linalg.norm(g_j) / np.linalg.norm(g_x)), 3
            ),
        },
    }
    print(f"point: J {j:+.4f}, exploitability {x:.4f}; exact grad J {np.round(g_j, 3)}")
    return out, g_j


def estimate_row(theta: np.ndarray, cfg: Any, g_j: np.ndarray, args: argparse.Namespace) -> dict:
    """One estimator variant's mean update over `--batches` batches against the exact gradient."""
    v = batch_updates(theta, cfg, args.batches, args.burn_in)
    mean, se = v.mean(axis=0), v.std(axis=0, ddof=1) / math.sqrt(len(v))
    noise = float(np.trace(np.cov(v.T)))  # E||v_b - mean||^2
    # the mean of B batches has cosine ~ |g| / sqrt(|g|^2 + noise / B) with the exact gradient g
    needed = noise / (float(g_j @ g_j) * (1 / 0.81 - 1))
    row = {
        "estimate": np.round(mean, 4).tolist(),
        "se": np.round(se, 4).tolist(),
        "cosine": round(float(mean @ g_j / np.linalg.norm(mean) / np.linalg.norm(g_j)), 3),
        "relative_error": round(float(np.linalg.norm(mean - g_j) / np.linalg.norm(g_j)), 3),
        "max_abs_z": round(float(np.max(np.abs(mean - g_j) / np.maximum(se, 1e-12))), 2),
        "batches_for_cosine_0.9": round(needed, 1),
    }
    return row


if __name__ == "__main__":
    main()
