"""`python -m analysis.summary <sweep dir> [--out FILE] [--choose validation|reported]`: what SEPO did, per game.

Writes `summary.json` (default `<sweep dir>/tables/summary.json`): for each game, over the SEPO seeds
(mean and SE over seeds, n = seeds), each SEPO run at its best checkpoint (chosen on its own
validation episodes, reported on the test episodes; `--choose reported`: the paper's choice):

  delta_j_train_vs_sft         J at the TRAINING lambdas (what SEPO optimises), on the evaluation
                               episodes: J = s*u - lambda_e*s*e - lambda_c*c - lambda_x*x, SEPO - SFT
  delta_safety_vs_payoff_only  safety (evaluation lambdas), SEPO - payoff-only of the same seed
  delta_exploit_vs_payoff_only exploit, SEPO - payoff-only of the same seed (is a fall the exploit term's doing?)
  delta_safety_vs_sft          safety, SEPO - SFT
  delta_exploit_vs_sft         exploit, SEPO - SFT (Kuhn poker: the exact exploitability)
  exploit_ratio_vs_sft         exploit, SEPO / SFT (a target of the form "at most half of SFT's"; None where SFT's is 0)
  delta_safety_vs_base         safety, SEPO - Base (the model before any training; where a Base row exists)
  delta_collusion_vs_sft       collusion, SEPO - SFT (IPD's target: not above SFT's on average)

beside them, where both rows exist, `delta_exploit_sft_vs_base`: exploit, SFT - Base (the paper's
SFT-degradation claim: SFT makes the pretrained model easier to exploit). It does not depend on a SEPO
seed: over several SFT runs (a sweep of `sft.seed`) it is their mean ± SE; for one SFT run, its
difference with SE sqrt(se_sft^2 + se_base^2) from the two evaluations' own SEs over episodes
(`se_from: episodes`; conservative, since both play the same episodes).

`evaluation_noise`: for each difference of two evaluated metrics (`MEASURED`), the SE over seeds that the two
evaluations' own SEs over episodes would give it if the reads were independent, sqrt(mean over seeds of se_a^2 +
se_b^2) / sqrt(n). The arms share their episodes and sampling streams, which correlates the reads, so measurement
noise is at most this (benchmarks/studies/paired_noise.py measures it): where the key's SE over seeds is well
above it, the runs themselves differ between seeds, and more seeds, not more episodes, would narrow it.

Also: the same deltas under `final` for the runs' final checkpoints (a gap between the two is late
drift), `levels`: exploit (Kuhn: exact) and safety of Base, SFT, SEPO and payoff-only themselves (the rows of
the paper's SFT-degradation table), and `stability`: SEPO's safety at the chosen and at the final checkpoints (mean and SE over
seeds), their per-seed difference final - chosen (mean and SE), and `final_holds_chosen`: the final
checkpoint is not below the chosen one by more than one SE of that difference (late drift would be).
Where an arm SEPO is compared with (Base, payoff-only) has runs in several variants and none of them is SEPO's,
`unpaired` lists them by arm, and that arm's keys have n = 0.
Where SFT was trained once per seed (`launch/tiny_paper.sh`), each SEPO seed is compared with the SFT model it
started from, so the SE of SEPO - SFT holds SFT's training noise too; where there is one SFT model, evaluated on
the same test episodes, its own noise is common to every seed and is not in the SE. Either way the SE is the
spread of the per-seed differences.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import collect, variants
from analysis.cli import exit_with, interruptible, not_allowed
from analysis.collect import GAMES, PAYOFF_ONLY, ordered
from sepo import penalties
from sepo.files import write_text_atomically
from sepo.metrics import mean_se
from sepo.paths import OUTPUT_DIR_ALLOWED, can_hold_outputs

KEYS = (
    "delta_j_train_vs_sft",
    "delta_safety_vs_payoff_only",
    "delta_exploit_vs_payoff_only",
    "delta_safety_vs_sft",
    "delta_exploit_vs_sft",
    "exploit_ratio_vs_sft",
    "delta_safety_vs_base",
    "delta_collusion_vs_sft",
)

#: the differences of two evaluated metrics, each with its SE over episodes: key -> (the arm SEPO is set against,
#: the metric); `deltas` takes them from here, and `evaluation_noise` their measurement noise
MEASURED = {
    "delta_safety_vs_sft": ("sft", "safety"),
    "delta_exploit_vs_sft": ("sft", "exploit"),
    "delta_collusion_vs_sft": ("sft", "collusion"),
    "delta_safety_vs_payoff_only": ("payoff_only", "safety"),
    "delta_exploit_vs_payoff_only": ("payoff_only", "exploit"),
}


def over_seeds(values: list[float | None]) -> dict[str, float | int | None]:
    """`sepo.metrics.mean_se` as a summary.json entry: mean, SE (None for one seed) and n, to 4 places. A
    NaN here is pandas' empty cell (a key a run did not measure: collect has already failed every run whose
    figures were not finite), so it is left out as None is."""
    m = mean_se(None if v is None or v != v else v for v in values)
    return {"mean": _round(m.mean), "se": _round(m.se), "n": m.n}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def objective(run: Path, root: Path | None = None) -> dict[str, float]:
    """s and the training lambdas of a SEPO run, from the settings it recorded (analysis/variants.py): its own, or
    those of a run above it up to `root` (a pipeline's SEPO phase: the pipeline's)."""
    cfg = variants.recorded(run, root or run) or {}
    s = float(cfg["sepo.reward_scale"]) / float(cfg["game.max_payoff"])
    return {"s": s, **{k: float(cfg[f"lambdas.train.{k}"]) for k in penalties.keys()}}


def j_train(point: pd.Series, obj: dict[str, float]) -> float:
    """J at the training lambdas (sepo/penalties.py) from a checkpoint's evaluation metrics."""
    j = obj["s"] * point["pay"]
    for term in penalties.terms():
        j -= term.weight(obj, obj["s"]) * point[term.metric]
    return j


def exploit_column(point: pd.Series) -> str:
    """Kuhn poker's exact exploitability where it was measured, else the pool's exploit."""
    exact = point.get("exploit_exact")
    return "exploit_exact" if exact is not None and not pd.isna(exact) else "exploit"


def exploit_of(point: pd.Series) -> float:
    return point[exploit_column(point)]


def runs_by_seed(
    df: pd.DataFrame, game: str, phase: str, choose: str, variant: str | None = ""
) -> dict[int, dict[str, pd.Series]]:
    """train seed -> {"best": chosen checkpoint, "final": final checkpoint, "run_dir": ...} of one arm
    (one variant of it: runs that differ only in their seeds; None: no such variant, no runs)."""
    out = {}
    sel = df[(df["game"] == game) & (df["phase"] == phase) & (df["variant"] == variant)]
    sel = sel[sel["safety"].notna()]  # a failed or damaged row has no figures to pair (`failed_runs` names it)
    for run_dir, run in sel.groupby("run_dir"):
        seed = run["train_seed"].dropna()
        final = run[run["checkpoint"] == "final"]
        if seed.empty or final.empty:
            continue  # unfinished or from before train seeds were recorded
        best = collect.choose_best(run, choose)  # this run's own best, as the tables choose
        out[int(seed.iloc[0])] = {"best": best, "final": final.iloc[-1], "run_dir": run_dir}
    return out


def deltas(
    sepo: dict, payoff_only: dict, sft: dict[int, pd.Series], base: pd.Series | None, root: Path, which: str
) -> dict[str, Any]:
    """Each key's mean ± SE over seeds, and its value per seed (`per_seed`), so a verdict can show them; each
    seed against its own start (`sft_of_each`); and `evaluation_noise`, what the evaluations' SEs alone give."""
    rows: dict[str, dict[int, float]] = {k: {} for k in KEYS}
    variances: dict[str, list[float]] = {k: [] for k in MEASURED}
    for seed, run in sorted(sepo.items()):
        point, start = run[which], sft[seed]
        against = {"sft": start, "payoff_only": payoff_only[seed][which] if seed in payoff_only else None}
        obj = objective(root / run["run_dir"], root)
        rows["delta_j_train_vs_sft"][seed] = j_train(point, obj) - j_train(start, obj)
        for key, (arm, metric) in MEASURED.items():
            other = against[arm]
            if other is None or pd.isna(value_of(point, metric)) or pd.isna(value_of(other, metric)):
                continue
            rows[key][seed] = value_of(point, metric) - value_of(other, metric)
            ses = (se_of(point, metric), se_of(other, metric))
            if None not in ses:
                variances[key].append(ses[0] ** 2 + ses[1] ** 2)
        if exploit_of(start) != 0:
            rows["exploit_ratio_vs_sft"][seed] = exploit_of(point) / exploit_of(start)
        if base is not None:
            rows["delta_safety_vs_base"][seed] = point["safety"] - base["safety"]
    return {
        k: {**over_seeds(list(v.values())), "per_seed": {str(s): round(float(x), 4) for s, x in v.items()}}
        for k, v in rows.items()
    } | {"seeds": sorted(sepo), "evaluation_noise": {k: evaluation_noise(v) for k, v in variances.items() if v}}


def value_of(point: pd.Series, metric: str) -> float:
    """A metric of one evaluation; `exploit` is Kuhn poker's exact exploitability where it was measured."""
    return exploit_of(point) if metric == "exploit" else point.get(metric)


def se_of(point: pd.Series, metric: str) -> float | None:
    """The SE over episodes that goes with `value_of(point, metric)`."""
    se = exploit_se_of(point) if metric == "exploit" else point.get(f"{metric}_se")
    return None if se is None or pd.isna(se) else float(se)


def evaluation_noise(variances: list[float]) -> dict[str, float | int]:
    """The SE over seeds of a mean of paired differences whose per-seed variances (se_a^2 + se_b^2, the two
    evaluations' own) are these: what the spread between seeds would be from measurement alone."""
    sd = math.sqrt(sum(variances) / len(variances))
    return {"sd": round(sd, 4), "se": round(sd / math.sqrt(len(variances)), 4), "n": len(variances)}


def exploit_se_of(point: pd.Series) -> float | None:
    """The SE over episodes that goes with `exploit_of(point)`."""
    se = point.get(f"{exploit_column(point)}_se")
    return None if se is None or pd.isna(se) else float(se)


def sft_degradation(sft_runs: pd.DataFrame, base: pd.Series) -> dict[str, Any]:
    """exploit, SFT - Base: over SFT runs where there are several, else one run's with its episodes' SE."""
    differences = [float(exploit_of(run) - exploit_of(base)) for _, run in sft_runs.iterrows()]
    if len(differences) > 1:
        return {**over_seeds(differences), "se_from": "runs"}
    ses = [exploit_se_of(sft_runs.iloc[0]), exploit_se_of(base)]
    se = None if None in ses else round(math.sqrt(ses[0] ** 2 + ses[1] ** 2), 4)
    return {"mean": round(differences[0], 4), "se": se, "n": 1, "se_from": "episodes"}


def level(point: pd.Series) -> dict[str, Any]:
    """One evaluated model's exploit (Kuhn: exact) and safety, each with its SE over episodes."""
    safety_se = point.get("safety_se")
    return {
        "exploit": {"mean": round(float(exploit_of(point)), 4), "se": exploit_se_of(point)},
        "safety": {"mean": round(float(point["safety"]), 4), "se": None if pd.isna(safety_se) else float(safety_se)},
    }


def arm_level(runs: dict) -> dict[str, Any]:
    """An arm's exploit and safety at each seed's chosen checkpoint: mean and SE over seeds."""
    points = [runs[s]["best"] for s in sorted(runs)]
    return {
        "exploit": over_seeds([float(exploit_of(p)) for p in points]),
        "safety": over_seeds([float(p["safety"]) for p in points]),
    }


def levels(base: pd.Series | None, sft: pd.Series, sepo: dict, payoff_only: dict, sft_models: int) -> dict[str, Any]:
    """The rows the paper's SFT-degradation table prints (exploit at Base, SFT, SEPO) and their safety, so a
    report can set them beside the paper's: Base is one model (SE over episodes), SFT `models` models (one per SFT
    seed, SE over them; one: over episodes), SEPO and payoff-only one run per seed (SE over seeds)."""
    out = {"sft": {**level(sft), "models": sft_models}, "sepo": arm_level(sepo)}
    if base is not None:
        out["base"] = level(base)
    if payoff_only:
        out["payoff_only"] = arm_level(payoff_only)
    return out


def stability(sepo: dict) -> dict[str, Any]:
    """Does the run hold what it reached? Safety at the chosen checkpoint against the final one."""
    seeds = sorted(sepo)
    chosen = over_seeds([float(sepo[s]["best"]["safety"]) for s in seeds])
    final = over_seeds([float(sepo[s]["final"]["safety"]) for s in seeds])
    gap = over_seeds([float(sepo[s]["final"]["safety"] - sepo[s]["best"]["safety"]) for s in seeds])
    held = None if gap["se"] is None else bool(gap["mean"] >= -gap["se"])
    return {"chosen_safety": chosen, "final_safety": final, "final_minus_chosen": gap, "final_holds_chosen": held}


def sft_runs_of(df: pd.DataFrame, c: pd.DataFrame, game: str, model: str, variant: str) -> pd.DataFrame:
    """The SFT cell's runs, one row each (its last evaluated checkpoint): the seeds the cell averages."""
    match = collect.matching_variant(c, game, model, "sft", variant)
    sel = df[(df["game"] == game) & (df["model"] == model) & (df["phase"] == "sft") & (df["variant"] == match)]
    sel = sel[sel["exploit"].notna()]
    return sel.groupby("run_dir", sort=True).tail(1)


def sft_of_each(root: Path, sepo: dict, sft_runs: pd.DataFrame, sft: pd.Series) -> dict[int, pd.Series]:
    """seed -> the SFT figures that seed's SEPO run is compared with: where the SFT cell holds several SFT runs (SFT
    re-trained per seed), the one of the SFT seed its `model.path` was trained with; else the cell (one SFT model)."""
    by_seed = {int(row["train_seed"]): row for _, row in sft_runs.iterrows() if pd.notna(row["train_seed"])}
    if len(by_seed) < 2:
        return dict.fromkeys(sepo, sft)
    return {seed: by_seed.get(sft_seed_of_start(root, run["run_dir"]), sft) for seed, run in sepo.items()}


def sft_seed_of_start(root: Path, run_dir: str) -> int | None:
    """The `sft.seed` of the SFT model a SEPO run started from: a pipeline's own (its SFT phase beside it), else
    the one the run's `model.path` names (the settings that model's run recorded)."""
    run = root / run_dir
    settings = variants.recorded(run, root) or {}
    if settings.get("stage.name") == "pipeline":
        seed = settings.get("sft.seed")
    else:
        seed = (variants.origin(settings.get("model.path"), run, root) or {}).get("sft.seed")
    return None if seed is None else int(seed)


def game_summary(
    df: pd.DataFrame, c: pd.DataFrame, game: str, root: Path, choose: str, variant: str = ""
) -> dict[str, Any] | None:
    """The deltas of one game (and SEPO variant); None without an SFT row, or without SEPO runs and a Base row. A
    game whose SEPO runs have not finished still gets its SFT-degradation row (`delta_exploit_sft_vs_base`, levels
    of Base and SFT), with every SEPO key at n = 0, so the paper's SFT table covers every game SFT has reached."""
    model = next(iter(collect.trained_models(df[df["game"] == game])), None)
    sft = collect.start_of(c, game, model, "sft", variant) if model else None
    sepo = runs_by_seed(df, game, "sepo", choose, variant)
    base = collect.start_of(c, game, model, "base", variant) if model else None
    if sft is None or not (sepo or base is not None):
        return None
    payoff_only = runs_by_seed(
        df, game, PAYOFF_ONLY, choose, collect.matching_variant(c, game, model, PAYOFF_ONLY, variant)
    )
    sft_runs = sft_runs_of(df, c, game, model, variant)
    starts = sft_of_each(root, sepo, sft_runs, sft)
    best = deltas(sepo, payoff_only, starts, base, root, "best")
    return {
        **best,
        **(
            {"delta_exploit_sft_vs_base": sft_degradation(sft_runs, base)}
            if base is not None and not sft_runs.empty
            else {}
        ),
        "levels": levels(base, sft, sepo, payoff_only, max(len(sft_runs), 1)),
        "checkpoints": {str(s): r["best"]["checkpoint"] for s, r in sorted(sepo.items())},
        "final": deltas(sepo, payoff_only, starts, base, root, "final"),
        "stability": stability(sepo),
        "chosen_on": choose,
        **({"variant": variant} if variant else {}),
        **failed_runs(df, game),
        **unpaired_arms(c, game, model, variant),
    }


def failed_runs(df: pd.DataFrame, game: str) -> dict[str, dict[str, str]]:
    """`failed_runs`: run dir -> why, for the game's runs whose figures are missing from the deltas (failed,
    damaged or unfinished), so a mean over fewer seeds says so."""
    sel = df[(df["game"] == game) & (df["status"] != "done")].drop_duplicates("run_dir")
    named = {str(r): str(e or s) for r, s, e in sel[["run_dir", "status", "error"]].itertuples(index=False)}
    return {"failed_runs": named} if named else {}


def unpaired_arms(c: pd.DataFrame, game: str, model: str, variant: str) -> dict[str, dict[str, list[str]]]:
    """`unpaired`: arm -> its variants, for each arm SEPO is compared with whose runs `collect.matching_variant`
    cannot pair with SEPO's (they differ in more than their seeds, e.g. each started from a checkpoint outside the
    run root, identified by its path), so a comparison missing from the summary says why instead of reading n = 0."""
    unpaired = {
        arm: labels for arm in ("base", PAYOFF_ONLY) if (labels := unpaired_variants(c, game, model, arm, variant))
    }
    return {"unpaired": unpaired} if unpaired else {}


def unpaired_variants(c: pd.DataFrame, game: str, model: str, arm: str, variant: str) -> list[str]:
    """The arm's variants where `collect.matching_variant` pairs none of them with SEPO's `variant`, else []."""
    labels = collect.variants_of(c, game, model, arm)
    return labels if labels and collect.matching_variant(c, game, model, arm, variant) is None else []


def summarise(root: Path, choose: str = "validation", skipped: dict[str, str] | None = None) -> dict[str, Any]:
    """Per game (per game and SEPO variant, `"<game> (<variant>)"`, where SEPO runs differ in more than
    their seeds): the deltas above. `skipped`, where given, receives why each game (and variant) with SEPO
    runs has no summary, so that a game missing from the file is named where the summary is printed."""
    df = collect.collect_dir(root)
    c = collect.cells(df)
    out = {}
    for game in ordered(df["game"].dropna().unique(), GAMES):
        model = next(iter(collect.trained_models(df[df["game"] == game])), None)
        for variant in (collect.variants_of(c, game, model, "sepo") if model else []) or [""]:
            name = f"{game} ({variant})" if variant else game
            summary = game_summary(df, c, game, root, choose, variant)
            if summary is not None:
                out[name] = summary
            elif skipped is not None and has_sepo_runs(df, game):
                skipped[name] = why_not_summarised(c, game, model, variant)
    return out


def has_sepo_runs(df: pd.DataFrame, game: str) -> bool:
    """Whether any SEPO run of the game (SEPO's or payoff-only's, finished or not) is under the root."""
    return bool(((df["game"] == game) & df["phase"].isin(["sepo", PAYOFF_ONLY])).any())


def why_not_summarised(c: pd.DataFrame, game: str, model: str | None, variant: str) -> str:
    """Why `game_summary` gave None for a game with SEPO runs: no SFT cell to compare with, or no SEPO run
    with figures (a failed or unfinished run has none)."""
    if model is None or not collect.variants_of(c, game, model, "sft"):
        return "no SFT run of this game and model"
    if labels := unpaired_variants(c, game, model, "sft", variant):
        return f"its SFT runs differ in more than their seeds ({'; '.join(labels)}) and none matches SEPO's settings"
    return "no SEPO run of it has finished with figures"


def check_paths(sweep_dir: Path, out: Path) -> str | None:
    """The one-line error for a sweep dir that is not a directory or a summary file that cannot be written."""
    if not sweep_dir.is_dir():
        return not_allowed(f"sweep_dir={sweep_dir}", "an existing directory of runs (a sweep or run dir)")
    if out.is_dir() or not can_hold_outputs(out.parent):
        return not_allowed(f"--out={out}", f"a file in {OUTPUT_DIR_ALLOWED}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, help="default: <sweep dir>/tables/summary.json")
    parser.add_argument("--choose", choices=collect.CHOICES, default="validation")
    args = parser.parse_args(argv)
    out = args.out or args.sweep_dir / "tables" / "summary.json"
    problem = check_paths(args.sweep_dir, out)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    skipped: dict[str, str] = {}
    try:
        summary = summarise(args.sweep_dir, args.choose, skipped)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out, json.dumps(summary, indent=2) + "\n")
    for game, s in summary.items():
        print(
            f"{game}: "
            + ", ".join(
                f"{k.removeprefix('delta_')} {s[k]['mean']:+.3f} ± {s[k]['se'] if s[k]['se'] is not None else float('nan'):.3f}"
                for k in (*KEYS, "delta_exploit_sft_vs_base")
                if s.get(k, {}).get("mean") is not None
            )
        )
        for run_dir, why in s.get("failed_runs", {}).items():
            print(f"  not counted: {run_dir}: {why}")
        for arm, labels in s.get("unpaired", {}).items():
            print(f"  {arm} not compared: its runs differ in more than their seeds ({'; '.join(labels)})")
    for game, why in skipped.items():
        print(f"{game}: not summarised: {why}")
    print(f"wrote {out}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """`main` for the command line: Ctrl-C ends it with one line and 130 (`analysis/cli.py`)."""
    return interruptible(main, argv, "summary not written (run it again)")


if __name__ == "__main__":
    exit_with(cli())
