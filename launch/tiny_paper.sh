#!/usr/bin/env bash
# The paper's tables for all five games on the embedded tiny model, on this machine's CPU (2 jobs at a
# time, each on its share of the cores), resumable. Usage: launch/tiny_paper.sh [--dry-run] [--root DIR]
# [--seeds 0,1,2] [--jobs 2] [--tables-anyway] [hydra overrides]. See launch/tiny_paper.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.tiny_paper "$@"
