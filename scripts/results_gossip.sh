#!/usr/bin/env bash
# The "gossip" section of docs/results.md (E6, first part): gossip averaging of random vectors
# without training, a consensus study run by `gasloc sweep` (experiments/gossip_averaging.toml
# holds the graphs, the steps and the claims). It trains nothing and takes seconds.
#   scripts/results_gossip.sh [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
run_study experiments/gossip_averaging.toml "$@"
