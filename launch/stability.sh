#!/usr/bin/env bash
# Does SEPO hold what it reaches? Every game's SEPO arm, run twice as long, from a finished
# tiny_paper root's SFT checkpoints. Usage: launch/stability.sh --from <root>/tiny_paper --root DIR
# [--steps 80] [--seeds 0,1,2] [--jobs 2] [hydra overrides]. See launch/stability.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.stability "$@"
