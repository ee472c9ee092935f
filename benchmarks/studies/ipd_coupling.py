"""Which of IPD's situations does a language model play as one? Push one, read them all.

The reactive agent of `benchmarks.studies.ipd_reactive` has one parameter per feature of the history (the
first round, after the opponent cooperated, after it defected, the last round after a cooperation); J's exact
ascent there asks for fewer cooperations after a defection and no fewer after a cooperation. A language model
shares its parameters between the features, so a step at one may move the others. This measures that on a
checkpoint: histories as an evaluation played them (`results.json`'s `per_episode`), drawn per feature; from
a fresh SEPO adapter (the SEPO stage's own `build_learner`), `--steps` policy-gradient steps at ONE feature's
histories only (`--batch` sampled answers each, advantage +-(1 if COOPERATE else 0, minus the batch mean), the
loss of `accumulate_gradients` without its KL term); then every feature is read again on the same sampling
streams. Each push starts again from the checkpoint.

Each read also sorts the answers by what their reasoning line says the opponent did last (`named_last_move`):
rightly, wrongly ("no defection yet" after a defection) or not at all. A model whose action follows its line,
and whose line misreads the history, plays the features as one however its steps are aimed.

    python -m benchmarks.studies.ipd_coupling --sft-run <ipd sft run> --results <its test results.json>
        [--push pD:down pC:up] [--steps 6] [--histories 8] [--samples 16] [overrides ...]
    python -m benchmarks.studies.ipd_coupling --sft-run <ipd sft run> --last-moves [--samples 48] [overrides ...]

`--last-moves` reads instead which last move the model answers: P(COOPERATE) after each pair (own move, the
opponent's move) of a last round, in round 2 and after two rounds of mutual cooperation (`read_last_moves`).

The last line is a JSON object {"sft_run", "steps", "lr", "histories", "samples", "before", "pushes"}.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.estimator.finite_differences import PARAMETER_NAMES, make_agent

FEATURES = PARAMETER_NAMES["endgame"]
#: the opponent's last move each feature's histories end with (the first round has none)
TRUE_LAST = {"p0": None, "pC": "COOPERATE", "pD": "DEFECT", "pC_last": "COOPERATE"}
#: words with which an answer's first line says what the opponent did last (the SFT data's IPD lines and the
#: SFT model's paraphrases of them); a line that says both, or neither, names no move
SAYS = {
    "COOPERATE": ("cooperated", "no defection", "cooperation was met", "cooperating every round"),
    "DEFECT": ("defected", "their defection", "a defection", "defection in round", "trust was broken"),
}


def named_last_move(text: str | None) -> str | None:
    """The opponent's last move as the answer's first line names it, or None."""
    first = (text or "").strip().lower().split("\n")[0]
    says_cooperate = any(w in first for w in SAYS["COOPERATE"])
    says_defect = any(w in first.replace("no defection", "") for w in SAYS["DEFECT"])
    return {(True, False): "COOPERATE", (False, True): "DEFECT"}.get((says_cooperate, says_defect))


def histories(results: Path, per_feature: int, rounds: int) -> dict[str, list[list[tuple[str, str]]]]:
    """Up to `per_feature` distinct played histories of each feature, drawn with a fixed seed."""
    found: dict[str, set] = {name: set() for name in FEATURES}
    for episode in json.loads(results.read_text())["per_episode"]:
        actions, agent = (
            [tuple(a) for a in episode["actions"]],
            make_agent("endgame", [0.5] * len(FEATURES), rounds=rounds),
        )
        for t in range(len(actions)):
            found[FEATURES[agent.feature(t, actions[t - 1][1] if t else None)]].add(tuple(actions[:t]))
    rng = np.random.default_rng(0)
    drawn = {}
    for name, seen in found.items():
        ordered = sorted(seen)
        keep = rng.choice(len(ordered), size=min(per_feature, len(ordered)), replace=False) if ordered else []
        drawn[name] = [list(ordered[i]) for i in sorted(keep)]
    return drawn


def requests_at(game, history: list[tuple[str, str]], count: int, stream: int) -> list:
    from sepo.games.base import AGENT, OPPONENT
    from sepo.policies.base import DecisionRequest

    state = game.reset(seed=0)
    for mine, theirs in history:
        game.step(state, {AGENT: mine, OPPONENT: theirs})
    legal = game.legal_actions(state, AGENT)
    return [DecisionRequest(game, state, AGENT, legal, np.random.default_rng([stream, i])) for i in range(count)]


def feature_requests(game, drawn: dict, name: str, per_history: int, stream: int) -> list:
    """`per_history` answers at each of the feature's histories; a feature with fewer (the first round: one)
    gets as many in all, spread over its histories."""
    answers = per_history * max(len(h) for h in drawn.values())
    each = -(-answers // max(len(drawn[name]), 1))
    return [r for h, history in enumerate(drawn[name]) for r in requests_at(game, history, each, stream + h)]


def last_moves_histories(opening: int) -> dict[str, list[tuple[str, str]]]:
    """The four last rounds (own move, the opponent's move) after `opening` rounds of mutual cooperation: the
    histories that tell a model that answers the opponent (TFT: cooperate exactly where the opponent did) from one
    that repeats its own last move (the demonstrators' mixture read as a persona: AlwaysD keeps defecting)."""
    from sepo.games.ipd.rules import COOPERATE, DEFECT

    cooperated = [(COOPERATE, COOPERATE)] * opening
    return {
        f"own {own[0]} opp {opp[0]}": [*cooperated, (own, opp)]
        for own in (COOPERATE, DEFECT)
        for opp in (COOPERATE, DEFECT)
    }


def read_last_moves(game, policy, samples: int, openings: tuple[int, ...] = (0, 2)) -> dict:
    """P(COOPERATE) at each history of `last_moves_histories`, `samples` answers each, and how far the opponent's
    last move and the model's own move each move it (the mean difference over the other move's two values)."""
    from sepo.games.ipd.rules import COOPERATE

    out = {}
    for opening in openings:
        table = {}
        for h, (name, history) in enumerate(last_moves_histories(opening).items()):
            decisions = policy.act_batch(requests_at(game, history, samples, stream=50_000 + 100 * opening + h))
            table[name] = round(float(np.mean([d.action == COOPERATE for d in decisions])), 4)
        effect = {
            "opponent": round(
                (table["own C opp C"] + table["own D opp C"] - table["own C opp D"] - table["own D opp D"]) / 2, 4
            ),
            "own": round(
                (table["own C opp C"] + table["own C opp D"] - table["own D opp C"] - table["own D opp D"]) / 2, 4
            ),
        }
        out[f"round {opening + 2}"] = {"p_cooperate": table, "effect_on_p_cooperate": effect}
    return out


def read(game, policy, drawn: dict, samples: int) -> dict:
    """Per feature: P(COOPERATE) over its histories' sampled answers; the share of answers whose line names the
    opponent's last move rightly, wrongly or not at all; and P(COOPERATE) among the right and the wrong ones."""
    from sepo.games.ipd.rules import COOPERATE

    out = {}
    for f, name in enumerate(FEATURES):
        decisions = policy.act_batch(feature_requests(game, drawn, name, samples, stream=1000 * f))
        cooperate = np.array([d.action == COOPERATE for d in decisions], dtype=float)
        named = [named_last_move(d.text) for d in decisions]
        reading = np.array(["none" if n is None else ("right" if n == TRUE_LAST[name] else "wrong") for n in named])
        out[name] = {
            "p_cooperate": round(float(cooperate.mean()), 4),
            "se": round(float(cooperate.std(ddof=1) / np.sqrt(len(cooperate))), 4),
            **{f"names_{k}": round(float(np.mean(reading == k)), 4) for k in ("right", "wrong", "none")},
            **{
                f"p_cooperate_when_{k}": round(float(cooperate[reading == k].mean()), 4)
                if (reading == k).any()
                else None
                for k in ("right", "wrong")
            },
        }
    return out


def push(cfg, feature: str, sign: float, drawn: dict, args: argparse.Namespace) -> dict:
    """`args.steps` policy-gradient steps that move `feature`'s histories alone; every feature read after.

    `--direction optimizer` steps with the SEPO stage's own optimizer (`sepo.optimizer`, `sepo.lr`); `gradient` and
    `natural` step along the gradient or the natural gradient, each step of a KL of `--step-kl` per answer
    (`kl_step`), so that the two directions compare at one step size."""
    import torch

    from sepo.games import make_game
    from sepo.games.ipd.rules import COOPERATE
    from sepo.stages.sepo_loop import build_learner
    from sepo.training.objective import sepo_settings
    from sepo.training.rollouts import RolloutBatch
    from sepo.training.update import accumulate_gradients

    s = sepo_settings(cfg)
    torch.manual_seed(int(s.seed))
    learner, game = build_learner(cfg, s), make_game(cfg.game)
    pushed, kls = drawn[feature], []
    for step in range(args.steps):
        requests = [r for h, history in enumerate(pushed) for r in requests_at(game, history, 1, 7919 * step + h)]
        requests = [
            replace(requests[i % len(requests)], rng=np.random.default_rng([step, i])) for i in range(args.batch)
        ]
        answers = learner.policy.act_batch(requests, return_logprobs=True)
        y = np.array([float(d.action == COOPERATE) for d in answers])
        one_feature = RolloutBatch([], answers, sign * (y - y.mean()) / args.batch, {}, 1.0, {})
        learner.optimizer.zero_grad()
        accumulate_gradients(learner.model, learner.policy, one_feature, None, s)  # the SEPO loss without KL
        if args.direction == "optimizer":
            learner.optimizer.step()
        else:
            kls.append(kl_step(learner, game, drawn, step, answers, args, s))
            print(f"  step {step + 1}: {args.direction} step of KL {kls[-1]:.4f} per answer", flush=True)
    return {
        "feature": feature,
        "direction": "up" if sign > 0 else "down",
        **({"step_kl": kls} if kls else {}),
        "after": read(game, learner.policy, drawn, args.samples),
    }


def kl_step(learner, game, drawn: dict, step: int, pushed: list, args: argparse.Namespace, s) -> float:
    """Step along the gradient in `.grad` (`args.direction` gradient) or the natural gradient (natural) by a
    KL of `args.step_kl` per answer.

    The Fisher is the empirical one of the policy where it plays every feature: the `pushed` answers (whose
    scores span the gradient, so that no part of the step escapes the KL's estimate) and `args.fisher_answers`
    fresh answers at each feature's histories, each answer's score vector g_i = grad log pi(answer) (from the SEPO loss of
    that answer alone), F = G^T G / N (`natural_direction`). The step's length makes its quadratic KL,
    d^T F d / 2 (nats per answer, averaged over the features' answers), equal `args.step_kl`.
    To first order a step of the natural gradient moves the policy at the pushed feature alone, wherever the
    model's parameters can move the features apart; the gradient moves them by their kernel."""
    import torch

    from sepo.training.rollouts import RolloutBatch
    from sepo.training.update import accumulate_gradients, answer_divisor

    params = [p for p in learner.model.parameters() if p.requires_grad]
    gradient = torch.cat([p.grad.reshape(-1) for p in params]).double()
    requests = [
        r
        for f, name in enumerate(FEATURES)
        for r in feature_requests(game, drawn, name, args.fisher_answers, stream=100_000 * (step + 1) + 1000 * f)
    ]
    answers = [*pushed, *learner.policy.act_batch(requests, return_logprobs=True)]
    scores, divisor = [], answer_divisor(s)
    for answer in answers:  # advantage = the loss's divisor of the answer: its score is grad log pi(answer)
        learner.optimizer.zero_grad()
        length = np.array([divisor or float(answer.tokens.gen_ids.numel())])
        accumulate_gradients(learner.model, learner.policy, RolloutBatch([], [answer], length, {}, 1.0, {}), None, s)
        scores.append(torch.cat([p.grad.reshape(-1) for p in params]).double())
    scores = torch.stack(scores)
    if args.direction == "natural":
        direction, quadratic_kl = natural_direction(scores, gradient)
    else:
        direction, quadratic_kl = gradient, 0.5 * float((scores @ gradient).pow(2).mean())
    length = (args.step_kl / max(quadratic_kl, 1e-30)) ** 0.5
    with torch.no_grad():
        offset = 0
        for p in params:
            p -= (length * direction[offset : offset + p.numel()]).reshape(p.shape).to(p.dtype)
            offset += p.numel()
    learner.optimizer.zero_grad()
    return round(quadratic_kl * length**2, 6)


def natural_direction(scores, gradient, damping_share: float = 0.1):
    """(F + d I)^-1 g for the empirical Fisher F = G^T G / N of the N score vectors (rows of `scores`), by
    Woodbury's identity through the N x N system, with d = `damping_share` times F's mean non-zero eigenvalue;
    and that direction's quadratic KL, d^T F d / 2."""
    import torch

    n = scores.shape[0]
    gram = scores @ scores.T  # N times F's non-zero eigenvalues
    damping = damping_share * float(torch.trace(gram)) / n**2
    inner = torch.linalg.solve(n * damping * torch.eye(n, dtype=gram.dtype) + gram, scores @ gradient)
    direction = (gradient - scores.T @ inner) / damping
    return direction, 0.5 * float((scores @ direction).pow(2).mean())


def compose(sft_run: Path, overrides: list[str]):
    from sepo.run.compose import compose_config

    return compose_config(
        ["stage=sepo", "game=ipd", "model=smollm2", "logger=none", f"model.path='{sft_run / 'merged'}'", *overrides]
    )


def show(before: dict, after: dict | None = None, pushed: str = "") -> None:
    for name in FEATURES:
        b = before[name]
        row = f"  {name:8s} P(C) {b['p_cooperate']:.3f} ± {b['se']:.3f}, names the last move wrongly {b['names_wrong']:.2f}"
        if after:
            a = after[name]
            row += f"  ->  {a['p_cooperate']:.3f} ± {a['se']:.3f} ({a['p_cooperate'] - b['p_cooperate']:+.3f}),"
            row += f" wrongly {a['names_wrong']:.2f}{'   <- pushed' if name == pushed else ''}"
        print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-run", type=Path, required=True, help="an IPD (multi) SFT run with merged/")
    parser.add_argument("--results", type=Path, help="an IPD results.json whose histories to use (not --last-moves)")
    parser.add_argument("--push", nargs="+", default=["pD:down", "pC:up"], help="FEATURE:up|down (toward COOPERATE)")
    parser.add_argument("--steps", type=int, default=6, help="policy-gradient steps per push")
    parser.add_argument("--batch", type=int, default=32, help="sampled answers per step")
    parser.add_argument("--histories", type=int, default=8, help="played histories per feature")
    parser.add_argument(
        "--samples",
        type=int,
        default=16,
        help="answers per history at each read (the first round, one history, gets as many in all)",
    )
    parser.add_argument(
        "--direction", choices=["optimizer", "gradient", "natural"], default="optimizer", help="each push's steps"
    )
    parser.add_argument("--step-kl", type=float, default=0.05, help="gradient, natural: KL per answer of a step")
    parser.add_argument("--fisher-answers", type=int, default=4, help="gradient, natural: answers per history, Fisher")
    parser.add_argument(
        "--last-moves",
        action="store_true",
        help="read P(COOPERATE) after each pair of last moves (own, opponent) and stop: which one the model answers",
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sepo.lr=5e-4")
    args = parser.parse_args()
    wanted = [item.partition(":")[::2] for item in args.push]
    for (feature, direction), item in zip(wanted, args.push):
        if feature not in FEATURES or direction not in ("up", "down"):
            parser.error(f"--push {item}: give FEATURE:up or FEATURE:down; allowed features: {', '.join(FEATURES)}")
    if not (args.sft_run / "merged").is_dir():
        parser.error(f"--sft-run {args.sft_run}: no merged/ checkpoint there (run stage=sft game=ipd)")
    if not args.last_moves and (args.results is None or not args.results.is_file()):
        parser.error(f"--results {args.results}: no such file")

    import torch

    from sepo.games import make_game
    from sepo.stages.sepo_loop import build_learner
    from sepo.training.objective import sepo_settings

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = compose(args.sft_run, args.overrides)
    if args.last_moves:
        start = build_learner(cfg, sepo_settings(cfg))
        table = read_last_moves(make_game(cfg.game), start.policy, args.samples)
        for round_name, row in table.items():
            print(f"{round_name}: P(COOPERATE) {row['p_cooperate']}; effect {row['effect_on_p_cooperate']}", flush=True)
        print(json.dumps({"sft_run": str(args.sft_run), "samples": args.samples, "overrides": args.overrides, **table}))
        return
    drawn = histories(args.results, args.histories, int(cfg.game.rounds))
    start = build_learner(cfg, sepo_settings(cfg))
    before = read(make_game(cfg.game), start.policy, drawn, args.samples)
    del start
    print(f"the checkpoint ({args.sft_run}), {args.histories} histories x {args.samples} answers per feature:")
    show(before)
    pushes = []
    for feature, direction in wanted:
        out = push(cfg, feature, 1.0 if direction == "up" else -1.0, drawn, args)
        pushes.append(out)
        size = f"{args.direction}, KL {args.step_kl} a step" if args.direction != "optimizer" else f"lr {cfg.sepo.lr}"
        print(f"\npushed {feature} {direction} for {args.steps} steps ({size}):")
        show(before, out["after"], feature)
    summary = {"sft_run": str(args.sft_run), "steps": args.steps, "lr": float(cfg.sepo.lr), "histories": drawn,
               "direction": args.direction, "step_kl": args.step_kl, "fisher_answers": args.fisher_answers,
               "samples": args.samples, "overrides": args.overrides, "before": before, "pushes": pushes}  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
