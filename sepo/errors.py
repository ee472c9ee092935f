"""Errors the entry point turns into one readable line instead of a traceback."""


class ConfigError(ValueError):
    """A config value is wrong: the message names the key and the allowed values."""


def one_line(err: BaseException) -> str:
    """`Type: first line of the message`, for a log line that names what went wrong without its traceback."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
