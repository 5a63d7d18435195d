#!/usr/bin/env bash
# The "e11s" and "e11l" sections of docs/results.md: GASLoC-1peer and -2peer against DiLoCo with a
# tree all-reduce at 16, 64 (3 seeds), 256 and 1,024 (1 seed) nano workers on 50 ms, 1 Gbit/s
# links, messages priced as 134m in bf16: two studies run by `gasloc sweep`
# (experiments/e11_scale_small.toml and e11_scale_large.toml hold the grid and the claims,
# declared before any run). The full large part takes hours on 2 cores (1,024 in-process
# workers, about half an hour a run); --quick runs 16 and 256 workers for 60 steps.
#   scripts/results_scale.sh [--quick] [--dry-run] [--runs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
research_data
run_study experiments/e11_scale_small.toml "$@"
run_study experiments/e11_scale_large.toml "$@"
