"""What the analysis commands share at the command line: the project's one-line errors, and Ctrl-C.

Ctrl-C ends a command with one line on stderr and exit 130, never a traceback. Python raises the
KeyboardInterrupt wherever the main thread is, which can be inside a finalizer that garbage
collection runs (a weakref callback); there Python prints it as "Exception ignored" and carries on.
So such an interrupt is caught too, and reported as one once the command returns.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable


def not_allowed(what: str, allowed: str) -> str:
    return f"error: {what} is not allowed; allowed: {allowed}"


def interruptible(main: Callable[[list[str] | None], int], argv: list[str] | None, unfinished: str) -> int:
    """`main(argv)`, or 130 after one line (`interrupted: <unfinished>`) when Ctrl-C stops it. A caller
    inside a run (the pipeline) calls `main` itself, so Ctrl-C still reaches the run's own handler."""
    swallowed: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            swallowed.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        code = main(argv)
        if swallowed:
            raise KeyboardInterrupt
        return code
    except KeyboardInterrupt:
        print(f"interrupted: {unfinished}", file=sys.stderr)
        return 130
    finally:
        sys.unraisablehook = previous


def exit_with(code: int) -> None:
    """Exit once the work is done: a Ctrl-C while the interpreter tears down has nothing left to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
