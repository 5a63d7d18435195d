#!/usr/bin/env bash
# Soak test of elastic Gloo runs (not in CI): 8 ranks of GASLoC-1peer under
# `gasloc launch --elastic`, a random rank SIGKILLed every ~20 s and, now and then, another
# SIGSTOPped for 30 s; then the same run without faults. Reports the failures survived, restarts
# of ranks that were not hit (goal: none), whether the run completed, its final validation loss
# against the fault-free run's (goal: within 2%), and per failure the seconds until the dead rank
# left the view and until its next incarnation was back in the mixing.
#   scripts/soak_elastic.sh [--netns] [--out DIR] MINUTES [STEPS]   (STEPS: default, about MINUTES of training)
#   scripts/soak_elastic.sh [--netns] [--out DIR] --report          (the report of a finished soak)
# DIR: default runs/soak (runs/soak-netns with --netns).
# --netns (root): 4 ranks, each its own host on shaped links (`gasloc launch --netns`), and the
# faults take turns in a fixed order every ~20 s: a rank's link set down for 8 s (a dead link,
# not a dead process), a SIGKILL, a SIGSTOP for 20 s.
# Every output line is time-stamped on this script's clock (DIR/launch.log), so a kill, the view
# that first leaves the rank out and its rejoin are measured on one clock (scripts/lib/soak_report.awk).
set -euo pipefail
cd "$(dirname "$0")/.."
netns="" out=""
[ "${1:-}" = "--netns" ] && { netns=--netns; shift; }
[ "${1:-}" = "--out" ] && { out=${2:?--out needs a directory}; shift 2; }
minutes=${1:?usage: scripts/soak_elastic.sh [--netns] [--out DIR] MINUTES [STEPS]}
n=8; [ -n "$netns" ] && n=4
G=$PWD/build/gasloc
[ -x "$G" ] || { echo "build gasloc first (scripts/setup.sh)" >&2; exit 2; }
out=${out:-runs/soak${netns:+-netns}}
job=(--set model.preset=nano --set data.dir="$out/data" --set data.seq_len=64 --set data.batch_size=8
     --set data.val_batches=4 --set train.log_every=50 --set train.eval_every=500 --set train.checkpoint_every=500
     --set train.threads=1 --set train.blas_threads=1 --set algo.name=gasloc --set algo.topology=1peer
     --set algo.H=10 --set cluster.backend=gloo --set cluster.timeout_s=120)
# Steps a second on 2 cores, measured with faults: about 20 for 8 nano ranks (54,000 in 48
# minutes), about 25 for 4 on shaped links (6,000 in 4 minutes); round to whole rounds.
rate=20; [ -n "$netns" ] && rate=25
[ "$minutes" = "--report" ] || steps=${2:-$(( minutes * 60 * rate / 10 * 10 ))}
stamp() { local t0=$1; while IFS= read -r line; do printf '%s %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')" "$line"; done; }
now() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }'; }
# What the files of a finished soak say (also: scripts/soak_elastic.sh [--netns] --report).
report() {
  local rc secs count
  read -r rc secs < "$out/status"
  count() { grep -c " $1 " "$out/faults.txt" || true; }
  echo "faulted run: status $rc, $(count kill) kills, $(count stop) stops${netns:+ and $(count link) dead links} in $secs s"
  final_loss() { "$G" report "$1" --csv - | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $2 == "eval_worker" { last[$(c["worker"])] = $(c["val_loss"]); step = $(c["step"]) }
    END { for (w in last) { s += last[w]; n++ } printf "%.4f\n", s / n }'; }
  local lf lc
  lf=$(final_loss "$out/faults"); lc=$(final_loss "$out/clean")
  echo "final validation loss (mean over the ranks' own models): $lf with faults, $lc without ($(awk -v a="$lf" -v b="$lc" 'BEGIN { printf "%+.2f", 100 * (a - b) / b }')%)"
  awk -f scripts/lib/soak_report.awk "$out/faults.txt" "$out/launch.log"
}
[ "$minutes" = "--report" ] && { report; exit 0; }
rm -rf "$out"; mkdir -p "$out"
for i in $(seq 1 2000); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > "$out/corpus.txt"
"$G" prepare --input "$out/corpus.txt" --out "$out/data" --byte-level --val-fraction 0.1 >/dev/null

t0=$(date +%s.%N)
"$G" launch $netns --elastic -n $n --max-restarts 100000 --min-ranks 2 --heartbeat-timeout 10 -- "$G" train "${job[@]}" \
  --set train.steps="$steps" --set train.run_dir="$out/faults" 2>&1 | stamp "$t0" > "$out/launch.log" &
launcher=$!
rank_pid() { # the running `gasloc train` process of rank $1 in the faulted run
  pgrep -f -- "train.run_dir=$out/faults" | while read -r p; do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$1" && echo "$p"; done | head -1 || true
}
: > "$out/faults.txt"
sleep 15
kills=0 stops=0 next_stop=$(( RANDOM % 60 + 60 ))
if [ -n "$netns" ]; then
  bed=$(sed -nE 's/.*hosts on bridge glb([0-9]+) .*/\1/p' "$out/launch.log" | head -1)
  [ -n "$bed" ] || { echo "no test bed line in $out/launch.log" >&2; exit 1; }
  links=0 k=0
  while kill -0 "$launcher" 2>/dev/null; do
    sleep $(( RANDOM % 10 + 15 ))
    r=$(( RANDOM % n )); k=$(( k + 1 ))
    case $(( k % 3 )) in
      1) ip -n "gasloc${bed}r$r" link set eth0 down 2>/dev/null || continue
         echo "$(now) link $r" >> "$out/faults.txt"; links=$((links + 1))
         ( sleep 8; ip -n "gasloc${bed}r$r" link set eth0 up 2>/dev/null || true ) & ;;
      2) p=$(rank_pid $r); [ -n "$p" ] && kill -9 "$p" 2>/dev/null && echo "$(now) kill $r" >> "$out/faults.txt" && kills=$((kills + 1)) ;;
      0) p=$(rank_pid $r)
         if [ -n "$p" ] && kill -STOP "$p" 2>/dev/null; then
           echo "$(now) stop $r" >> "$out/faults.txt"; stops=$((stops + 1))
           ( sleep 20; kill -CONT "$p" 2>/dev/null || true ) &
         fi ;;
    esac
  done
fi
while kill -0 "$launcher" 2>/dev/null; do
  sleep $(( RANDOM % 10 + 15 ))
  r=$(( RANDOM % 8 )); p=$(rank_pid $r)
  [ -n "$p" ] && kill -9 "$p" 2>/dev/null && echo "$(now) kill $r" >> "$out/faults.txt" && kills=$((kills + 1))
  next_stop=$(( next_stop - 20 ))
  if [ $next_stop -le 0 ]; then
    s=$(( (r + 1 + RANDOM % 7) % 8 )); q=$(rank_pid $s)
    if [ -n "$q" ]; then
      kill -STOP "$q" 2>/dev/null && echo "$(now) stop $s" >> "$out/faults.txt" && stops=$((stops + 1))
      ( sleep 30; kill -CONT "$q" 2>/dev/null || true ) &
    fi
    next_stop=$(( RANDOM % 60 + 60 ))
  fi
done
set +e; wait "$launcher"; rc=$?; set -e
echo "$rc $(printf '%.0f' "$(now)")" > "$out/status"
"$G" launch $netns -n $n -- "$G" train "${job[@]}" --set train.steps="$steps" --set train.run_dir="$out/clean" > "$out/clean.log" 2>&1
report
