"""Analysis of a sweep: collect every results.json into one DataFrame, then write tables and figures.

`python -m analysis.tables <sweep dir>` is the entry point; `collect` reads runs (from a directory or
from W&B), `tables` writes the LaTeX tables and the CSV, `figures` the plots.
"""
