"""Errors the entry point turns into one readable line instead of a traceback."""


class ConfigError(ValueError):
    """A config value is wrong: the message names the key and the allowed values."""
