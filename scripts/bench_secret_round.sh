#!/usr/bin/env bash
# What a job secret costs a whole training round (docs/performance.md, "What a job secret costs"):
# the same Gloo training job, open and with `--secret-file` (every transfer sealed, the all-reduce
# the id-ordered reduction), in alternating turns so that the machine's load falls on both alike.
# Each run's wall seconds per round are read from its metrics (rank 0's train rows at the ends of
# its rounds, the first round left out as warm-up); the table gives each side's median over the
# turns and their ratio. A sealed run's losses equal the open run's (tests/auth_launch.sh), so
# the difference is the seal's cost alone.
#   scripts/bench_secret_round.sh [--procs N] [--preset P] [--algo A] [--topology T] [--H H]
#                                 [--rounds R] [--turns K]
# Defaults: 4 ranks of the micro model, gasloc 2peer, H = 10, 6 rounds, 3 turns. DiLoCo: --algo diloco
# --topology ''.
set -euo pipefail
cd "$(dirname "$0")/.."
procs=4 preset=micro algo=gasloc topology=2peer H=10 rounds=6 turns=3
while [ $# -gt 0 ]; do
  case $1 in
    --procs) procs=$2 ;; --preset) preset=$2 ;; --algo) algo=$2 ;; --topology) topology=$2 ;;
    --H) H=$2 ;; --rounds) rounds=$2 ;; --turns) turns=$2 ;;
    *) echo "unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
for v in "$procs" "$H" "$rounds" "$turns"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "--procs, --H, --rounds and --turns take positive counts, not '$v'" >&2; exit 2; }
done
[ "$rounds" -ge 2 ] || { echo "--rounds must be at least 2 (the first is warm-up)" >&2; exit 2; }
G=$PWD/build/gasloc
[ -x "$G" ] || { echo "build gasloc first (scripts/setup.sh)" >&2; exit 2; }
source tests/metrics_lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 2000); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > "$tmp/corpus.txt"
"$G" prepare --input "$tmp/corpus.txt" --out "$tmp/data" --byte-level --val-fraction 0.1 >/dev/null
"$G" secret --out "$tmp/job.secret" >/dev/null
steps=$((H * rounds))
job=(--set model.preset="$preset" --set data.dir="$tmp/data" --set data.seq_len=64 --set data.batch_size=8
     --set data.val_batches=2 --set train.log_every="$H" --set train.eval_every="$steps"
     --set train.checkpoint_every="$steps" --set train.threads=1 --set train.blas_threads=1
     --set algo.name="$algo" --set algo.H="$H" --set cluster.backend=gloo
     --set train.steps="$steps" --set cluster.timeout_s=300)
[ -n "$topology" ] && job+=(--set algo.topology="$topology")
echo "$procs ranks of $preset, $algo${topology:+ $topology}, H = $H, $rounds rounds, $turns turns on $(nproc) cores" >&2
: > "$tmp/rows"
for ((t = 1; t <= turns; ++t)); do
  for side in open sealed; do
    secret=(); [ $side = sealed ] && secret=(--secret-file "$tmp/job.secret")
    run=$tmp/run-$side-$t
    timeout 1200 "$G" launch -n "$procs" "${secret[@]}" -- "$G" train "${job[@]}" --set train.run_dir="$run" \
      > "$run.log" 2>&1 || { echo "the $side run of turn $t failed: $(tail -20 "$run.log")" >&2; exit 1; }
    # Rank 0's train rows at the ends of rounds 1 and R: the wall seconds of rounds 2..R.
    per_round=$(metric_rows "$run" train step worker wall_time_s |
      awk -v H="$H" -v last="$steps" '$2 == 0 && $1 == H { a = $3 } $2 == 0 && $1 == last { b = $3 }
        END { if (a == "" || b == "") exit 1; printf "%.4f", (b - a) / ((last - H) / H) }') ||
      { echo "the $side run of turn $t has no train rows at steps $H and $steps" >&2; exit 1; }
    echo "turn $t/$turns: $side $per_round s a round" >&2
    echo "$side $per_round" >> "$tmp/rows"
  done
done
awk -v p="$procs" -v m="$preset" -v a="$algo $topology" -v H="$H" '
  function median(list,   v, n, i, j, x) {
    n = split(list, v, " ")
    for (i = 2; i <= n; ++i) { x = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > x; --j) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { s[$1] = s[$1] " " $2 }
  END {
    o = median(s["open"]); c = median(s["sealed"])
    print "| ranks | model | algorithm | H | open s a round | sealed s a round | sealed - open | sealed / open |"
    print "|---|---|---|---|---|---|---|---|"
    printf "| %d | %s | %s | %d | %.3f | %.3f | %+.3f s | %.3f |\n", p, m, a, H, o, c, c - o, c / o
  }' "$tmp/rows"
