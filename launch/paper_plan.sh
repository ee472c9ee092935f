#!/usr/bin/env bash
# The paper's plan for one model, phase by phase: its three SFTs once (`multi` serves IPD, auction and
# neg_v1), Base and the SFTs evaluated on every game, then SEPO (and payoff-only) per game and seed from
# the game's SFT, then the tables. On a cluster: launch/paper_plan.sh --model gemma4 --launch slurm
# --seeds 42 --arms sepo hydra.launcher.partition=gpu (each phase's jobs are submitted and waited for).
# The same command as launch/tiny_paper.sh; see launch/tiny_paper.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.tiny_paper "$@"
