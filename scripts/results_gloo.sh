#!/usr/bin/env bash
# The "gloo" section of docs/results.md: four real processes over Gloo with throttled links
# against the virtual clock, a study run by `gasloc sweep` (experiments/gloo_real.toml holds the
# calibration, the variants and the scenarios; the sweep starts the ranks with gasloc launch).
#   scripts/results_gloo.sh [--quick] [--dry-run] [--runs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
research_data
run_study experiments/gloo_real.toml "$@"
