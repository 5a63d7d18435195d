#!/usr/bin/env bash
# The experiment suite (issue 7): every study in experiments/ through `gasloc sweep`, each writing
# its section of docs/results.md. Finished runs are reused, so an interrupted suite resumes.
#   scripts/experiments.sh [--quick] [e1 e2 ...]    (--quick: fewer steps and seeds, < 20 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
results_prereqs
quick=()
if [ "${1:-}" = "--quick" ]; then quick=(--quick); shift; fi
studies=("$@")
[ ${#studies[@]} -gt 0 ] || studies=(e1 e2 e3 e4 e5 e6)
t0=$(date +%s)
for s in "${studies[@]}"; do
  file=$(ls experiments/"$s"_*.toml 2>/dev/null | head -1)
  [ -n "$file" ] || { echo "no experiments/${s}_*.toml" >&2; exit 2; }
  echo "=== $s: $file ${quick[*]} ==="
  build/gasloc sweep "$file" "${quick[@]}" | grep --line-buffered -v '^    '
done
echo "suite (${studies[*]}${quick:+, quick}) took $(( ($(date +%s) - t0) / 60 )) min"
