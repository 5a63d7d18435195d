#!/usr/bin/env bash
# The "netns" section of docs/results.md: four ranks in network namespaces with tbf-shaped links
# (gasloc launch --netns, root) against the virtual clock, a study run by `gasloc sweep`
# (experiments/netns_real.toml).
#   sudo scripts/results_netns.sh [--quick] [--dry-run] [--runs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
[ "$(id -u)" -eq 0 ] || { echo "results_netns.sh needs root (gasloc launch --netns)" >&2; exit 1; }
research_data
run_study experiments/netns_real.toml "$@"
