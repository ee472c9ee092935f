#!/usr/bin/env bash
# The paper's kuhn table(s): see launch/README.md. Usage: launch/paper_kuhn.sh [--dry-run] [hydra overrides]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m launch.run_experiment paper_kuhn "$@"
