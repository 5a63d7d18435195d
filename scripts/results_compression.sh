#!/usr/bin/env bash
# The "e10" section of docs/results.md: compressed exchanges (algo.compression = int8 | int4 |
# topk, algo.gossip_codec = modulo | direct) for DiLoCo and GASLoC-1peer/-2peer against their
# uncompressed twins, and GASLoC-1peer int8 with time_budget against DiLoCo under E3's 10%
# straggler at 551M pricing: a study run by `gasloc sweep` (experiments/e10_compression.toml holds
# the grid, the tuning points and the claims, declared before any run).
#   scripts/results_compression.sh [--quick] [--dry-run] [--runs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
research_data
run_study experiments/e10_compression.toml "$@"
