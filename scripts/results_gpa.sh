#!/usr/bin/env bash
# The "gpa" section of docs/results.md: GPA's memory and untuned quality beside AdamW,
# Schedule-Free and single-worker DiLoCo, a study run by `gasloc sweep`
# (experiments/gpa_memory.toml). E5 (experiments/e5_gpa.toml) is the tuned comparison.
#   scripts/results_gpa.sh [--quick] [--dry-run] [--runs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
research_data
run_study experiments/gpa_memory.toml "$@"
