#!/usr/bin/env bash
# Soak test of elastic Gloo runs (not in CI): 8 ranks of GASLoC-1peer under
# `gasloc launch --elastic`, a random rank SIGKILLed every ~20 s and, now and then, another
# SIGSTOPped for 30 s; then the same run without faults. Reports the failures survived, restarts
# of ranks that were not hit (goal: none), whether the run completed, its final validation loss
# against the fault-free run's (goal: within 2%), and per failure the seconds until the dead rank
# left the view and until its next incarnation was back in the mixing.
#   scripts/soak_elastic.sh [--netns] [--launcher-faults] [--out DIR] MINUTES [STEPS]   (STEPS: default, about MINUTES of training)
#   scripts/soak_elastic.sh [--netns] [--launcher-faults] [--out DIR] --report          (the report of a finished soak)
# DIR: default runs/soak (runs/soak-netns with --netns).
# --netns (root): 4 ranks, each its own host on shaped links (`gasloc launch --netns`), and the
# faults take turns in a fixed order every ~20 s: a rank's link set down for 8 s (a dead link,
# not a dead process), a SIGKILL, a SIGSTOP for 20 s.
# --launcher-faults: besides the ranks' faults, every ~3 minutes in turn the launcher itself is
# stopped (SIGSTOP) for 15 s, or killed with the whole job (its ranks die with it), which is then
# resumed (`gasloc train --resume`) and one of its ranks killed within its first second. Each
# goes to DIR/launcher_faults.txt; the report counts them, the resumes' agreed steps and whether
# a rank was killed for the launcher's pause. DIR: default runs/soak-launcher.
# Every output line is time-stamped on this script's clock (DIR/launch.log), so a kill, the view
# that first leaves the rank out and its rejoin are measured on one clock (scripts/lib/soak_report.awk).
set -euo pipefail
cd "$(dirname "$0")/.."
netns="" out="" lfaults=""
[ "${1:-}" = "--netns" ] && { netns=--netns; shift; }
[ "${1:-}" = "--launcher-faults" ] && { lfaults=1; shift; }
[ "${1:-}" = "--out" ] && { out=${2:?--out needs a directory}; shift 2; }
minutes=${1:?usage: scripts/soak_elastic.sh [--netns] [--out DIR] MINUTES [STEPS]}
n=8; [ -n "$netns" ] && n=4
G=$PWD/build/gasloc
[ -x "$G" ] || { echo "build gasloc first (scripts/setup.sh)" >&2; exit 2; }
out=${out:-runs/soak${netns:+-netns}${lfaults:+-launcher}}
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
  [ -f "$out/launcher_faults.txt" ] || return 0
  echo "launcher faults: $(grep -c " pause" "$out/launcher_faults.txt" || true) pauses of 15 s, $(grep -c " crash" "$out/launcher_faults.txt" || true) whole-job crashes, each resumed with a start-up kill"
  echo "ranks killed for a missing heartbeat: $(grep -c "sent no heartbeat" "$out/launch.log" || true) (every one of them a stopped rank: $(grep -c " stop " "$out/faults.txt" || true) stops)"
  grep -o "elastic resume at step .*" "$out/launch.log" | sed 's/^/  /' || true
  grep -o "worker [0-9]*: resumes at step [0-9]* with the others; its committed step [0-9]* is dropped" "$out/launch.log" | sed 's/^/  /' || true
  grep -E "launch: the job|launch: rank [0-9]+: " "$out/launch.log" | tail -$((n + 1)) | sed 's/^/  /'
}
[ "$minutes" = "--report" ] && { report; exit 0; }
rm -rf "$out"; mkdir -p "$out"
for i in $(seq 1 2000); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > "$out/corpus.txt"
"$G" prepare --input "$out/corpus.txt" --out "$out/data" --byte-level --val-fraction 0.1 >/dev/null

t0=$(date +%s.%N)
start_job() {  # the faulted run, or (with --resume) its continuation after a crash; appends to launch.log
  "$G" launch $netns --elastic -n $n --max-restarts 100000 --min-ranks 2 --heartbeat-timeout 10 -- "$G" train "$@" \
    2>&1 | stamp "$t0" >> "$out/launch.log" &
  launcher=$!
}
: > "$out/launch.log"
start_job "${job[@]}" --set train.steps="$steps" --set train.run_dir="$out/faults"
launch_pid() { pgrep -f -- "launch $netns *--elastic .*train.run_dir=$out/faults|launch $netns *--elastic .*--resume $out/faults" | head -1; }
rank_pid() { # the running `gasloc train` process of rank $1 in the faulted run
  pgrep -f -- "train.run_dir=$out/faults|--resume $out/faults" | while read -r p; do
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
next_lfault=90 lkind=0
[ -n "$lfaults" ] && : > "$out/launcher_faults.txt"
while kill -0 "$launcher" 2>/dev/null; do
  sleep $(( RANDOM % 10 + 15 ))
  next_lfault=$(( next_lfault - 20 ))
  if [ -n "$lfaults" ] && [ $next_lfault -le 0 ]; then
    next_lfault=$(( RANDOM % 60 + 150 )); lkind=$(( 1 - lkind )); lp=$(launch_pid)
    if [ -n "$lp" ] && [ $lkind -eq 1 ]; then
      kill -STOP "$lp" && echo "$(now) pause" >> "$out/launcher_faults.txt"; sleep 15; kill -CONT "$lp"
    elif [ -n "$lp" ]; then
      kill -9 "$lp" && echo "$(now) crash" >> "$out/launcher_faults.txt"
      while pgrep -f -- "train.run_dir=$out/faults|--resume $out/faults" | grep -qv "^$$\$"; do sleep 0.2; done
      wait "$launcher" 2>/dev/null || true
      start_job --resume "$out/faults"
      r=$(( RANDOM % 8 ))
      for _ in $(seq 1 500); do p=$(rank_pid $r); [ -n "$p" ] && break; sleep 0.01; done
      [ -n "$p" ] && kill -9 "$p" 2>/dev/null && echo "$(now) kill $r" >> "$out/faults.txt" && echo "$(now) startkill $r" >> "$out/launcher_faults.txt"
    fi
    continue
  fi
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
