#!/usr/bin/env bash
# The experiment suite (issue 7): every study in experiments/ through `gasloc sweep`, each writing
# its section of docs/results.md (the only writer of those sections: a plain `gasloc sweep`
# reports into its own run directory), then `gasloc sweep --glance`, which gathers every study's
# verdict lines from those sections into "Claims at a glance" on top. Finished runs are reused, so an interrupted suite resumes.
#   scripts/experiments.sh [--quick] [e1 e2 ...]    (--quick: fewer steps and seeds, < 20 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
[ -x build/gasloc ] || scripts/setup.sh --program
quick=()
suffix=""
if [ "${1:-}" = "--quick" ]; then quick=(--quick); suffix="-quick"; shift; fi
studies=("$@")
# E2b (16 and 32 workers) and E6 (32 workers) are left out of the quick suite: their many
# workers alone would take most of its 20 minutes. E8 (churn) too: on 4 workers its schedule has
# too few failures to say anything. E9 (overlap, 126 runs, about 95 min) too, and E10 (compression,
# 140 runs, about 3.5 h; its quick form alone takes most of the quick suite's 20 minutes), and
# E11 (16 to 1,024 workers in two study files, about 4 h).
if [ ${#studies[@]} -eq 0 ]; then
  if [ -n "$suffix" ]; then studies=(e1 e2 e3 e4 e5 e7); else studies=(e1 e2 e2b e3 e4 e5 e6 e7 e8 e9 e10 e11); fi
fi
# A study's files: experiments/NAME_*.toml (E11 has two, its small and its large part).
study_files() { ls experiments/"$1"_*.toml 2>/dev/null; }
research_data
doc=${RESULTS_DOC:-docs/results.md}
t0=$(date +%s)
for s in "${studies[@]}"; do
  mapfile -t files < <(study_files "$s")
  [ ${#files[@]} -gt 0 ] || { echo "no experiments/${s}_*.toml" >&2; exit 2; }
  for file in "${files[@]}"; do
    echo "=== $s: $file ${quick[*]} ==="
    build/gasloc sweep "$file" "${quick[@]}" --doc "$doc" | grep --line-buffered -v -e '^    ' -e '^  \[[a-z_]*\]$'
  done
done
echo "suite (${studies[*]}${quick:+, quick}) took $(( ($(date +%s) - t0) / 60 )) min"

# "Claims at a glance", gathered by gasloc sweep from the suite's study sections in the document
# (a partial suite lists what has not run yet).
if [ -n "$suffix" ]; then suite=(e1 e2 e3 e4 e5 e7); else suite=(e1 e2 e2b e3 e4 e5 e6 e7 e8 e9 e10 e11); fi
files=()
for s in "${suite[@]}"; do mapfile -t -O ${#files[@]} files < <(study_files "$s"); done
build/gasloc sweep --glance "${quick[@]}" --doc "$doc" "${files[@]}"
