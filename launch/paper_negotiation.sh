#!/usr/bin/env bash
# The paper's negotiation table: Gemma 4 on Negotiation v2 and Qwen 3.5 on v1 (each on the variant it
# suits; a grid sweep cannot zip model with game, so two sweeps). See launch/README.md.
# Usage: launch/paper_negotiation.sh [--dry-run] [hydra overrides]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"${PYTHON:-python}" -m launch.run_experiment paper_negotiation "$@"
exec "${PYTHON:-python}" -m launch.run_experiment paper_negotiation model=qwen game=neg_v1 "$@"
