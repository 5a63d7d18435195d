#!/usr/bin/env bash
# The "hetero" section of docs/results.md: heterogeneous clusters on the virtual clock, a study
# run by `gasloc sweep` (experiments/hetero_clusters.toml holds the scenarios, the variants and
# the claims). Finished runs are reused, stopped ones resumed.
#   scripts/results_hetero.sh [--quick] [--dry-run] [--runs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
research_data
run_study experiments/hetero_clusters.toml "$@"
