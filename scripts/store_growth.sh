#!/usr/bin/env bash
# The elastic store's size against the rounds (docs/performance.md, "The elastic store over a long
# run"): 2 elastic Gloo ranks of DAdam (a round every step, H = 1) on the nano preset under
# `gasloc launch --elastic`; at round ROUND_A and ROUND_B the launcher's status line (kill -USR1)
# gives its store's key count and its resident memory. Not in CI (about 2 minutes on 2 cores).
#   scripts/store_growth.sh [ROUND_A] [ROUND_B]     (default 100 5000)
set -euo pipefail
cd "$(dirname "$0")/.."
a=${1:-100} b=${2:-5000}
G=$PWD/build/gasloc
[ -x "$G" ] || { echo "build gasloc first (scripts/setup.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'kill -9 $launcher 2>/dev/null || true; rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > "$tmp/corpus.txt"
"$G" prepare --input "$tmp/corpus.txt" --out "$tmp/data" --byte-level --val-fraction 0.1 >/dev/null
"$G" launch --elastic -n 2 -- "$G" train --set model.preset=nano --set data.dir="$tmp/data" --set data.seq_len=32 \
  --set data.batch_size=4 --set data.val_batches=2 --set train.threads=1 --set train.blas_threads=1 \
  --set algo.name=dadam --set algo.topology=2peer --set algo.H=1 --set cluster.backend=gloo \
  --set train.steps=$((b + 200)) --set train.log_every=1 --set train.eval_every=0 --set train.checkpoint_every=0 \
  --set train.run_dir="$tmp/run" > "$tmp/launch.log" 2>&1 &
launcher=$!
# The newest step in the metrics (a round a step), then the status line the launcher prints.
status_at() {
  local round=$1
  until [ -f "$tmp/run/metrics.jsonl" ] && [ "$(grep -c '"event":"train"' "$tmp/run/metrics.jsonl")" -ge $((2 * round)) ]; do
    kill -0 $launcher 2>/dev/null || { echo "the run ended early: $(tail -5 "$tmp/launch.log")" >&2; exit 1; }
    sleep 0.2
  done
  local before; before=$(grep -c "launch: status" "$tmp/launch.log" || true)
  kill -USR1 $launcher
  until [ "$(grep -c "launch: status" "$tmp/launch.log" || true)" -gt "$before" ]; do sleep 0.05; done
  grep "launch: status" "$tmp/launch.log" | tail -1 | sed -E 's/.*store: ([0-9]+) keys; launcher RSS ([0-9.]+) MB/\1 \2/'
}
read -r keys_a rss_a < <(status_at "$a")
read -r keys_b rss_b < <(status_at "$b")
wait $launcher
echo "round $a: $keys_a keys, launcher RSS $rss_a MB"
echo "round $b: $keys_b keys, launcher RSS $rss_b MB"
awk -v ka="$keys_a" -v kb="$keys_b" -v ra="$rss_a" -v rb="$rss_b" \
  'BEGIN { printf "round %s against round %s: keys %+.1f%%, RSS %+.1f%%\n", ARGV[1], ARGV[2], 100 * (kb - ka) / ka, 100 * (rb - ra) / ra }' "$b" "$a"
