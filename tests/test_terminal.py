"""The main job's terminal table: every digit readable in 100 columns, and SEPO's change from SFT."""

from __future__ import annotations

import io

from rich.console import Console

from analysis.collect import make_row, to_frame
from analysis.terminal import WIDTH, summary_table

METRICS = {
    "pay": -1.234,
    "exploit": 0.5,
    "exploit_max": 1.0,
    "collusion": 0.25,
    "ext": 0.125,
    "robust": 0.1,
    "safety": -12.345,
    "nra": 0.05,
    "parse_rate": 1.0,
    "exploit_exact": 0.104,
}


def frame(game: str):
    rows = []
    for phase, ckpt, step, shift in (
        ("base", "base", 0, 0.0),
        ("sft", "final", None, 1.0),
        ("sepo", "step_40", 40, 2.0),
        ("sepo", "final", 80, 3.5),
    ):
        metrics = {k: v + shift for k, v in METRICS.items() if game == "kuhn" or k != "exploit_exact"}
        rows.append(
            make_row(
                {"game": game, "model": "tiny", "stage": phase, "checkpoint": ckpt, "step": step},
                metrics,
                {k: 0.1234 for k in metrics},
            )
        )
    return to_frame(rows)


def rendered(game: str) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=WIDTH).print(summary_table(frame(game), "a title that is long " * 3))
    return out.getvalue().splitlines()


def test_every_value_fits_in_100_columns_uncut():
    for game in ("ipd", "kuhn"):
        lines = rendered(game)
        assert max(len(line) for line in lines) <= WIDTH
        assert not any("…" in line for line in lines)
        text = "\n".join(lines)
        assert "-12.345" in text
        assert "±0.123" in text
        assert "SEPO step 40" in text
        assert ("exact" in text) == (game == "kuhn")


def test_the_last_row_is_sepo_final_minus_sft_with_the_se_of_a_difference():
    lines = rendered("kuhn")
    delta = [line for line in lines if "Δ SEPO−SFT" in line][0]
    assert delta.count("+2.500") == len(METRICS) - 2  # every metric shown (exploit_max, robust are not) moved +2.5
    se_line = lines[lines.index(delta) + 1]
    assert se_line.count(f"±{(2 * 0.1234**2) ** 0.5:.3f}") == len(METRICS) - 2
