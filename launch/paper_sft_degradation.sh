#!/usr/bin/env bash
# The paper's sft_degradation table(s): see launch/README.md. Usage: launch/paper_sft_degradation.sh [--dry-run] [hydra overrides]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.run_experiment paper_sft_degradation "$@"
