"""Dotted keys of nested config trees (the plain dicts of `OmegaConf.to_container`), written once for
the three places that need them: the command line's unknown-key check (every key), the reuse check of
a finished run (every leaf and its value) and the SFT settings a model may set (every leaf)."""

from __future__ import annotations

from typing import Any


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for every leaf of a nested dict (an empty dict has none)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(leaves(value, f"{prefix}{key}."))
    return out


def dotted_keys(tree: Any, prefix: str = "") -> list[str]:
    """Every key of a nested dict, inner nodes included ("a", "a.b", "a.b.c"), in order."""
    if not isinstance(tree, dict):
        return []
    out: list[str] = []
    for key, value in tree.items():
        out += [f"{prefix}{key}", *dotted_keys(value, f"{prefix}{key}.")]
    return out
