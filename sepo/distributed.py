"""Data parallelism under `torchrun` (or SLURM through submitit): the few collectives SEPO needs.

One process per device. Every process holds the whole model; a SEPO batch's groups are split
across processes (a group never straddles two, so its leave-one-out baseline stays local), the
finished episodes are exchanged without their token traces so every process computes the same
advantages, batch scale and estimator statistics, and the gradients of each process's share of
the loss (a sum over decisions) are summed. The update is then the one-process update, to float
rounding. Side effects (checkpoints, evaluation, DONE/FAILED, W&B) happen on rank 0 only.

Without `WORLD_SIZE` > 1 in the environment every function here is the one-process identity, so
nothing else in the code needs to know whether it runs distributed.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and world_size() > 1


def _export_submitit_environment() -> None:
    """Inside a submitit job of several tasks (`+launch=slurm_ddp`, or `submitit_local` with
    `tasks_per_node` > 1), set torch's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) from
    the job's environment, as torchrun would have."""
    if "WORLD_SIZE" in os.environ or not os.environ.get("SUBMITIT_EXECUTOR"):
        return
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    if JobEnvironment().num_tasks > 1:
        TorchDistributedEnvironment().export(set_cuda_visible_devices=torch.cuda.is_available())


def launching_rank() -> int:
    """This process's rank before the process group exists (the run dir's lock and settings record are
    rank 0's): torchrun's RANK, or a multi-task submitit job's, exported as torchrun would."""
    _export_submitit_environment()
    return int(os.environ.get("RANK", "0"))


def init() -> None:
    """Join the process group `torchrun` (or a multi-task submitit job) describes: nccl on CUDA,
    gloo on CPU; a no-op for one process."""
    _export_submitit_environment()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or active():
        return
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=60))
    log.info("data parallel: rank %d of %d (%s)", rank(), world_size(), "nccl" if cuda else "gloo")


def barrier() -> None:
    if active():
        torch.distributed.barrier()


def sum_floats(*values: float) -> list[float]:
    """Each value summed over all processes (float64, so counts and sums stay exact)."""
    if not active():
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return t.tolist()


def all_gather(obj: Any) -> list[Any]:
    """Every process's `obj`, in rank order (pickled; for small things like stripped episode records)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum `.grad` over processes in one flat buffer (the loss is a sum over decisions, not a mean)."""
    if not active():
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def shard(items: list[Any]) -> list[Any]:
    """This process's share: items rank, rank + world, ... (a fixed, deterministic split)."""
    return items[rank() :: world_size()]
