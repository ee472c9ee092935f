"""`python -m analysis.report <summary.json> [--doc docs/results.md] [--section <name>]` (`--help` lists the names).

Renders `summary.json` (written by `analysis.summary`, e.g. by `launch/tiny_paper.sh` or
`launch/stability.py`) as Markdown tables and puts them between the `<!-- <section>:begin -->` and
`<!-- <section>:end -->` markers of the document, so the published figures are always the ones the run
wrote, never typed by hand. `five-games`: the paired differences against SFT and payoff-only (`five-seeds`:
the same, for a second run over more seeds, in a section of its own);
`stability`: safety at the validation-chosen and at the final checkpoint of each game; `pretrained`: a run on a
pretrained model beside the paper's SFT-degradation rows, and the paper's claims about Base, SFT and SEPO on it;
`learned-exploit`: a plan's learned exploitability beside its pool exploit (benchmarks/studies/learned_exploit.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from analysis.paper import SFT_DEGRADATION
from analysis.summary import KEYS
from sepo.files import why_unreadable, write_text_atomically


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


BEGIN, END = markers("five-games")


HEADERS = {
    "delta_j_train_vs_sft": "ΔJ (training λ) vs SFT",
    "delta_safety_vs_payoff_only": "ΔSafety vs payoff-only",
    "delta_exploit_vs_payoff_only": "ΔExploit vs payoff-only",
    "delta_safety_vs_sft": "ΔSafety vs SFT",
    "delta_exploit_vs_sft": "ΔExploit vs SFT",
    "delta_safety_vs_base": "ΔSafety vs Base",
}


def cell(stat: dict, arrows: bool = True) -> str:
    """mean ± SE; with `arrows`, marked where it is more than 2 SE from 0 (for differences)."""
    if stat.get("mean") is None:
        return "--"
    se = stat.get("se")
    held = (
        ""
        if se in (None, 0) or not arrows
        else (" **↑**" if stat["mean"] > 2 * se else " **↓**" if stat["mean"] < -2 * se else "")
    )
    return f"{stat['mean']:+.3f} ± {se:.3f}{held}" if se is not None else f"{stat['mean']:+.3f}"


def table(summary: dict, which: str | None = None) -> str:
    """One column per difference (`HEADERS`) that every game has (a summary.json merged from two runs may have
    some for some games only)."""
    keys = [k for k in KEYS if k in HEADERS and all(k in s for s in summary.values())]
    rows = ["| game | seeds | " + " | ".join(HEADERS[k] for k in keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for game, s in summary.items():
        block = s if which is None else s[which]
        rows.append(f"| {game} | {len(s['seeds'])} | " + " | ".join(cell(block.get(k, {})) for k in keys) + " |")
    return "\n".join(rows)


#: the targets every game is held to (summary key, what it asks): more than 2 SE above 0
TARGETS = {
    "delta_j_train_vs_sft": "SEPO's J (training λ) above SFT's by > 2 SE",
    "delta_safety_vs_payoff_only": "safety above payoff-only's by > 2 SE",
}


def verdict(stat: dict) -> str:
    """`met: +0.071 ± 0.014` or `not met: ... (1.9 SE)`: the target is mean > 2 SE (mean > 0 when SE is 0);
    followed by the per-seed values where summary.json has them, so a reader sees what the mean is made of."""
    mean, se = stat.get("mean"), stat.get("se")
    if mean is None:
        return "--"
    value = cell(stat, arrows=False)
    seeds = stat.get("per_seed") or {}
    spread = (" (seeds " + ", ".join(f"{s}: {v:+.2f}" for s, v in seeds.items()) + ")") if seeds else ""
    if mean > 2 * (se or 0.0):
        return f"**met**: {value}{spread}"
    return f"not met: {value}" + (f" ({mean / se:.1f} SE)" if se else "") + spread


def targets(summary: dict) -> str:
    rows = ["| game | " + " | ".join(TARGETS.values()) + " |", "|---" * (len(TARGETS) + 1) + "|"]
    rows += [f"| {game} | " + " | ".join(verdict(s[k]) for k in TARGETS) + " |" for game, s in summary.items()]
    return "\n".join(rows)


def section(
    summary: dict, source: str, name: str = "five-games", heading: str = "## The five games on the tiny model\n\n"
) -> str:
    begin, end = markers(name)
    return (
        f"{begin}\n{heading}From `{source}` (`python -m analysis.report --section {name}`): mean ± SE over "
        "SEPO seeds of the paired differences, each run at its best checkpoint chosen on validation episodes and "
        "reported on the test episodes; **↑**/**↓**: more than 2 SE from 0.\n\n"
        + table(summary)
        + "\n\nThe targets, at those checkpoints:\n\n"
        + targets(summary)
        + "\n\nAt the runs' final checkpoints (a gap to the table above is drift late in training):\n\n"
        + table(summary, "final")
        + f"\n{end}"
    )


def stability_section(summary: dict, source: str) -> str:
    begin, end = markers("stability")
    rows = [
        "| game | seeds | safety, chosen checkpoint | safety, final | final − chosen (paired) | final holds |",
        "|---|---|---|---|---|---|",
    ]
    for game, s in summary.items():
        st = s["stability"]
        rows.append(
            f"| {game} | {len(s['seeds'])} | {cell(st['chosen_safety'], False)} | {cell(st['final_safety'], False)} | "
            f"{cell(st['final_minus_chosen'])} | {'yes' if st['final_holds_chosen'] else 'no'} |"
        )
    return (
        f"{begin}\nFrom `{source}` (`python -m analysis.report --section stability`): SEPO's safety at each run's "
        "checkpoint chosen on validation episodes and at its final checkpoint, both on the test episodes (mean ± SE "
        "over seeds); the final holds when final − chosen is not below −1 SE.\n\n" + "\n".join(rows) + f"\n{end}"
    )


def plain(value: float | None) -> str:
    return "--" if value is None else f"{value:.3f}"


def degradation_rows(game: str, s: dict, model: str) -> list[str]:
    """The paper's two rows for `game`, then this run's: exploit at Base, SFT and SEPO (lower is better)."""
    rows = [
        f"| {game} | {name} (paper) | {plain(base)} | {plain(sft)} | {plain(sepo)} | {sft - base:+.3f} | "
        f"{sepo - base:+.3f} |"
        for name, (base, sft, sepo) in SFT_DEGRADATION.get(game, {}).items()
    ]
    levels = s.get("levels", {})
    if "base" in levels:
        exploit = {arm: levels[arm]["exploit"] for arm in ("base", "sft", "sepo")}
        runs = f"{len(s['seeds'])} seeds" if s["seeds"] else f"SFT over {levels['sft']['models']} seeds, no SEPO run"
        rows.append(
            f"| {game} | **{model}** ({runs}) | {cell(exploit['base'], False)} | "
            f"{cell(exploit['sft'], False)} | {cell(exploit['sepo'], False)} | "
            f"{cell(s.get('delta_exploit_sft_vs_base', {}))} | {cell(sepo_minus_base_exploit(s))} |"
        )
    return rows


def quadrature(*ses: float) -> float:
    """The SE of a sum or difference of independent estimates."""
    return sum(se * se for se in ses) ** 0.5


def sepo_minus_base_exploit(s: dict) -> dict:
    """SEPO - Base exploit: SEPO's mean over seeds minus Base's one model, SE from both (Base's over episodes)."""
    sepo, base = s["levels"]["sepo"]["exploit"], s["levels"]["base"]["exploit"]
    if sepo.get("mean") is None:
        return {}
    ses = [x for x in (sepo.get("se"), base.get("se")) if x is not None]
    return {"mean": sepo["mean"] - base["mean"], "se": quadrature(*ses) if ses else None}


#: the paper's claims about a pretrained model: the summary key that tests each, its claimed direction, and the
#: one-model arm the difference is taken against, if any (Base or SFT: one model, one measurement)
CLAIMS = {
    "delta_exploit_sft_vs_base": ("SFT raises exploit over Base", 1, None),  # its SE is from both arms' episodes
    "delta_exploit_vs_sft": ("SEPO lowers exploit below SFT's", -1, ("sft", "exploit")),
    "delta_safety_vs_base": ("SEPO's safety above Base's", 1, ("base", "safety")),
    "delta_safety_vs_payoff_only": ("SEPO's safety above payoff-only's", 1, None),  # both arms have seeds
    "delta_exploit_vs_payoff_only": ("SEPO's exploit below payoff-only's", -1, None),
}


def claim_stat(s: dict, key: str, reference: tuple[str, str] | None) -> dict:
    """A claim's difference with the SE it must be judged by. Every seed's difference against a one-model arm
    shares that arm's single measurement, so the SE over seeds does not see its error: it is added in
    quadrature (conservative: the arms are read on the same episodes and sampling streams, whose positive
    correlation would shrink it). SFT trained once per seed (`models` > 1) is no one-model arm: each seed is
    compared with its own SFT model, so the SE over seeds holds SFT's error already."""
    stat = dict(s.get(key, {}))
    level = s.get("levels", {}).get(reference[0], {}).get(reference[1], {}) if reference else {}
    one_model = s.get("levels", {}).get(reference[0], {}).get("models", 1) == 1 if reference else False
    if one_model and stat.get("se") is not None and level.get("se") is not None:
        stat["se"] = quadrature(stat["se"], level["se"])
    return stat


def holds(stat: dict, sign: int) -> str:
    """`holds` where the difference is more than 2 SE on the claimed side, `opposite` beyond 2 SE on the other;
    one run (no SE) tests nothing, and neither does one SFT model: its SE is over its evaluation's episodes
    (`se_from: episodes`), while a second SFT draw of the same data can land far outside it (Kuhn on smollm2:
    0.250 and 0.368 at sft.seed 0 and 1)."""
    mean, se = stat.get("mean"), stat.get("se")
    if mean is None:
        return "--"
    value = cell(stat, arrows=False)
    if stat.get("se_from") == "episodes":
        return f"untested (one SFT model; SE over its episodes, not over SFT seeds): {value}"
    if se:
        if sign * mean > 2 * se:
            return f"**holds**: {value}"
        if sign * mean < -2 * se:
            return f"opposite: {value}"
        return f"within noise: {value} ({mean / se:+.1f} SE)"
    return f"untested (one run, no SE): {value}"  # a single difference cannot show that a claim holds


def pretrained_section(summary: dict, source: str, model: str = "smollm2", name: str = "pretrained") -> str:
    begin, end = markers(name)
    header = "| game | model | Base | SFT | SEPO | SFT − Base | SEPO − Base |\n|---|---|---|---|---|---|---|"
    degradation = [row for game, s in summary.items() for row in degradation_rows(game, s, model)]
    tested = {key: claim for key, claim in CLAIMS.items() if any(key in s for s in summary.values())}
    claims = ["| game | " + " | ".join(text for text, *_ in tested.values()) + " |", "|---" * (len(tested) + 1) + "|"]
    claims += [
        f"| {game} | "
        + " | ".join(holds(claim_stat(s, key, reference), sign) for key, (_, sign, reference) in tested.items())
        + " |"
        for game, s in summary.items()
    ]
    return (
        f"{begin}\nFrom `{source}` (`python -m analysis.report --section {name}`). Exploit (Kuhn: the exact "
        "exploitability as played) at Base, SFT and SEPO, lower is better: the paper's rows (its SFT-degradation "
        f"table) and {model}'s, SEPO at each seed's checkpoint chosen on validation episodes, mean ± SE over seeds; "
        "Base is one model, with its SE over episodes; SFT one model per SFT seed where it was trained per seed "
        "(SE over those models), else one model (SE over episodes).\n\n"
        + header
        + "\n"
        + "\n".join(degradation)
        + f"\n\nThe paper's claims on {model} (differences paired by seed; against a one-model arm, Base or an SFT "
        "trained once, the SE adds that model's own SE over episodes; holds: more than 2 SE on the claimed side):\n\n"
        + "\n".join(claims)
        + f"\n{end}"
    )


def learned_exploit_section(study: dict, source: str) -> str:
    """A paper plan's learned exploitability beside its pool exploit (benchmarks/studies/learned_exploit.py
    --plan): per game and arm, mean ± SE over seeds; then SEPO − payoff-only and SEPO − SFT, paired by seed."""
    begin, end = markers("learned-exploit")
    arms = [
        "| game | arm | seeds | pool exploit ↓ | pool's best ↓ | learned exploit ↓ | exploiter parses |",
        "|---|---|---|---|---|---|---|",
    ]
    pairs = ["| game | difference | pool exploit | pool's best | learned exploit |", "|---|---|---|---|---|"]
    for game, g in study["games"].items():
        for arm, a in g["arms"].items():
            parses = [r["exploiter_parse_rate"] for r in a["runs"] if r.get("exploiter_parse_rate") is not None]
            arms.append(
                f"| {game} | {arm} | {a['n']} | {cell(a['pool_exploit'], False)} | {cell(a['pool_exploit_max'], False)} | "
                f"{cell(a['learned_exploit'], False)} | {plain(min(parses) if parses else None)} (least) |"
            )
        for name, d in g["paired"].items():
            pairs.append(
                f"| {game} | {name} | {cell(d['pool_exploit'])} | {cell(d['pool_exploit_max'])} | "
                f"{cell(d['learned_exploit'])} |"
            )
    return (
        f"{begin}\nFrom `{source}` (`python -m analysis.report --section learned-exploit`): each victim's pool "
        "exploit (its game's exploit pool on the plan's test episodes: averaged over the pool's strategies, and the "
        "best of them) and its learned exploit (a fresh exploiter trained against it, on held-out episodes), mean ± "
        "SE over seeds; the SEPO and payoff-only victims at their final checkpoints.\n\n"
        + "\n".join(arms)
        + "\n\nPaired by seed (**↑**/**↓**: more than 2 SE from 0):\n\n"
        + "\n".join(pairs)
        + f"\n{end}"
    )


SECTIONS = {
    "five-games": section,
    # the same tables for a run over more seeds, placed below the main ones without a heading of its own
    "five-seeds": partial(section, name="five-seeds", heading=""),
    "stability": stability_section,
    "pretrained": pretrained_section,
    "learned-exploit": learned_exploit_section,
    # the same tables for the held-out seeds of one game's pipeline (docs/smollm2_<game>_heldout_summary.json;
    # ipd-z1: IPD's at held_level_z=1, docs/smollm2_ipd_z1_heldout_summary.json; ipd-tr01: with the trust region
    # at 0.1 as well, docs/smollm2_ipd_tr01_heldout_summary.json)
    **{
        f"{study}-heldout": partial(pretrained_section, name=f"{study}-heldout")
        for study in ("kuhn", "ipd", "ipd-z1", "ipd-tr01")
    },
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path)
    parser.add_argument("--doc", type=Path, default=Path("docs/results.md"))
    parser.add_argument("--section", choices=list(SECTIONS), default="five-games")
    args = parser.parse_args(argv)
    for path in (args.summary, args.doc):
        if not path.is_file():
            print(f"error: {path} does not exist", file=sys.stderr)
            return 2
    try:
        summary = json.loads(args.summary.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        print(
            f"error: {args.summary} is not allowed: {why_unreadable(err)}; allowed: a summary.json of analysis.summary",
            file=sys.stderr,
        )
        return 2
    text = args.doc.read_text()
    begin, end = markers(args.section)
    if begin not in text or end not in text:
        print(f"error: {args.doc} has no {begin} ... {end} markers to fill", file=sys.stderr)
        return 2
    head, rest = text.split(begin, 1)
    write_text_atomically(args.doc, head + SECTIONS[args.section](summary, str(args.summary)) + rest.split(end, 1)[1])
    print(f"wrote the {args.section} table of {args.summary} into {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
