"""Errors the entry point turns into one readable line instead of a traceback."""


class ConfigError(ValueError):
    """A config value is wrong: the message names the key and the allowed values."""


class ModelLoadError(ConfigError):
    """A model or tokenizer cannot be loaded or built from `cfg.model`; the message says what to set."""


class RunError(RuntimeError):
    """A known way for a run to fail after its config was accepted (a damaged input, a diverged loss):
    the run is marked FAILED with the message, which names the file, key or step, and the command exits
    with one line instead of a traceback."""


class InputError(RunError):
    """An input file is damaged or inconsistent: the message names the file (and the line)."""


class Diverged(RunError):
    """Training produced a non-finite loss, gradient or weight."""


class OutOfMemory(RunError):
    """The accelerator ran out of memory: the message names the settings that size it."""


class NonFiniteLogits(RunError):
    """A model's next-token scores hold a NaN or +inf, so no token can be drawn: its weights are
    broken (finite but huge after a diverged update, or a damaged checkpoint)."""


def one_line(err: BaseException) -> str:
    """`Type: first line of the message`, for a log line that names what went wrong without its traceback."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
