"""Independent parts of one CPU job run side by side in forked processes, each on its share of the cores.

Decoding a few dozen rows at a time leaves the second core mostly idle: each step is a chain of small
operations launched one after another from Python, and only the matrix products use both threads. On the
2-core machine, 32 answers took 7.1 s on 1 thread and 5.1 s on 2 (1.37x), while two 1-thread processes side
by side each took 7.0 s, as fast as alone (docs/speed.md §5h). So work made of independent parts (a Kuhn
table's information sets, an evaluation's episodes) runs faster as two 1-thread halves than as one 2-thread
whole.

Forking shares the loaded model with the children without copying it (its pages are only read), and every
child's part draws from the same per-part random streams it would have drawn from in one process, so the
split changes no answer's stream; only the float roundings of a product may differ with the batch's rows and
the thread count, as between any two machines. A child hands its result back pickled through a pipe; a
child that fails fails the whole job with the child's traceback. A child that dies without handing back
its part (the out-of-memory killer, a SIGKILL) fails it with `WorkerDied`, a known way for a run to
fail: FAILED and the command's one line name the worker and how it died, and a re-run resumes.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sepo.errors import RunError

Part = TypeVar("Part")


class WorkerDied(RunError):
    """A forked worker ended without handing back its part; the message names it and how it ended."""


def worker_count(requested: int, device: Any = "cpu") -> int:
    """How many processes to split a job over: `requested`, at most one per torch thread, and one on a
    GPU (CUDA does not survive a fork, and a GPU's kernels keep it busy without help)."""
    import torch  # here: the arena and scripted agents import this module without torch

    if torch.device(device).type != "cpu":
        return 1
    return max(1, min(int(requested), torch.get_num_threads()))


def split_round_robin(n: int, parts: int) -> list[list[int]]:
    """Indices 0..n-1 dealt to `parts` lists in turn (neighbours often cost alike, so each list gets a
    like mix); empty lists are left out."""
    return [idx for idx in (list(range(k, n, parts)) for k in range(parts)) if idx]


def forked_map(work: Callable[[Part], Any], parts: Sequence[Part]) -> list[Any]:
    """`[work(p) for p in parts]`, the first part in this process and every other in a forked child,
    side by side, the torch threads shared out evenly; results in the order of `parts`."""
    if len(parts) <= 1:
        return [work(p) for p in parts]
    import torch

    threads = torch.get_num_threads()
    share = max(1, threads // len(parts))
    children = [_start_child(work, part, share) for part in parts[1:]]
    torch.set_num_threads(share)
    try:
        mine = work(parts[0])
    except BaseException:
        _kill_all(children)
        raise
    finally:
        torch.set_num_threads(threads)
    return [mine, *_collect_all(children)]


def _collect_all(children: list[tuple[int, int]]) -> list[Any]:
    """Every child's part, in order; the first that failed or died fails the job, and the children not
    yet collected are killed rather than left to finish work nobody reads."""
    collected = []
    for k, (pid, fd) in enumerate(children):
        try:
            collected.append(_collect(pid, fd))
        except BaseException:
            _kill_all(children[k + 1 :])
            raise
    return collected


def _start_child(work: Callable[[Part], Any], part: Part, threads: int) -> tuple[int, int]:
    import torch

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: do the part, hand it back, leave without running the parent's exit handlers
        os.close(read_fd)
        _die_with_parent()
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the tokenizer's thread pool did not survive the fork
        code = 0
        try:
            torch.set_num_threads(threads)
            payload = ("ok", work(part))
        except BaseException:  # noqa: BLE001 (everything goes back to the parent, which raises it)
            payload, code = ("error", traceback.format_exc()), 1
        try:
            with os.fdopen(write_fd, "wb") as pipe:
                pickle.dump(payload, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _die_with_parent() -> None:
    """A job killed (preempted, or its parent failed) takes its children with it (Linux: PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _collect(pid: int, fd: int) -> Any:
    with os.fdopen(fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data or not os.WIFEXITED(status) or os.waitstatus_to_exitcode(status) not in (0, 1):
        # nothing, or a part cut short: it died before it had handed back its part
        raise WorkerDied(
            f"a forked worker (pid {pid}) {_how_it_ended(status)} before handing back its part of the job; "
            "re-run the same command to resume"
        )
    kind, value = pickle.loads(data)
    if kind == "error":
        raise RuntimeError(f"forked worker (pid {pid}) failed:\n{value}")
    return value


def _how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"was killed by {signal.Signals(number).name}"
        except ValueError:
            return f"was killed by signal {number}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _kill_all(children: list[tuple[int, int]]) -> None:
    for pid, fd in children:
        _kill(pid, fd)


def _kill(pid: int, fd: int) -> None:
    os.close(fd)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
