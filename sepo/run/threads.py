"""Each job's share of the CPU cores when several jobs run on one machine at once.

torch starts one compute thread per core in every process, so two jobs side by side on 2 cores
fight over them: a tiny SFT took 10x longer run that way than the two run one after the other
(docs/speed.md). Who sets the share:
- the user, with OMP_NUM_THREADS: always wins;
- the local launcher (`+launch=local`): each job's process gets OMP_NUM_THREADS = cores // n_jobs unless the
  user set it (hydra_plugins/sepo_launcher);
- torchrun: OMP_NUM_THREADS=1 per process unless the user set it;
- submitit (`+launch=submitit_local`, `+launch=slurm`): nothing, so the job takes `cpus_per_task`
  threads here, the cores SLURM gives a task.
"""

from __future__ import annotations

import os

import torch
from hydra.core.hydra_config import HydraConfig


def launcher_cores() -> int | None:
    """The cores the Hydra launcher gives one job, when it says (submitit's `cpus_per_task`)."""
    try:
        launcher = HydraConfig.get().launcher
    except ValueError:  # not under Hydra
        return None
    if "submitit" in str(launcher.get("_target_", "")) and launcher.get("cpus_per_task"):
        return int(launcher.cpus_per_task)
    return None


def share_cores() -> str:
    """Set this process's torch threads to its share; returns how many and who decided, for the log."""
    if os.environ.get("OMP_NUM_THREADS"):
        threads, source = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    elif (cores := launcher_cores()) is not None:
        threads, source = cores, "hydra.launcher.cpus_per_task"
        os.environ["OMP_NUM_THREADS"] = str(threads)  # and for the processes this job starts
    else:
        return f"{torch.get_num_threads()} torch threads (torch's default: one per core)"
    torch.set_num_threads(max(threads, 1))
    return f"{torch.get_num_threads()} torch threads (from {source})"
