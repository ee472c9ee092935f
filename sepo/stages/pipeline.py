"""Stage `pipeline` (the main job): base eval -> SFT -> SEPO -> tables, in one run dir.

Each phase runs the same code as its own stage, in a sub-directory of the run dir, and marks it
`DONE` when finished, so a crashed pipeline re-run with `resume=auto` skips finished phases and
resumes SEPO from its latest checkpoint:

    <run>/base/eval/base/results.json     the model before any training (stage "base")
    <run>/sft/                            SFT outputs; <run>/sft/eval/sft/results.json
    <run>/sepo/                           SEPO from <run>/sft/merged; <run>/sepo/eval/step_<k>/results.json
    <run>/tables/                         LaTeX tables, CSV and figures (`tables_hook`: analysis.tables)

The SFT data is generated on demand by the SFT phase (cached under `sft.data_dir`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sepo import distributed
from sepo.files import write_text_atomically
from sepo.games import make_game
from sepo.heap import release_freed_memory, resident_mib
from sepo.stages.evaluate import build_policy, evaluate_and_write
from sepo.tracking import NO_TRACKING, NullTracker

log = logging.getLogger(__name__)

#: what the finished pipeline hands its run dir to for its tables, on rank 0 (returning the files it wrote): the
#: run layer sets it (`sepo.run.task.write_tables`: analysis.tables and the terminal's summary), so the stage
#: needs none of the analysis that reads run dirs, and a pipeline run as a library call writes none
tables_hook: Callable[[Path], list[str]] | None = None


def phase_cfg(cfg: DictConfig, out: Path, **updates: Any) -> DictConfig:
    """A copy of `cfg` writing into `out`, with dotted-key `updates` applied; resolved, and typed by the same
    schemas, so a phase reads its settings as the run does."""
    sub = copy.deepcopy(cfg)
    OmegaConf.resolve(sub)
    sub.paths.output_dir = str(out)
    for key, value in updates.items():
        OmegaConf.update(sub, key, value, merge=False)
    return sub


def run_phase(name: str, out: Path, fn, *args, main_only: bool = False) -> None:
    """Run one phase unless its DONE marker exists. Data parallel, every process runs the training
    phases and rank 0 alone a `main_only` one (an evaluation) and the marker."""
    if (out / "DONE").exists():
        log.info("pipeline: %s already done (%s)", name, out)
        return
    out.mkdir(parents=True, exist_ok=True)
    log.info("pipeline: %s -> %s", name, out)
    if distributed.is_main() or not main_only:
        fn(*args)
    hand_back_freed_memory(name)
    distributed.barrier()
    if distributed.is_main():
        write_text_atomically(out / "DONE", name + "\n")


def hand_back_freed_memory(phase: str) -> None:
    """The next phase starts from what is still in use, not from this one's peak (`sepo.heap`): without it
    the next phase (on smollm2: SEPO after SFT) would run on top of the memory the last one's passes freed but
    the allocator kept."""
    before = resident_mib()
    release_freed_memory()
    if before is not None:
        log.info("pipeline: after %s, resident memory %.0f -> %.0f MiB", phase, before, resident_mib())


def base_eval(cfg: DictConfig) -> None:
    game = make_game(cfg.game)
    path = Path(cfg.paths.output_dir) / "eval" / "base" / "results.json"
    evaluate_and_write(cfg, game, build_policy(cfg, game), path, stage="base", checkpoint="base", step=0)


def run_pipeline(cfg: DictConfig, tracker: NullTracker = NO_TRACKING) -> dict[str, Any]:
    from sepo.stages.sepo_loop import run_sepo
    from sepo.stages.sft import run_sft

    out = Path(cfg.paths.output_dir)
    base = phase_cfg(cfg, out / "base")
    run_phase("base eval", out / "base", base_eval, base, main_only=True)

    sft = phase_cfg(cfg, out / "sft")
    run_phase("sft", out / "sft", run_sft, sft, tracker)

    sepo = phase_cfg(cfg, out / "sepo", **{"model.path": str(out / "sft" / "merged"), "model.revision": None})
    run_phase("sepo", out / "sepo", run_sepo, sepo, tracker)
    if not distributed.is_main():
        return {}
    return {"run_dir": str(out), "tables": tables_hook(out) if tables_hook is not None else []}
