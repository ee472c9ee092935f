#!/usr/bin/env bash
# Does SEPO train toward J_SEPO? Seeds of several arms (SEPO, payoff-only, the paper's penalty
# modes) from one SFT checkpoint of the tiny model, on one game. Usage: launch/sepo_safety.sh [--game ipd]
# [--root DIR] [--seeds 0 1 2] [--jobs 2] [--arms ...] [hydra overrides]. See launch/sepo_safety.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.sepo_safety "$@"
