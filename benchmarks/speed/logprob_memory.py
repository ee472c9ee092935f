"""Peak memory of per-token log-probs, `python -m benchmarks logprob`.

`logprob` measures the peak memory of per-token log-probs over a large vocabulary, chunked
(`sepo.lm.logprobs.chunked_logprobs_from_hidden`) against the unchunked reference. Torch's CPU
allocations are invisible to tracemalloc, so each variant runs in a fresh subprocess that
allocates its inputs, warms the kernels up on a sliver, resets the kernel's peak-RSS mark, computes,
and reports the growth of its peak resident set size (VmHWM) over the resident set size before the
computation. The workers run with glibc's mmap threshold at 1 MiB so that freed blocks are returned
at once and RSS follows the live tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HELP = "peak memory of chunked vs unchunked log-probs"


def add_arguments(p: argparse.ArgumentParser, worker: bool = False) -> None:
    p.add_argument("--vocab", type=int, default=262144)
    p.add_argument("--positions", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--chunk", type=int, default=32)
    if worker:
        p.add_argument("--variant", choices=("chunked", "unchunked"), required=True)


def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS: now, VmHWM: peak) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0) so earlier peaks (imports) do not hide ours."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_worker(args: argparse.Namespace) -> dict:
    """One variant in this (fresh) process: peak memory growth of the computation in MiB."""
    import torch

    from sepo.lm.logprobs import chunked_logprobs_from_hidden, logprobs_from_hidden_reference

    def compute(hidden, weight, targets):
        with torch.no_grad():
            if args.variant == "chunked":
                return chunked_logprobs_from_hidden(hidden, weight, targets, chunk=args.chunk)
            return logprobs_from_hidden_reference(hidden, weight, targets)

    torch.manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden).mul_(0.02)
    hidden = torch.randn(1, args.positions, args.hidden)
    targets = torch.randint(args.vocab, (1, args.positions))
    # warm-up on a sliver: the first call pages in kernels and thread pools, which is not our memory
    compute(hidden[:, :2], weight[:64], targets[:, :2] % 64)
    # without a reset, the baseline is the peak so far: growth below it would read as 0
    baseline = _status_mb("VmRSS") if _reset_peak() else _status_mb("VmHWM")
    lp = compute(hidden, weight, targets)
    return {"variant": args.variant, "peak_mb": max(0.0, _status_mb("VmHWM") - baseline), "checksum": float(lp.sum())}


def run(args: argparse.Namespace) -> dict:
    peaks = {}
    for variant in ("chunked", "unchunked"):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks",
            "_logprob_worker",
            "--variant",
            variant,
            "--vocab",
            str(args.vocab),
            "--positions",
            str(args.positions),
            "--hidden",
            str(args.hidden),
            "--chunk",
            str(args.chunk),
        ]
        # Large blocks straight from mmap: a freed chunk goes back to the OS at once, so RSS follows the
        # live tensors instead of glibc's heap, which can keep growing under a stream of equal blocks.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        peaks[variant] = json.loads(out.strip().splitlines()[-1])
    if abs(peaks["chunked"]["checksum"] - peaks["unchunked"]["checksum"]) > 1e-2 * args.positions:
        raise RuntimeError(f"chunked and unchunked log-probs disagree: {peaks}")
    chunked, unchunked = peaks["chunked"]["peak_mb"], peaks["unchunked"]["peak_mb"]
    return {
        "chunked_peak_mb": round(chunked, 1),
        "unchunked_peak_mb": round(unchunked, 1),
        "ratio": round(chunked / unchunked, 4) if unchunked else None,
        "vocab": args.vocab,
        "positions": args.positions,
        "hidden": args.hidden,
        "chunk": args.chunk,
    }
