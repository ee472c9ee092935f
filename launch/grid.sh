#!/usr/bin/env bash
# The whole paper grid: every game for Gemma 4 and Qwen 3.5 (SFT -> SEPO -> evaluation per job), then
# every table. See launch/README.md. Usage: launch/grid.sh [--dry-run] [hydra overrides]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.run_experiment paper_grid "$@"
