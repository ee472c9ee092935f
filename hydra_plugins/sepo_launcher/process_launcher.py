"""`+launch=local`: a sweep's jobs on this machine, `n_jobs` at a time, each in a process of its own.

Each job is the same command a single run would be (`python main.py <its overrides>`) with its run dir
fixed to the one the sweep gives it, so a job behaves exactly as it would alone: its markers, its
resume, its lock. Its process is its own, so a job that dies however it dies (SIGKILL, the kernel's
out-of-memory killer, a segfault in a native kernel) takes nothing else with it: the other jobs run
on, and the sweep's summary reads the dead job's dir as failed ("ended without a marker"). joblib's
workers, which this replaces, share one pool: one dead worker broke the pool and aborted every other
job with a traceback. A job whose dir another launch holds touches nothing in it and says so by its
exit code (`sweep.BUSY_EXIT`), so the summary reports it as busy, not failed (sepo/run/sweep.py).

Cores: each job gets `OMP_NUM_THREADS = cores // n_jobs` unless the user set OMP_NUM_THREADS
(sepo/run/threads.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from sepo.run import sweep

log = logging.getLogger(__name__)

#: set in every job's environment: the job is part of a sweep (`sepo.run.task` marks a rejected job FAILED and
#: lets the sweep go on, where a single run would exit)
SWEEP_JOB_ENV = "SEPO_SWEEP_JOB"
#: command-line options of the launching command that every job needs too (a user's own config groups)
PASSED_ON = ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp")


def passed_on_options(argv: Sequence[str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        if arg in PASSED_ON and i + 1 < len(argv):
            out += [arg, argv[i + 1]]
        elif arg.split("=", 1)[0] in PASSED_ON and "=" in arg:
            out.append(arg)
    return out


def never_started(run_dir: Path, overrides: list[str], code: int) -> None:
    """A job whose command failed before Hydra made its run dir: the dir, Hydra's record of the overrides,
    and FAILED, so the sweep summary counts it."""
    from sepo.run.sweep import record_status
    from sepo.run.task import mark_failed

    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    reason = f"the job's command failed before it started (exit code {code})"
    mark_failed(run_dir, reason)
    record_status(run_dir, "failed", reason)


class ProcessLauncher(Launcher):
    def __init__(self, n_jobs: int = 2, **kwargs: Any) -> None:
        self.n_jobs = int(n_jobs)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def job_dir(self, overrides: Sequence[str], idx: int) -> Path:
        """The run dir the sweep gives this job (`hydra.sweep.dir`/`hydra.sweep.subdir`, as Hydra resolves them)."""
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        return Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = [(list(o), self.job_dir(o, initial_job_idx + i)) for i, o in enumerate(job_overrides)]
        log.info("launching %d jobs, %d at a time, each in its own process, into %s", len(jobs), self.n_jobs, sweep_dir)
        for i, (overrides, _) in enumerate(jobs):
            log.info("\t#%d : %s", initial_job_idx + i, " ".join(filter_overrides(overrides)))
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // self.n_jobs))
        package_root = str(Path(__file__).resolve().parents[2])  # the checkout (or site-packages) holding sepo/
        env = {
            **os.environ,
            SWEEP_JOB_ENV: "1",
            "OMP_NUM_THREADS": threads,
            "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
        }
        extra = passed_on_options(sys.argv[1:])

        def run(job: tuple[list[str], Path]) -> int:
            overrides, run_dir = job
            command = [sys.executable, "-c", "from sepo.run.cli import main; main()", *extra, *overrides]
            quoted = str(run_dir).replace("\\", "\\\\").replace("'", "\\'")
            return subprocess.run([*command, f"hydra.run.dir='{quoted}'"], env=env).returncode

        with ThreadPoolExecutor(max_workers=self.n_jobs) as pool:
            codes = list(pool.map(run, jobs))
        returns = []
        for (overrides, run_dir), code in zip(jobs, codes):
            run_dir = sweep.absolute(run_dir)
            sweep.launched_jobs.add(run_dir)
            if code < 0:
                log.error("job %s was killed by signal %d", run_dir, -code)
            if code == sweep.BUSY_EXIT:  # another launch holds its dir: the summary waits for it
                sweep.busy_jobs[run_dir] = "held by another launch"
            elif code != 0 and not (run_dir / ".hydra").exists():  # it never started: say so where the summary looks
                never_started(run_dir, overrides, code)
            ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=code)
            ret.working_dir = str(run_dir)
            returns.append(ret)
        return returns  # how each ended is read from its run dir by the sweep summary (sepo/run/sweep.py)
