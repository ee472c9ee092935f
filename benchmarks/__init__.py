"""Benchmarks: tools built on top of the library, run by `python -m benchmarks <command>`.

Each module measures one thing and has the same two entry points: `add_arguments(parser)` and
`run(args) -> dict`, the JSON object the command prints as its last line. Nothing in the library
imports this package (tests/test_layout.py checks it), so what it measures is never what it changes.
"""
