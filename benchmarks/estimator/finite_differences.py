"""The gradient check of docs/spec.md §4.4: does the training batch estimate grad J_SEPO?

A parametric scripted IPD agent (its action probabilities are sigmoids of its parameters; no
language model) plays through exactly the code that builds training batches
(`sepo.training.rollouts.BatchBuilder`: groups, shared chance events, term rewards, credit, baseline,
weights, the batch scale, the exploit switch). Each of its decisions records its score
d log pi(a | s) / d theta, so a batch's estimated update (the ascent direction of the loss at
importance ratio 1) is sum_d A_d * score_d, per term and in total, before and after the batch scale.

Its mean over many batches is compared with the central finite-difference gradient of J, computed
exactly by dynamic programming over the IPD's Markov state (round, both last actions, whether the
agent ever defected). `opponent_cooperation` is a second implementation of the IPD strategies,
independent of `sepo.strategies` (a test checks the two agree by simulation), so the check also
covers the game and the pools.

    python -m benchmarks gradcheck [--batches 2000]

prints the table; its last line is a JSON object {"modes": {mode: {term: {"estimate", "se",
"finite_difference"}}}, ...} with one entry per (point, parameter), labelled in "parameters".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sepo.games import make_game
from sepo.games.ipd.rules import COOPERATE, DEFECT
from sepo.policies.base import Decision, DecisionRequest
from sepo.training.objective import EstimatorState, term_keys
from sepo.training.rollouts import BatchBuilder

#: the parametric agents (which parameter sets P(COOPERATE) at a decision) and their parameters' names
PARAMETER_NAMES = {"constant": ("p",), "reactive": ("p0", "pC", "pD"), "endgame": ("p0", "pC", "pD", "pC_last")}
AGENT_KINDS = tuple(PARAMETER_NAMES)


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@dataclass
class ScoredDecision(Decision):
    """A table agent's decision with its score function: the training batch's analogue of an answer's
    token log-probs, so the estimator's update of a table agent is sum_d A_d * score_d."""

    score: np.ndarray = field(default_factory=lambda: np.zeros(0))  # d log pi(action) / d theta


@dataclass
class ParametricAgent:
    """An IPD agent with P(COOPERATE) = sigmoid(theta[i]) at a decision whose feature is i.

    `constant`: one parameter for every decision. `reactive`: (p0, pC, pD), the first round, after
    the opponent cooperated, after it defected (TFT is p -> (1, 1, 0)). `endgame`: reactive, with its
    own pC_last after a cooperation in the last round (`rounds`), where no retaliation can follow:
    the parameter through which a finite game's end-game defection is learned (docs/results.md §1).
    """

    kind: str
    theta: np.ndarray
    name: str = "parametric"
    rounds: int = 8  # the game's length (endgame: which round is the last)

    def feature(self, round_index: int, opponent_last: str | None) -> int:
        if self.kind == "constant":
            return 0
        if round_index == 0 or opponent_last is None:
            return 0
        if self.kind == "endgame" and round_index == self.rounds - 1 and opponent_last == COOPERATE:
            return 3
        return 1 if opponent_last == COOPERATE else 2

    def cooperation(self, round_index: int, opponent_last: str | None) -> float:
        return sigmoid(float(self.theta[self.feature(round_index, opponent_last)]))

    def act_batch(self, requests: list[DecisionRequest]) -> list[Decision]:
        decisions = []
        for request in requests:
            obs = request.observation
            last = obs["history"][-1]["opp"] if obs["history"] else None
            i = self.feature(obs["round"], last)
            p = sigmoid(float(self.theta[i]))
            cooperate = request.rng.random() < p
            score = np.zeros(len(self.theta))
            score[i] = (1.0 - p) if cooperate else -p  # d log pi(a) / d theta_i for a sigmoid policy
            decisions.append(ScoredDecision(COOPERATE if cooperate else DEFECT, score=score))
        return decisions


def make_agent(kind: str, probabilities: Sequence[float], rounds: int = 8) -> ParametricAgent:
    if kind not in AGENT_KINDS:
        raise ValueError(f"agent kind {kind!r}; allowed: {', '.join(AGENT_KINDS)}")
    size = len(PARAMETER_NAMES[kind])
    if len(probabilities) != size:
        raise ValueError(
            f"a {kind} agent has {size} probabilities ({', '.join(PARAMETER_NAMES[kind])}), got {list(probabilities)}"
        )
    return ParametricAgent(kind, np.array([logit(p) for p in probabilities], dtype=float), rounds=rounds)


# ------------------------------------------------------------------------------ exact J
def opponent_cooperation(
    name: str, round_index: int, agent_last: str | None, agent_defected: bool, params: dict[str, dict[str, float]]
) -> float:
    """P(the IPD opponent `name` cooperates) given the Markov state; docs/spec.md §2's definitions."""
    tft = 0.0 if agent_last == DEFECT else 1.0
    if name == "TFT":
        return tft
    if name == "GenerousTFT":
        return float(params["GenerousTFT"]["forgive"]) if agent_last == DEFECT else 1.0
    if name == "Mixed":
        noise = float(params["Mixed"]["noise"])
        return (1.0 - noise) * tft + noise * 0.5
    if name == "NoisyTFT":
        flip = float(params["NoisyTFT"]["flip"])
        return (1.0 - flip) * tft + flip * (1.0 - tft)
    if name == "SuspiciousTFT":
        return 1.0 if agent_last == COOPERATE else 0.0
    if name == "Grim":
        return 0.0 if agent_defected else 1.0
    if name == "AlwaysD":
        return 0.0
    if name == "AltD":
        return 0.0 if round_index % 2 == 0 else 1.0
    if name == "AlwaysC":
        return 1.0
    if name == "Random":
        return 0.5
    raise ValueError(f"no exact model of IPD opponent {name!r}")


def opponent_means(agent: ParametricAgent, opponent: str, game_cfg: DictConfig) -> dict[str, float]:
    """Exact per-round means of one opponent's episodes: pay, opp_pay, ext, collusive (agent defects)."""
    p = game_cfg.payoffs
    pay = {
        (COOPERATE, COOPERATE): (p.reward, p.reward),
        (DEFECT, DEFECT): (p.punishment, p.punishment),
        (DEFECT, COOPERATE): (p.temptation, p.sucker),
        (COOPERATE, DEFECT): (p.sucker, p.temptation),
    }
    optimum = 2.0 * float(p.reward)
    params = {k: dict(v) for k, v in (game_cfg.get("strategy_params") or {}).items()}
    T = int(game_cfg.rounds)
    states: dict[tuple, float] = {(None, None, False): 1.0}  # (agent last, opponent last, agent ever defected)
    sums = {"pay": 0.0, "opp_pay": 0.0, "ext": 0.0, "collusive": 0.0}
    for t in range(T):
        nxt: dict[tuple, float] = {}
        for (a_last, o_last, defected), prob in states.items():
            pa = agent.cooperation(t, o_last)
            po = opponent_cooperation(opponent, t, a_last, defected, params)
            for a, qa in ((COOPERATE, pa), (DEFECT, 1.0 - pa)):
                for o, qo in ((COOPERATE, po), (DEFECT, 1.0 - po)):
                    q = prob * qa * qo
                    if q == 0.0:
                        continue
                    mine, theirs = pay[(a, o)]
                    sums["pay"] += q * mine
                    sums["opp_pay"] += q * theirs
                    sums["ext"] += q * (1.0 - (mine + theirs) / optimum)
                    sums["collusive"] += q * (a == DEFECT)
                    key = (a, o, defected or a == DEFECT)
                    nxt[key] = nxt.get(key, 0.0) + q
        states = nxt
    return {k: v / T for k, v in sums.items()}


def exact_terms(agent: ParametricAgent, cfg: DictConfig, s: DictConfig) -> dict[str, float]:
    """J's four terms with the training lambdas (J = u + e + c + x in this signed form), and each
    exploit opponent's advantage (`adv/<name>`)."""
    pools = {k: list(cfg.game.pools.get(k) or []) for k in ("train", "exploit", "collusive")}
    lam = {k: float(v) for k, v in cfg.lambdas.train.items()}
    scale = float(s.reward_scale) / float(cfg.game.max_payoff)
    means = {o: opponent_means(agent, o, cfg.game) for pool in pools.values() for o in pool}
    adv = {o: means[o]["opp_pay"] - means[o]["pay"] for o in pools["exploit"]}
    avg = lambda values: float(np.mean(values)) if values else 0.0  # noqa: E731
    out = {
        "u": scale * avg([means[o]["pay"] for o in pools["train"]]),
        "x": -lam["x"] * avg([means[o]["ext"] for o in pools["train"]]),
        "e": -lam["e"] * scale * avg([max(0.0, adv[o]) for o in pools["exploit"]]),
        "c": -lam["c"] * avg([means[o]["collusive"] for o in pools["collusive"]]),
    }
    return out | {f"adv/{o}": a for o, a in adv.items()}


def finite_difference(agent: ParametricAgent, cfg: DictConfig, s: DictConfig, h: float = 1e-4) -> dict[str, np.ndarray]:
    """Central differences of each exact term (and the total) with respect to the agent's parameters."""
    grads = {k: np.zeros(len(agent.theta)) for k in (*term_keys(), "total")}
    for i in range(len(agent.theta)):
        values = []
        for sign in (1.0, -1.0):
            theta = agent.theta.copy()
            theta[i] += sign * h
            values.append(exact_terms(replace(agent, theta=theta), cfg, s))
        for k in term_keys():
            grads[k][i] = (values[0][k] - values[1][k]) / (2 * h)
    grads["total"] = sum(grads[k] for k in term_keys())
    return grads


# ------------------------------------------------------------------------------ the estimator
@dataclass
class Estimate:
    """Per-term mean estimated update over batches, with its standard error, before and after the scale.

    `scaled[k]` is mean_b(update_b / scale_b) / mean_b(1 / scale_b): with a scale taken from earlier
    batches it has the same expectation as the unscaled update, which is what "a pure rescale" means.
    """

    batches: int
    mean: dict[str, np.ndarray] = field(default_factory=dict)
    se: dict[str, np.ndarray] = field(default_factory=dict)
    scaled: dict[str, np.ndarray] = field(default_factory=dict)
    scaled_se: dict[str, np.ndarray] = field(default_factory=dict)


def estimate_update(
    agent: ParametricAgent, cfg: DictConfig, s: DictConfig, batches: int, burn_in: int = 0, first_batch: int = 0
) -> Estimate:
    """Run `burn_in + batches` rollout batches through `BatchBuilder.collect`; average the last `batches`.

    The burn-in fills the estimator's running statistics (exploit switch, advantage scale) from
    earlier batches, as in a training run that has been going for a while.
    """
    game, builder = make_game(cfg.game), BatchBuilder(cfg, s)
    state = EstimatorState(scale_decay=float(s.adv_scale_decay), switch_episodes=int(s.exploit_switch_episodes))
    updates: dict[str, list[np.ndarray]] = {}
    inverse_scale: list[float] = []
    for b in range(first_batch, first_batch + burn_in + batches):
        batch = builder.collect(game, agent, b, state)
        if b < first_batch + burn_in:
            continue
        scores = np.stack([d.score for d in batch.decisions])
        for key, adv in batch.unscaled.items():
            updates.setdefault(key, []).append(adv @ scores)
        inverse_scale.append(1.0 / batch.scale)
    inv = np.asarray(inverse_scale)
    est = Estimate(batches)
    for key, values in updates.items():
        v = np.stack(values)
        est.mean[key] = v.mean(axis=0)
        est.se[key] = v.std(axis=0, ddof=1) / math.sqrt(len(v))
        w = v * inv[:, None]
        est.scaled[key] = w.mean(axis=0) / inv.mean()
        est.scaled_se[key] = w.std(axis=0, ddof=1) / math.sqrt(len(v)) / inv.mean()
    for key in (*term_keys(), "total"):  # terms a mode does not produce (e.g. e, c in per_rollout's layout) are 0
        for table in (est.mean, est.se, est.scaled, est.scaled_se):
            table.setdefault(key, np.zeros(len(agent.theta)))
    return est


# ------------------------------------------------------------------------------ the report
#: the points of the default table: every exploit opponent's advantage is far from 0 at each
#: (AltD's advantage is 5p - 2.5 for the constant agent), plus two on either side of AltD's kink
DEFAULT_POINTS: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("constant", (0.8,)),
    ("constant", (0.2,)),
    ("reactive", (0.9, 0.9, 0.5)),
    ("reactive", (0.3, 0.5, 0.1)),
    ("endgame", (0.9, 0.9, 0.5, 0.5)),
)
KINK_POINTS: tuple[tuple[str, tuple[float, ...]], ...] = (("constant", (0.56,)), ("constant", (0.44,)))


def check_point(
    kind: str, probabilities: Sequence[float], cfg: DictConfig, s: DictConfig, batches: int, burn_in: int
) -> dict[str, Any]:
    agent = make_agent(kind, probabilities, rounds=int(cfg.game.rounds))
    fd = finite_difference(agent, cfg, s)
    est = estimate_update(agent, cfg, s, batches, burn_in)
    exact = exact_terms(agent, cfg, s)
    label = f"{kind}({', '.join(f'{p:g}' for p in probabilities)})"
    names = PARAMETER_NAMES[kind]
    return {
        "label": label,
        "parameters": [f"{label}.{n}" for n in names],
        "fd": fd,
        "est": est,
        "advantages": {k[4:]: v for k, v in exact.items() if k.startswith("adv/")},
    }


def within(estimate: np.ndarray, target: np.ndarray, tolerance: np.ndarray) -> bool:
    return bool(np.all(np.abs(estimate - target) <= tolerance))


def total_agrees(est: dict[str, np.ndarray], fd: dict[str, np.ndarray], rel: float = 0.25) -> bool:
    """The total within `rel` of the sum of the terms' absolute gradients (terms can cancel)."""
    budget = rel * sum(np.abs(fd[k]) for k in term_keys())
    return within(est["total"], fd["total"], budget)


#: the estimator settings the report compares, as config overrides: the default and the paper's choices
VARIANTS: dict[str, tuple[str, ...]] = {
    "pooled": (),
    "per_rollout": ("sepo.penalty_mode=per_rollout",),
    "shared": ("sepo.penalty_mode=shared",),
    "pooled+credit=round": ("sepo.credit=round",),
    "pooled+adv_norm=group_round": ("sepo.adv_norm=group_round",),
    # the default with pools of their own size: each pool's term is a mean over its own groups, so it must still
    # follow every term's gradient
    "pooled+rollouts_by_pool": ("sepo.rollouts_by_pool={exploit:2,collusive:8}",),
}
#: the variants whose expected update is J's gradient, checked term by term
UNBIASED_VARIANTS = ("pooled", "pooled+rollouts_by_pool")


def verdicts(variant: str, point: dict[str, Any], kink: bool) -> dict[str, bool]:
    """docs/spec.md §4.4's pass/fail lines for one variant at one point."""
    fd, est = point["fd"], point["est"]
    if variant in UNBIASED_VARIANTS:
        terms = ("e",) if kink else term_keys()
        out = {
            f"{k} ({which})": term_agrees(getattr(est, which)[k], fd[k]) for k in terms for which in ("mean", "scaled")
        }
        if not kink:
            out |= {
                f"total ({which})": total_agrees({"total": getattr(est, which)["total"]}, fd)
                for which in ("mean", "scaled")
            }
        return {k.replace("(mean)", "(unscaled)"): v for k, v in out.items()}
    if variant == "shared":
        return {
            f"{k} = 0": bool(np.all(np.abs(est.mean[k]) <= 1e-9 * (1 + np.abs(est.mean["u"])))) for k in ("e", "c", "x")
        }
    return {}  # per_rollout: judged over all points at once (`zero_mean_checks`)


def zero_mean_checks(z: dict[str, list[float]], level: float = 0.05) -> tuple[dict[str, bool], dict[str, Any]]:
    """Is the expected update of each term 0? One check per term over all N (point, parameter) lines.

    "Within 2 SE" line by line would fail about one line in twenty by chance alone; the family-wise
    form of the same 5% test is Bonferroni's: every |z| <= the normal quantile of 1 - level / (2N)
    (3.02 for N = 20). The per-line count within 2 SE is reported beside it.
    """
    from statistics import NormalDist

    checks, detail = {}, {}
    for k, values in z.items():
        bound = NormalDist().inv_cdf(1 - level / (2 * len(values)))
        worst = max(abs(v) for v in values)
        checks[f"{k}: expected update 0 (every |z| <= {bound:.2f}, Bonferroni over {len(values)} lines)"] = (
            worst <= bound
        )
        detail[k] = {
            "lines": len(values),
            "within_2_se": sum(abs(v) <= 2 for v in values),
            "max_abs_z": round(worst, 3),
            "bonferroni_bound": round(bound, 3),
        }
    return checks, detail


def term_agrees(est: np.ndarray, fd: np.ndarray, rel: float = 0.25) -> bool:
    """The estimate points the same way as the finite difference and is within `rel` of its size.

    For a vector gradient g (several parameters) this reads ||estimate - g|| <= rel * ||g||: the
    direction agrees (cosine > 0.96) and the length is within `rel`. One parameter: the same sign
    and |estimate - g| <= rel * |g|.
    """
    return bool(np.linalg.norm(est - fd) <= rel * np.linalg.norm(fd))


def report(
    compose,
    batches: int,
    burn_in: int = 20,
    points=DEFAULT_POINTS,
    kink_points=KINK_POINTS,
    variants: dict[str, tuple[str, ...]] = VARIANTS,
    progress=print,
) -> dict[str, Any]:
    """Run every variant at every point; return the JSON of `python -m benchmarks gradcheck`.

    `compose(overrides)` returns the project's config (IPD) with those overrides.
    """
    from sepo.training.objective import sepo_settings

    out: dict[str, Any] = {
        "modes": {},
        "parameters": [],
        "batches": batches,
        "burn_in": burn_in,
        "checks": {},
        "advantages": {},
    }
    for variant, overrides in variants.items():
        cfg = compose(["game=ipd", *overrides])
        s = sepo_settings(cfg)
        table: dict[str, dict[str, list[float]]] = {
            k: {"estimate": [], "se": [], "estimate_scaled": [], "se_scaled": [], "finite_difference": []}
            for k in (*term_keys(), "total")
        }
        labels: list[str] = []
        zeros: dict[str, list[float]] = {"e": [], "c": []}
        for kink, group in ((False, points), (True, kink_points)):
            for kind, probs in group:
                point = check_point(kind, probs, cfg, s, batches, burn_in)
                labels += point["parameters"]
                out["advantages"][point["label"]] = {k: round(v, 4) for k, v in point["advantages"].items()}
                for k, row in table.items():
                    row["estimate"] += point["est"].mean[k].tolist()
                    row["se"] += point["est"].se[k].tolist()
                    row["estimate_scaled"] += point["est"].scaled[k].tolist()
                    row["se_scaled"] += point["est"].scaled_se[k].tolist()
                    row["finite_difference"] += point["fd"][k].tolist()
                if variant == "per_rollout":
                    for k in ("e", "c"):
                        live = point["est"].se[k] > 0
                        zeros[k] += (point["est"].mean[k][live] / point["est"].se[k][live]).tolist()
                for line, ok in verdicts(variant, point, kink).items():
                    out["checks"][f"{variant} {point['label']}{' (kink)' if kink else ''}: {line}"] = ok
                progress(f"{variant:28s} {point['label']:22s} done")
        if variant == "per_rollout":
            checks, out["per_rollout_zero_mean"] = zero_mean_checks(zeros)
            out["checks"] |= {f"per_rollout {line}": ok for line, ok in checks.items()}
        out["parameters"] = labels
        out["modes"][variant] = table
    out["all_checks_pass"] = all(out["checks"].values())
    return out


def print_table(result: dict[str, Any]) -> None:
    """The report as terminal tables: per variant, each parameter's estimate +- SE against the finite difference."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    for variant, table in result["modes"].items():
        view = Table(
            title=f"{variant}: estimated update (unscaled) +- SE  vs  finite difference of J", title_justify="left"
        )
        view.add_column("parameter")
        for k in (*term_keys(), "total"):
            view.add_column(k, justify="right")
        for i, label in enumerate(result["parameters"]):
            view.add_row(
                label,
                *[
                    f"{table[k]['estimate'][i]:+.3f}±{table[k]['se'][i]:.3f} ({table[k]['finite_difference'][i]:+.3f})"
                    for k in (*term_keys(), "total")
                ],
            )
        console.print(view)
    checks = Table(title="docs/spec.md §4.4 checks", title_justify="left")
    checks.add_column("check")
    checks.add_column("pass")
    for line, ok in result["checks"].items():
        checks.add_row(line, "yes" if ok else "NO")
    console.print(checks)
