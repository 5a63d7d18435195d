#!/usr/bin/env bash
# Every sweep file in experiments/ loads (every run's job included) and expands, in both modes, and
# every scripts/results_*.sh wrapper names one or more of them.
G=$1
here=$(dirname "$(readlink -f "$0")")
source "$here/lib.sh"
cd "$here/.."
for f in experiments/*.toml; do
  for mode in "" --quick; do
    out=$("$G" sweep "$f" $mode --dry-run --runs "$tmp") || { echo "FAIL: $f $mode"; exit 1; }
    [ -n "$out" ] || { echo "FAIL: $f $mode lists no runs"; exit 1; }
  done
done
# Every results wrapper runs a study file that exists (they are thin: the file is the study).
for w in scripts/results_*.sh; do
  studies=$(sed -nE 's/^run_study ([^ ]+\.toml).*/\1/p' "$w")
  [ -n "$studies" ] || { echo "FAIL: $w runs no study file"; exit 1; }
  for study in $studies; do
    [ -f "$study" ] || { echo "FAIL: $w runs a study file that does not exist ('$study')"; exit 1; }
  done
done
echo "experiments_check: $(ls experiments/*.toml | wc -l) sweep files load; $(ls scripts/results_*.sh | wc -l) wrappers name one"
