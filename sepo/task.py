"""Task wrapper around one stage: skip finished runs, print the config, mark DONE or FAILED.

A run directory ends with `DONE` (the stage finished; its results are complete) or `FAILED`
(holding the error), so a re-launched sweep skips finished jobs and analysis can tell a failed
cell from a missing one. The tracker is always finished, even when the stage raises.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from sepo import distributed, reuse, tracking
from sepo.config import validate
from sepo.errors import ConfigError
from sepo.stages import get_stage
from sepo.sweep import record_status
from sepo.threads import share_cores

log = logging.getLogger(__name__)

DATA_PARALLEL_STAGES = ("sft", "sepo", "pipeline")


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) or SIGTERM (what SLURM sends before preempting a job) arrived: the run stops, is
    marked FAILED, closes its tracker, and a re-run resumes it. A BaseException, like KeyboardInterrupt,
    so that no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible():
    """SIGINT and SIGTERM raise `Interrupted` inside the stage (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # not under Hydra (tests calling run_task directly)
        return False


#: what a run dir holds when the run was rejected before any work (Hydra's record and log, our markers)
UNTOUCHED = {".hydra", "FAILED", "launch_status.json"}


def _remove_if_untouched(out: Path) -> None:
    """Remove the run dir Hydra made for a command line that was then rejected, and its empty parents
    (never a dir holding anything a run wrote: results, checkpoints, DONE)."""
    if not out.is_dir() or any(p.name not in UNTOUCHED and p.suffix != ".log" for p in out.iterdir()):
        return
    shutil.rmtree(out)
    for parent in out.parents:
        if parent.name in ("runs", "outputs") or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()


def _skip_finished(out: Path, cfg: DictConfig) -> None:
    """A finished run is skipped when it ran with these settings, refused (one line) when it did not;
    either way it keeps its results, its DONE and its own .hydra record."""
    differing = reuse.differences(out, cfg)
    reuse.restore_hydra_record(out)
    if differing:
        message = (
            f"{out} finished with other settings: {'; '.join(differing[:5])}"
            + (f" (and {len(differing) - 5} more)" if len(differing) > 5 else "")
            + "; allowed: the same settings, another run dir (hydra.run.dir=...), or resume=never to rerun it"
        )
        record_status(out, "failed", message)
        print(f"error: {message}", file=sys.stderr)
        if _multirun():
            return None
        sys.exit(2)
    log.info(
        "skipping %s: DONE marker present (resume=auto)%s",
        out,
        "" if differing is not None else "; it saved no settings to compare (finished before they were saved)",
    )
    record_status(out, "skipped")
    return None


def run_task(cfg: DictConfig) -> dict | None:
    with interruptible():
        return _run_task(cfg)


def _reject(out: Path, err: ConfigError) -> None:
    """One line for a bad value. Alone it leaves no run dir (no work was done) and exits 2; in a sweep
    the job is marked FAILED (unless it is a finished run, which keeps its results) and the sweep goes on."""
    print(f"error: {err}", file=sys.stderr)
    if not _multirun():
        _remove_if_untouched(out)
        sys.exit(2)
    if not (out / "DONE").exists():
        (out / "FAILED").write_text(f"ConfigError: {err}\n")
    record_status(out, "failed", str(err))


def _run_task(cfg: DictConfig) -> dict | None:
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        validate(cfg)  # every value before any work, and before a finished run is reused
    except ConfigError as err:
        return _reject(out, err)
    if cfg.resume == "auto" and (out / "DONE").exists():
        return _skip_finished(out, cfg)
    (out / "FAILED").unlink(missing_ok=True)
    log.info("%s", share_cores())  # before any torch work: parallel jobs must not fight over the cores

    tracker = None
    started = time.time()
    try:
        distributed.init()  # under torchrun: one process per device; rank 0 alone writes markers and logs
        main = distributed.is_main()
        if not main:  # one log: the other processes report warnings and errors only
            logging.getLogger().setLevel(logging.WARNING)
        if main:
            log.info("resolved config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
        stage = get_stage(cfg.stage.name)
        tracker = tracking.start(cfg) if main else tracking.NullTracker()
        # sft, sepo and pipeline train data parallel; under torchrun the other stages run on rank 0 alone
        result = stage(cfg, tracker) if main or cfg.stage.name in DATA_PARALLEL_STAGES else None
        distributed.barrier()
        if main:
            reuse.save_finished(out, cfg)  # what a later launch of this dir must match to be skipped
            (out / "DONE").write_text(
                json.dumps(
                    {
                        "stage": cfg.stage.name,
                        "seconds": round(time.time() - started, 2),
                        "processes": distributed.world_size(),
                    }
                )
                + "\n"
            )
            record_status(out, "done")
        return result
    except Interrupted as err:  # one line, a FAILED marker that says so, and the conventional 128 + signal
        (out / "FAILED").write_text(f"interrupted by {err}; re-run the same command to resume\n")
        record_status(out, "failed", f"interrupted by {err}")
        print(
            f"error: interrupted by {err}; {out} is marked FAILED, re-run the same command to resume", file=sys.stderr
        )
        sys.exit(128 + err.signum)
    except ConfigError as err:  # a stage's own check
        return _reject(out, err)
    except Exception as err:  # keep the sweep going; the marker holds the traceback
        (out / "FAILED").write_text(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
        record_status(out, "failed", f"{type(err).__name__}: {err}")
        if _multirun():
            log.error("job failed (%s): %s; see %s", type(err).__name__, err, out / "FAILED")
            return None
        raise
    finally:
        if tracker is not None:
            tracker.finish()
