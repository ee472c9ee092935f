"""The main job's tables, which the pipeline hands its finished run dir to (`sepo.stages.pipeline.tables_hook`)."""

from __future__ import annotations

from pathlib import Path


def write_tables(out: Path) -> list[str]:
    """The main job's tables (analysis.tables: LaTeX, CSV, figures) into `<run>/tables`, and its closing table
    in the terminal; the pipeline calls it when its last phase is done (`pipeline.tables_hook`)."""
    from analysis.tables import main as tables_main
    from analysis.terminal import print_summary

    tables_main([str(out), "--out", str(out / "tables")])
    print_summary(out)
    return [str(t) for t in sorted((out / "tables").glob("table_*.tex"))]
