"""Benchmarks of the language-model agent (docs/spec.md §6), one command each:

    python -m benchmarks rollout [--episodes 80] [--game ipd] [--max-new-tokens N]
    python -m benchmarks logprob [--vocab 262144 --positions 512 --hidden 256 --chunk 32]
    python -m benchmarks gradcheck [--batches 2000]
    python -m benchmarks step [--model-path DIR] [--steps 3] [overrides ...]
    python -m benchmarks gpu [--model gemma4|qwen|both]

The benchmarks themselves live in `benchmarks/<topic>/` (each module's docstring says what it measures
and why); this is only their command line, run from the repository root. Each command prints a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging

from benchmarks.estimator import gradcheck
from benchmarks.gpu import full_size as gpu
from benchmarks.speed import logprob_memory, rollout, step_profile

COMMANDS = {"rollout": rollout, "logprob": logprob_memory, "gradcheck": gradcheck, "step": step_profile, "gpu": gpu}


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = out.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP))
    # the log-prob benchmark measures each variant in a fresh process of this very command
    logprob_memory.add_arguments(sub.add_parser("_logprob_worker"), worker=True)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run = logprob_memory.run_worker if args.command == "_logprob_worker" else COMMANDS[args.command].run
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
