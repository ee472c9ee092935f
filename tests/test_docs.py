"""The docs a newcomer follows: every `docs/<file>.md §N` the code cites exists, the five-game
table of docs/results.md is generated from summary.json, and every config field says what it is."""

from __future__ import annotations

import json
import re
from pathlib import Path

from analysis import report

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"docs/(\w+)\.md(?: §(\d+(?:\.\d+)?))?")
#: a mapping key of a YAML line: its indentation, the key, the rest of the line
YAML_KEY = re.compile(r"^(\s*)([A-Za-z_][\w.@/-]*|'[^']*'|\"[^\"]*\")\s*:(.*)$")


def sources() -> list[Path]:
    tracked = [*ROOT.glob("*.md"), *ROOT.glob("*.py"), *(ROOT / "docs").glob("*.md")]
    for folder in ("sepo", "analysis", "benchmarks", "launch", "conf", "tests"):
        tracked += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml", ".md", ".sh")]
    return tracked


def test_every_cited_doc_and_section_exists():
    cited = {(m.group(1), m.group(2)) for p in sources() for m in CITATION.finditer(p.read_text(errors="replace"))}
    assert ("spec", "4.2") in cited  # the estimator's section is cited from the code
    for name, section in cited:
        doc = ROOT / "docs" / f"{name}.md"
        assert doc.exists(), name
        if section:
            assert re.search(rf"^#+ {re.escape(section)}\.? ", doc.read_text(), re.M), f"docs/{name}.md §{section}"
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150  # the manual, not the evidence


def test_the_five_game_table_is_written_from_summary_json(tmp_path):
    stat = {"mean": 0.5, "se": 0.1, "n": 3}
    block = {k: stat for k in report.KEYS} | {"delta_exploit_vs_sft": {"mean": -0.05, "se": 0.04, "n": 3}}
    (tmp_path / "summary.json").write_text(json.dumps({"ipd": {**block, "seeds": [0, 1, 2], "final": block}}))
    doc = tmp_path / "results.md"
    doc.write_text(f"# Results\n\nbefore\n{report.BEGIN}\nstale\n{report.END}\nafter\n")
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "stale" not in text
    assert text.startswith("# Results\n\nbefore\n")
    assert text.endswith("after\n")
    row = next(line for line in text.splitlines() if line.startswith("| ipd |"))
    assert row.count("+0.500 ± 0.100 **↑**") == len(report.HEADERS) - 1  # a ratio is no column
    assert "-0.050 ± 0.040 |" in row  # < 2 SE: no arrow
    older = {k: stat for k in report.KEYS if k != "delta_safety_vs_base"}  # a summary.json of older code
    (tmp_path / "summary.json").write_text(json.dumps({"ipd": {**older, "seeds": [0, 1, 2], "final": older}}))
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(doc)]) == 0
    assert "vs Base" not in doc.read_text()  # no column of '--' for a key it never had
    assert "| ipd | **met**: +0.500 ± 0.100 | **met**: +0.500 ± 0.100 |" in text  # the targets, with their values
    assert report.verdict({"mean": 0.3, "se": 0.158}) == "not met: +0.300 ± 0.158 (1.9 SE)"
    # a paper's claim: more than 2 SE on its side holds; one run, without an SE, tests nothing whatever its sign
    assert report.holds({"mean": 0.3, "se": 0.1}, +1) == "**holds**: +0.300 ± 0.100"
    assert report.holds({"mean": 0.3, "se": 0.1}, -1) == "opposite: +0.300 ± 0.100"
    assert report.holds({"mean": 1.05, "se": None}, +1) == "untested (one run, no SE): +1.050"
    one_sft = {"mean": -2.0, "se": 0.3, "n": 1, "se_from": "episodes"}  # far beyond 2 SE, but one SFT draw
    assert report.holds(one_sft, +1).startswith("untested (one SFT model")
    assert report.verdict({"mean": 0.0, "se": 0.0}) == "not met: +0.000 ± 0.000"
    with_seeds = {"mean": 2.9, "se": 1.7, "per_seed": {"3": 6.11, "4": -0.46, "5": 5.07}}
    assert report.verdict(with_seeds) == "not met: +2.900 ± 1.700 (1.7 SE) (seeds 3: +6.11, 4: -0.46, 5: +5.07)"
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(tmp_path / "missing.md")]) == 2  # no traceback
    begin, end = report.markers("five-seeds")  # a second run's tables, in a section of their own
    doc.write_text(f"{report.BEGIN}\nmain\n{report.END}\n{begin}\nstale\n{end}\n")
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(doc), "--section", "five-seeds"]) == 0
    text = doc.read_text()
    assert "\nmain\n" in text
    assert "stale" not in text
    assert "| ipd | 3 |" in text.split(begin)[1]
    assert "## " not in text.split(begin)[1]  # no heading of its own


def test_the_stability_table_is_written_from_summary_json(tmp_path):
    def stat(mean, se):
        return {"mean": mean, "se": se, "n": 3}

    held = {"chosen_safety": stat(1.6, 0.04), "final_safety": stat(1.66, 0.05)}
    summary = {
        "ipd": {
            "seeds": [0, 1, 2],
            "stability": {**held, "final_minus_chosen": stat(0.04, 0.04), "final_holds_chosen": True},
        },
        "kuhn": {
            "seeds": [0, 1, 2],
            "stability": {**held, "final_minus_chosen": stat(-0.3, 0.1), "final_holds_chosen": False},
        },
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    doc = tmp_path / "results.md"
    begin, end = report.markers("stability")
    doc.write_text(f"# Results\n{report.BEGIN}\nfive\n{report.END}\n{begin}\nstale\n{end}\nafter\n")
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(doc), "--section", "stability"]) == 0
    text = doc.read_text()
    assert "stale" not in text
    assert "five" in text
    assert text.endswith("after\n")  # only its own section changes
    rows = [line for line in text.splitlines() if line.startswith(("| ipd |", "| kuhn |"))]
    assert rows[0].endswith("| +0.040 ± 0.040 | yes |")
    assert rows[1].endswith("| -0.300 ± 0.100 **↓** | no |")


def test_the_pretrained_tables_set_a_run_beside_the_papers_rows_and_judge_each_claim(tmp_path):
    def stat(mean, se, n=3):
        return {"mean": mean, "se": se, "n": n}

    kuhn = {
        "seeds": [0, 1, 2],
        "levels": {
            "base": {"exploit": {"mean": 0.336, "se": 0.010}, "safety": {"mean": -0.5, "se": 0.1}},
            "sft": {"exploit": {"mean": 0.380, "se": 0.050}, "safety": {"mean": -0.6, "se": 0.1}},
            "sepo": {"exploit": stat(0.300, 0.020), "safety": stat(-0.2, 0.05)},
        },
        "delta_exploit_sft_vs_base": {"mean": 0.044, "se": 0.051, "n": 1, "se_from": "episodes"},
        "delta_exploit_vs_sft": stat(-0.080, 0.020),
        "delta_safety_vs_base": stat(0.3, 0.05),
        "delta_safety_vs_payoff_only": stat(-0.4, 0.1),
    }
    (tmp_path / "summary.json").write_text(json.dumps({"kuhn": kuhn}))
    doc = tmp_path / "results.md"
    begin, end = report.markers("pretrained")
    doc.write_text(f"# Results\n{begin}\nstale\n{end}\nafter\n")
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(doc), "--section", "pretrained"]) == 0
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| kuhn |")]
    # the paper's two rows (Gemma 4: 0.211 -> 0.000 -> 0.000), then the run's with SEPO - Base from both SEs
    assert rows[0] == "| kuhn | Gemma 4 (paper) | 0.211 | 0.000 | 0.000 | -0.211 | -0.211 |"
    assert rows[2].startswith("| kuhn | **smollm2** (3 seeds) | +0.336 ± 0.010 | +0.380 ± 0.050 | +0.300 ± 0.020 |")
    assert rows[2].endswith("| +0.044 ± 0.051 | -0.036 ± 0.022 |")  # SE sqrt(0.02^2 + 0.01^2): 1.6 SE, no arrow
    claims = rows[3].split(" | ")
    # SFT raises exploit: one SFT model's difference, whose SE is over episodes, tests nothing over SFT draws
    assert claims[1] == "untested (one SFT model; SE over its episodes, not over SFT seeds): +0.044 ± 0.051"
    # SEPO lowers exploit below SFT's: -0.080 over seeds, but every seed is set against one SFT read of SE 0.050
    assert claims[2] == "within noise: -0.080 ± 0.054 (-1.5 SE)"  # sqrt(0.020^2 + 0.050^2)
    assert claims[3] == "**holds**: +0.300 ± 0.112"  # sqrt(0.05^2 + Base's 0.1^2)
    assert claims[4].startswith("opposite: -0.400 ± 0.100")

    # SFT trained once per seed: each seed against its own SFT model, so the SE over seeds stands alone
    kuhn["levels"]["sft"]["models"] = 3
    kuhn["delta_exploit_sft_vs_base"] = {"mean": 0.044, "se": 0.020, "n": 3, "se_from": "runs"}
    (tmp_path / "summary.json").write_text(json.dumps({"kuhn": kuhn}))
    assert report.main([str(tmp_path / "summary.json"), "--doc", str(doc), "--section", "pretrained"]) == 0
    claims = [line for line in doc.read_text().splitlines() if line.startswith("| kuhn |")][3].split(" | ")
    assert claims[1] == "**holds**: +0.044 ± 0.020"
    assert claims[2] == "**holds**: -0.080 ± 0.020"
    assert claims[3] == "**holds**: +0.300 ± 0.112"  # Base is one model still


def undocumented_fields(path: Path, root: Path = ROOT) -> list[str]:
    """Keys of a config file that carry no comment. A key is documented by a comment on its line or
    on the line just above; a scalar row of a documented table (a strategy's weight under
    `demonstrators:  # ...`, whose siblings are all scalars too) is documented by the table's."""
    lines = path.read_text().splitlines()
    keys = []  # [line, indent, documented, scalar]
    for i, line in enumerate(lines):
        match = YAML_KEY.match(line)
        if match:
            rest = match.group(3)
            commented = "#" in rest or (i > 0 and lines[i - 1].strip().startswith("#"))
            keys.append((i, len(match.group(1)), commented, rest.split("#")[0].strip() != ""))
    missing = []
    for n, (i, indent, commented, scalar) in enumerate(keys):
        parent = next((k for k in reversed(keys[:n]) if k[1] < indent), None)
        end = next((k[0] for k in keys[n:] if k[1] < indent), len(lines)) if parent else 0
        siblings = [k for k in keys if parent and parent[0] < k[0] < end and k[1] == indent]
        in_table = parent is not None and parent[2] and scalar and all(k[3] for k in siblings)
        if not (commented or in_table):
            missing.append(f"{path.relative_to(root)}:{i + 1}: {lines[i].strip()}")
    return missing


def test_every_config_field_carries_a_comment():
    """As verl checks its config docs: a researcher reading conf/ learns what each field does there."""
    missing = [line for path in sorted((ROOT / "conf").rglob("*.yaml")) for line in undocumented_fields(path)]
    assert not missing, "config fields without a comment:\n" + "\n".join(missing)


def test_the_comment_check_finds_a_bare_field(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "x.yaml").write_text(
        "a: 1  # documented\n# the table\nt:\n  r1: 0.5\n  r2: 0.5\nbare: 2\nnest:  # a block\n  inner:\n    leaf: 1  # ok\n"
    )
    found = [line.split(": ", 1)[1] for line in undocumented_fields(conf / "x.yaml", tmp_path)]
    assert found == ["bare: 2", "inner:"]


def test_the_published_tables_are_the_ones_their_summary_files_give(tmp_path):
    """Every generated section of docs/results.md, rendered again from the summary.json it names, is
    unchanged: a figure typed by hand, or a summary file changed without re-rendering, fails here."""
    doc = ROOT / "docs" / "results.md"
    text = doc.read_text()
    for name in report.SECTIONS:
        begin, end = report.markers(name)
        if begin not in text:
            continue
        published = text.split(begin, 1)[1].split(end, 1)[0]
        source = re.search(r"From `([^`]+)`", published).group(1)
        copy = tmp_path / f"{name}.md"
        copy.write_text(text)
        assert report.main([str(ROOT / source), "--doc", str(copy), "--section", name]) == 0
        assert copy.read_text().replace(str(ROOT / source), source) == text, f"{name} is not what {source} gives"


#: the manuals whose `python main.py` lines a user copies (adding_a_game.md's name a game the reader adds first)
MANUALS = (
    "README.md",
    "docs/getting_started.md",
    "docs/configuration.md",
    "docs/running_the_paper.md",
    "docs/learned_exploitability.md",
)


def documented_runs() -> list[list[str]]:
    """Each `python main.py ...` (or `torchrun ... main.py ...`) line of the manuals' code blocks, as overrides:
    a sweep's first value of each list, without the `hydra.` keys, which only a launched run has."""
    runs = []
    for manual in MANUALS:
        for line in (ROOT / manual).read_text().splitlines():
            command = re.sub(r"<(\w+) run>", r"/runs/\1", line.split("#")[0]).split()  # the reader's own runs
            if not command or command[0] not in ("python", "torchrun") or "main.py" not in command:
                continue
            args = [a for a in command[command.index("main.py") + 1 :] if a != "-m" and not a.startswith("hydra.")]
            runs.append([a.split(",")[0] if "=" in a and not a.startswith("+") else a for a in args])
    return runs


def test_every_documented_run_composes_and_passes_the_checks():
    """What the manuals tell a user to type is a run the config accepts: composed as `main.py` composes it and
    through the checks a run makes before any work (paths and weights aside: `/ckpt/merged` is the reader's)."""
    from sepo.run.compose import compose_config
    from sepo.run.config import check_settings

    runs = documented_runs()
    assert [] in runs and ["game=kuhn"] in runs and len(runs) >= 10  # the main job and the rest were found
    for overrides in runs:
        cfg = compose_config(overrides)
        check_settings(cfg, overrides)
