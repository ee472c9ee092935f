"""Task wrapper around one stage: skip finished runs, print the config, mark DONE or FAILED.

A run directory ends with `DONE` (the stage finished; its results are complete) or `FAILED`
(holding the error), so a re-launched sweep skips finished jobs and analysis can tell a failed
cell from a missing one. The tracker is always finished, even when the stage raises.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
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

from sepo import distributed, reuse, run_lock, tracking
from sepo.errors import ConfigError, OutOfMemory, RunError, one_line
from sepo.files import write_text_atomically
from sepo.run import snapshot, sweep
from sepo.run.compose import shipped_settings
from sepo.run.config import validate
from sepo.run.sweep import record_status
from sepo.run.tables import write_tables
from sepo.run.threads import share_cores
from sepo.stages import get_stage, pipeline

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
    """Whether this run is a job of a sweep: Hydra's multirun mode, or a job the project's process launcher
    started as a command of its own (hydra_plugins/sepo_launcher)."""
    if os.environ.get("SEPO_SWEEP_JOB") == "1":
        return True
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # not under Hydra (tests calling run_task directly)
        return False


#: what a launch may remove from a run dir it was refused: Hydra's record and log of this launch, its markers
REFUSAL_LEFTOVERS = {".hydra", "FAILED", "launch_status.json", run_lock.LOCK}
#: what a run writes at the top of its dir: `resume=never` removes exactly these before it starts (never
#: anything else a user keeps in a dir named by `hydra.run.dir`)
RUN_OUTPUTS = (
    "DONE",
    "FAILED",
    reuse.SETTINGS,
    reuse.HYDRA_COPY,
    "results.json",
    "eval",
    "checkpoints",
    "adapter",
    "merged",
    "base",
    "sft",
    "sepo",
    "tables",
    "data",
    "wandb",
    "sft_metrics.json",
    "training_curve.csv",
    "training_curve.png",
)


#: what a launch records when it starts a run (its settings, its copy of Hydra's record): removed with the rest when
#: a value is refused inside the stage before the run wrote anything, so the corrected command is not refused as
#: "an unfinished run with other settings"
START_RECORDS = {reuse.SETTINGS, reuse.HYDRA_COPY}


def _remove_if_created_now(out: Path) -> None:
    """Undo what this launch made for a command line that was then rejected: the run dir and its empty
    parents when Hydra created them for it, else only what this launch added (Hydra's record, its log,
    the markers, and the records of a start that wrote nothing else): a dir the user named with
    `hydra.run.dir` keeps every file it held before."""
    if not out.is_dir() or not snapshot.known(out):
        return
    before = snapshot.entries_before(out) if not snapshot.created_now(out) else set()
    added = [p for p in out.iterdir() if p.name not in before]
    removable = REFUSAL_LEFTOVERS | (START_RECORDS if all(_launch_made(p) for p in added) else set())
    if snapshot.created_now(out):
        if any(p.name not in removable and p.suffix != ".log" for p in added):
            return  # something a run writes: never removed
        shutil.rmtree(out)
        for parent in out.parents:
            if not snapshot.created_now(parent) or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()
        return
    for path in added:
        if path.name in removable or path.suffix == ".log":
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _launch_made(path: Path) -> bool:
    """Whether `path` is one of the records a launch writes whatever its stage does (not a run's output)."""
    return path.name in REFUSAL_LEFTOVERS | START_RECORDS or path.suffix == ".log"


def _refuse(out: Path, message: str) -> None:
    """One line for a run dir that cannot be reused or resumed with these settings; it keeps its results,
    its markers and its own .hydra record. Alone: exit 2, nothing in the dir changed; in a sweep the job
    counts as failed."""
    _put_back_record(out)
    if _multirun():
        record_status(out, "failed", message)
    print(f"error: {message}", file=sys.stderr)
    if not _multirun():
        sys.exit(2)


def _put_back_record(out: Path) -> None:
    """Hydra rewrote `.hydra/` for this launch before the project could refuse it: the dir's own record goes
    back, as it was before this launch (a single run's snapshot), else the copy its run keeps."""
    if not snapshot.restore_record(out):
        reuse.restore_hydra_record(out)


def _skip_finished(out: Path, differing: list[str] | None) -> None:
    """A finished run is skipped when it ran with these settings, refused (one line) when it did not;
    either way it keeps its results, its DONE and its own .hydra record."""
    if differing:
        return _refuse(
            out,
            f"{out} finished with other settings: {reuse.describe(differing)}; allowed: the same settings, "
            "another run dir (hydra.run.dir=...), or resume=never to rerun it",
        )
    _put_back_record(out)
    log.info(
        "skipping %s: DONE marker present (resume=auto)%s",
        out,
        "" if differing is not None else "; it saved no settings to compare (finished before they were saved)",
    )
    record_status(out, "skipped")
    return None


def _clear_previous_run(out: Path) -> None:
    """resume=never: the old run's markers, results and checkpoints go before any work, so a launch killed
    early leaves no DONE that a later `resume=auto` would take for this run's."""
    for name in RUN_OUTPUTS:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def run_task(cfg: DictConfig) -> dict | None:
    with interruptible():
        return _run_task(cfg)


def _reject(out: Path, err: ConfigError) -> None:
    """One line for a bad value. Alone it leaves behind nothing this launch made (the run already in the
    dir keeps its record) and exits 2; in a sweep the job is marked FAILED (unless it is a finished run,
    which keeps its results) and the sweep goes on."""
    print(f"error: {err}", file=sys.stderr)
    if not _multirun():
        _put_back_record(out)
        _remove_if_created_now(out)
        sys.exit(2)
    if (out / "DONE").exists():
        _put_back_record(out)
    else:
        mark_failed(out, f"ConfigError: {err}")
    record_status(out, "failed", str(err))


def mark_failed(out: Path, reason: str, details: str = "") -> None:
    """FAILED holding the reason on its first line (and `details` below it). Written atomically; when
    that fails too (a full disk), the reason alone, which fits where the details did not."""
    for text in (f"{reason}\n\n{details}" if details else f"{reason}\n", f"{reason}\n"):
        try:
            write_text_atomically(out / "FAILED", text)
            return
        except OSError:
            continue
    print(f"error: could not write {out / 'FAILED'}: {reason}", file=sys.stderr)


def _run_task(cfg: DictConfig) -> dict | None:
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        validate(cfg)  # every value before any work, and before a finished run is reused
    except ConfigError as err:
        return _reject(out, err)
    try:
        with run_lock.hold(out) if distributed.launching_rank() == 0 else contextlib.nullcontext() as died:
            return _own_run_dir(out, cfg, died)
    except run_lock.RunDirBusy as err:
        return _busy(out, err)


def _busy(out: Path, err: run_lock.RunDirBusy) -> None:
    """The dir is another launch's: nothing in it is touched (Hydra's rewrite of its record is undone).
    Alone: one line, exit 2. In a sweep the job is left to that launch, and the sweep waits for it at its
    end and reports it as busy (sepo/run/sweep.py); a job in a process of its own tells its launcher so by
    its exit code."""
    _put_back_record(out)
    if not _multirun():
        print(f"error: {err}; allowed: wait until it ends, or another run dir (hydra.run.dir=...)", file=sys.stderr)
        sys.exit(2)
    print(f"warning: {err}; the sweep leaves this job to it and waits for it at its end", file=sys.stderr)
    if os.environ.get("SEPO_SWEEP_JOB") == "1":
        sys.exit(sweep.BUSY_EXIT)
    sweep.busy_jobs[sweep.absolute(out)] = str(err)
    return None


def _own_run_dir(out: Path, cfg: DictConfig, died: str | None) -> dict | None:
    """Reuse, resume or start the run in `out`, which this launch now holds."""
    if cfg.resume == "auto":
        try:
            differing = reuse.differences(out, cfg, shipped=lambda: shipped_settings(cfg))
        except reuse.DamagedRecord as err:
            return _refuse(out, f"{err}; allowed: resume=never to start afresh, or another run dir (hydra.run.dir=...)")
        if (out / "DONE").exists():
            return _skip_finished(out, differing)
        if differing:
            return _refuse(
                out,
                f"{out} holds an unfinished run with other settings: {reuse.describe(differing)}; allowed: the "
                "same settings (to resume it), another run dir (hydra.run.dir=...), or resume=never to start afresh",
            )
    elif distributed.launching_rank() == 0:
        _clear_previous_run(out)
    if died:
        print(f"warning: the last launch in {out} ({died}) died without a marker; resuming it", file=sys.stderr)
    if distributed.launching_rank() == 0:
        reuse.record_settings(out, cfg)  # what a later launch must match to resume or reuse this dir
        reuse.save_hydra_record(out)  # what a later launch that is refused puts back
    (out / "FAILED").unlink(missing_ok=True)
    log.info("%s", share_cores())  # before any torch work: parallel jobs must not fight over the cores
    return _run_stage(out, cfg)


def _run_stage(out: Path, cfg: DictConfig) -> dict | None:
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
            done = {"stage": cfg.stage.name, "seconds": round(time.time() - started, 2)}
            write_text_atomically(out / "DONE", json.dumps({**done, "processes": distributed.world_size()}) + "\n")
            record_status(out, "done")
        return result
    except Interrupted as err:  # one line, a FAILED marker that says so, and the conventional 128 + signal
        mark_failed(out, f"interrupted by {err}; re-run the same command to resume")
        record_status(out, "failed", f"interrupted by {err}")
        print(
            f"error: interrupted by {err}; {out} is marked FAILED, re-run the same command to resume", file=sys.stderr
        )
        sys.exit(128 + err.signum)
    except ConfigError as err:  # a stage's own check
        return _reject(out, err)
    except Exception as err:
        if not isinstance(err, RunError) and not _is_out_of_memory(err):
            return _crashed(out, err)
        if not isinstance(err, RunError):
            err = OutOfMemory(out_of_memory_advice(cfg, err))
        # a known way for a run to fail (bad input, divergence, a full disk, a GPU too small): one line
        mark_failed(out, f"{type(err).__name__}: {err}")
        record_status(out, "failed", f"{type(err).__name__}: {err}")
        print(f"error: {err}; {out} is marked FAILED", file=sys.stderr)
        if _multirun():
            return None
        sys.exit(1)
    finally:
        if tracker is not None:
            tracker.finish()


def _crashed(out: Path, err: Exception) -> None:
    """An unforeseen error: the marker holds the traceback, a sweep goes on, a single run re-raises."""
    reason = one_line(err)
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        reason = f"the disk is full: {reason}"
    mark_failed(out, reason, traceback.format_exc())
    record_status(out, "failed", reason)
    if _multirun():
        log.error("job failed (%s); see %s", reason, out / "FAILED")
        return None
    raise err


def _is_out_of_memory(err: Exception) -> bool:
    import torch  # the stages have imported it already

    return isinstance(err, torch.OutOfMemoryError)


def out_of_memory_advice(cfg: DictConfig, err: Exception) -> str:
    """What to lower, with today's values: the first full-size SEPO run on a GPU (Qwen 3.5 4B, an H200)
    ended in a 100-line CUDA traceback that named none of the settings that size the memory."""
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
    knobs = {
        "sepo.micro_batch": OmegaConf.select(cfg, "sepo.micro_batch"),
        "sepo.logprob_chunk": OmegaConf.select(cfg, "sepo.logprob_chunk"),
        "sft.per_device_batch_size": OmegaConf.select(cfg, "sft.per_device_batch_size"),
        "eval.batch_size": OmegaConf.select(cfg, "eval.batch_size"),
    }
    settings = ", ".join(f"{key} (now {value})" for key, value in knobs.items() if value is not None)
    return (
        f"out of GPU memory in stage {cfg.stage.name} ({first_line[:160]}); lower {settings}, or set "
        "sepo.ref_4bit=true or sft.gradient_checkpointing=true; re-run the same command to resume"
    )


pipeline.tables_hook = write_tables
