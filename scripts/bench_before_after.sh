#!/usr/bin/env bash
# Did a change slow the Gloo transport? bench_comm's table from two builds, side by side in one
# run: the two binaries take turns (before, after, before, after, ...) so that the machine's load
# falls on both alike, and each row gets the median of its turns. The raw TCP column moves the
# same bytes without gasloc in both builds: its ratio shows how much of a difference is the
# machine's noise.
#   scripts/bench_before_after.sh BEFORE_BENCH AFTER_BENCH [TURNS] [-- bench_comm options]
# e.g. git worktree add /tmp/before OLD && cmake -S /tmp/before -B /tmp/before/build
#      -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/before/build --target bench_comm, then
#      scripts/bench_before_after.sh /tmp/before/build/bench_comm build/bench_comm 3
# Options default to --procs 2,4,8 --sizes-mb 25,100 --reps 5 (docs/performance.md's table).
set -euo pipefail
before=${1:?usage: scripts/bench_before_after.sh BEFORE_BENCH AFTER_BENCH [TURNS] [-- bench_comm options]}
after=${2:?usage: scripts/bench_before_after.sh BEFORE_BENCH AFTER_BENCH [TURNS] [-- bench_comm options]}
shift 2
turns=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then turns=$1; shift; fi
[ "${1:-}" = "--" ] && shift
opts=("$@")
[ ${#opts[@]} -eq 0 ] && opts=(--procs 2,4,8 --sizes-mb 25,100 --reps 5)
for b in "$before" "$after"; do
  [ -x "$b" ] || { echo "no bench_comm at $b (build it: cmake --build DIR --target bench_comm)" >&2; exit 2; }
done
[[ $turns =~ ^[1-9][0-9]*$ ]] || { echo "TURNS must be a positive count, not '$turns'" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((t = 1; t <= turns; ++t)); do
  for side in before after; do
    bin=$before; [ $side = after ] && bin=$after
    echo "turn $t/$turns: $side ($bin ${opts[*]})" >&2
    # Rows of the table: | op | procs | MB | Gloo ms | Gloo GB/s | raw ms | raw GB/s | ratio |
    "$bin" "${opts[@]}" | awk -F'|' -v side=$side 'NF >= 9 && $3 ~ /^ *[0-9]+ *$/ {
        gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4)
        print side "\t" $2 "\t" $3 "\t" $4 "\t" $5 + 0 "\t" $7 + 0 }' >> "$out/rows.tsv"
  done
done

echo "| op | procs | MB | Gloo ms before | Gloo ms after | after / before | raw ms before | raw ms after | raw after / before |"
echo "|---|---|---|---|---|---|---|---|---|"
# Median of each (side, row) over the turns, rows in the order the bench printed them.
awk -F'\t' '
  function median(list,   a, n, i, j, x) {
    n = split(list, a, " ")
    for (i = 2; i <= n; ++i) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; --j) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { key = $2 "|" $3 "|" $4; if (!(key in seen)) { seen[key] = 1; order[++rows] = key }
    gloo[$1, key] = gloo[$1, key] " " $5; raw[$1, key] = raw[$1, key] " " $6 }
  END {
    for (r = 1; r <= rows; ++r) {
      k = order[r]; split(k, f, "|")
      gb = median(gloo["before", k]); ga = median(gloo["after", k])
      rb = median(raw["before", k]); ra = median(raw["after", k])
      printf "| %s | %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", f[1], f[2], f[3], gb, ga, ga / gb, rb, ra, ra / rb
      lg += log(ga / gb); lr += log(ra / rb)
    }
    if (rows) printf "\ngeometric mean over %d rows: Gloo after / before %.3f, raw TCP after / before %.3f\n", rows, exp(lg / rows), exp(lr / rows)
  }' "$out/rows.tsv"
