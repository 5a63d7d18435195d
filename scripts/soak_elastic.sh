#!/usr/bin/env bash
# Soak test of elastic Gloo runs (not in CI): 8 ranks of GASLoC-1peer under
# `gasloc launch --elastic`, a random rank SIGKILLed every ~20 s and, now and then, another
# SIGSTOPped for 30 s; then the same run without faults. Reports the failures survived, restarts
# of ranks that were not hit (goal: none), whether the run completed, its final validation loss
# against the fault-free run's (goal: within 2%), and per failure the seconds until the dead rank
# left the view and until its next incarnation was back in the mixing.
#   scripts/soak_elastic.sh MINUTES [STEPS]     (STEPS: default, about MINUTES of training)
# Every output line is time-stamped on this script's clock (soak/launch.log), so a kill, the view
# that first leaves the rank out and its rejoin are measured on one clock.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:?usage: scripts/soak_elastic.sh MINUTES [STEPS]}
G=$PWD/build/gasloc
[ -x "$G" ] || { echo "build gasloc first (scripts/setup.sh)" >&2; exit 2; }
out=runs/soak
rm -rf "$out"; mkdir -p "$out"
for i in $(seq 1 2000); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > "$out/corpus.txt"
"$G" prepare --input "$out/corpus.txt" --out "$out/data" --byte-level --val-fraction 0.1 >/dev/null
job=(--set model.preset=nano --set data.dir="$out/data" --set data.seq_len=64 --set data.batch_size=8
     --set data.val_batches=4 --set train.log_every=50 --set train.eval_every=500 --set train.checkpoint_every=500
     --set train.threads=1 --set train.blas_threads=1 --set algo.name=gasloc --set algo.topology=1peer
     --set algo.H=10 --set cluster.backend=gloo --set cluster.timeout_s=120)
# About 25 steps a second for 8 nano ranks on 2 cores; round to whole rounds.
steps=${2:-$(( minutes * 60 * 25 / 10 * 10 ))}
stamp() { local t0=$1; while IFS= read -r line; do printf '%s %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')" "$line"; done; }
now() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }'; }
delta() { [ -n "$2" ] && awk -v a="$2" -v b="$1" 'BEGIN { printf "%.1f", a - b }' || echo "?"; }

t0=$(date +%s.%N)
"$G" launch --elastic -n 8 --max-restarts 100000 --min-ranks 2 --heartbeat-timeout 10 -- "$G" train "${job[@]}" \
  --set train.steps="$steps" --set train.run_dir="$out/faults" 2>&1 | stamp "$t0" > "$out/launch.log" &
launcher=$!
rank_pid() { # the running `gasloc train` process of rank $1 in the faulted run
  pgrep -f -- "train.run_dir=$out/faults" | while read -r p; do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$1" && echo "$p"; done | head -1 || true
}
: > "$out/faults.txt"
sleep 15
kills=0 stops=0 next_stop=$(( RANDOM % 60 + 60 ))
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
echo "faulted run: status $rc, $kills kills and $stops stops in $(printf '%.0f' "$(now)") s"

"$G" launch -n 8 -- "$G" train "${job[@]}" --set train.steps="$steps" --set train.run_dir="$out/clean" > "$out/clean.log" 2>&1
final_loss() { "$G" report "$1" --csv - | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
  $2 == "eval_worker" { last[$(c["worker"])] = $(c["val_loss"]); step = $(c["step"]) }
  END { for (w in last) { s += last[w]; n++ } printf "%.4f\n", s / n }'; }
lf=$(final_loss "$out/faults"); lc=$(final_loss "$out/clean")
echo "final validation loss (mean over the ranks' own models): $lf with faults, $lc without ($(awk -v a="$lf" -v b="$lc" 'BEGIN { printf "%+.2f", 100 * (a - b) / b }')%)"
others=$(grep -c "restarts as incarnation" "$out/launch.log" || true)
echo "restarts: $others for $((kills + stops)) injected failures (more means a rank that was not hit failed too)"
# Per failure: from the fault to the first view that leaves the rank out, and to its rejoin.
while read -r t what r; do
  left=$(awk -v t="$t" -v r="$r" '$1 >= t && /left \(died/ && $0 ~ ("worker\\(s\\) ([0-9]+, )*" r "[ ,]") { print $1; exit }' "$out/launch.log")
  back=$(awk -v t="$t" -v r="$r" '$1 >= t && $0 ~ ("launch: rank " r " \\(incarnation [0-9]+\\) rejoined") { print $1; exit }' "$out/launch.log")
  printf '%s rank %s at %s s: left the view after %s s, back in the mixing after %s s\n' "$what" "$r" "$t" \
    "$(delta "$t" "$left")" "$(delta "$t" "$back")"
done < "$out/faults.txt"
