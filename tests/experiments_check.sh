#!/usr/bin/env bash
# Every sweep file in experiments/ loads (every run's job included) and expands, in both modes.
set -euo pipefail
G=$1
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in experiments/*.toml; do
  for mode in "" --quick; do
    out=$("$G" sweep "$f" $mode --dry-run --runs "$tmp") || { echo "FAIL: $f $mode"; exit 1; }
    [ -n "$out" ] || { echo "FAIL: $f $mode lists no runs"; exit 1; }
  done
done
echo "experiments_check: $(ls experiments/*.toml | wc -l) sweep files load"
