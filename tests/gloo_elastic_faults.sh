#!/usr/bin/env bash
# Elastic Gloo faults that an adversarial pass found (docs/design.md section 10, "Resuming an
# elastic run" and "A paused store host"), each a case that failed before its fix:
#  1. the launcher itself stopped (SIGSTOP) past a store call's timeout, then continued: no rank
#     is killed, the job finishes and the launcher exits 0 (it killed every rank before);
#  2. a resume from commits that differ (rank 0 at step 40, rank 1 at 30, rank 2 holding none):
#     every rank takes step 30, the one the most hold; rank 0 says it drops 40, rank 2 heals from
#     a donor at the first round; nothing waits for a timeout (it stalled, then killed ranks);
#  3. rank 0 killed in its first second: its restart joins a job that starts (every rank waited
#     for it to open the run's files until the timeout);
#  4. every rank failing at start-up with a configuration error, or on a full disk (exit status 2):
#     no restart, the launcher exits 2 naming it (it restarted them, then exited 0);
#  5. every rank killed at once: no member is left to heal from, the job stops non-zero with one
#     line per rank (it exited 0).
#   tests/gloo_elastic_faults.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
at_exit+=('umount "$tmp/full"')
prepare_corpus
job=("${nano[@]}" --set data.val_batches=2
     --set train.threads=1 --set train.blas_threads=1 --set algo.H=5 --set algo.name=gasloc --set algo.topology=1peer
     --set cluster.backend=gloo --set cluster.timeout_s=40 --set cluster.heartbeat_timeout_s=4 --set train.log_every=10)
# The pid of incarnation INC of rank R of the run in directory DIR, once it runs (empty after 15 s).
rank_pid() {
  local dir=$1 r=$2 inc=$3
  for _ in $(seq 1 1500); do
    for p in $(pgrep -f -- "--incarnation $inc .*train.run_dir=$dir" || true); do
      tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$r" && { echo "$p"; return; }
    done
    sleep 0.01
  done
}
last_step() { metric_rows "$1" train worker step | awk -v r="$2" '$1 == r' | tail -1 | awk '{print $2}'; }

# 1. A paused launcher. The pause (12 s) outlasts a heartbeat's store call (10 s) and the job's
# heartbeat timeout (4 s, from cluster.heartbeat_timeout_s: no launcher flag).
timeout 120 "$G" launch --elastic -n 3 -- "$G" train "${job[@]}" --set train.steps=400 --set train.run_dir=paused \
  > paused.log 2>&1 &
launcher=$!; pids+=("$launcher")
for _ in $(seq 1 600); do [ -f paused/metrics.jsonl ] && [ "$(wc -l < paused/metrics.jsonl)" -ge 6 ] && break; sleep 0.05; done
gasloc_launcher=$(pgrep -P "$launcher" -f "launch --elastic")
kill -STOP "$gasloc_launcher"; sleep 12; kill -CONT "$gasloc_launcher"
set +e; wait "$launcher"; rc=$?; set -e
[ $rc -eq 0 ] || fail "paused launcher: status $rc: $(grep -v '| loss\|step ' paused.log | tail -30)"
! grep -q "killed by gasloc launch\|sent no heartbeat" paused.log || fail "paused launcher: a rank was killed: $(grep '^launch' paused.log)"
grep -q "heartbeat for 4 s" paused.log || fail "paused launcher: the job's cluster.heartbeat_timeout_s was not the timeout: $(grep '^launch' paused.log | head -3)"
for r in 0 1 2; do [ "$(last_step paused $r)" = 400 ] || fail "paused launcher: rank $r did not reach step 400"; done
echo "gloo_elastic_faults (paused launcher): stopped 12 s, no rank killed, the job finished (status 0)"

# 2. Commits that differ. A run of 40 steps checkpointed every 10, then rank 1's step 40 and every
# file of rank 2 are lost (as after a crash between their commits, or a lost disk).
timeout 120 "$G" launch --elastic -n 3 -- "$G" train "${job[@]}" --set train.steps=40 --set train.checkpoint_every=10 \
  --set train.run_dir=mixed > mixed0.log 2>&1 || fail "mixed: the first run failed: $(tail -20 mixed0.log)"
rm mixed/checkpoints/step-00000040/rank1.pt mixed/checkpoints/step-000000*/rank2.pt
echo '{"steps":[30]}' > mixed/checkpoints/rank1.committed
echo '{"steps":[]}' > mixed/checkpoints/rank2.committed
start=$SECONDS
timeout 120 "$G" launch --elastic -n 3 -- "$G" train --resume mixed --set train.steps=80 > mixed.log 2>&1 ||
  fail "mixed: the resume failed: $(grep -v '| loss' mixed.log | tail -30)"
took=$((SECONDS - start))
[ $took -lt 35 ] || fail "mixed: the resume took $took s (a wait for the 40 s timeout?)"
grep -q "elastic resume at step 30, the step the most ranks hold: rank(s) 0, 1 load it; rank(s) 2 hold no checkpoint" mixed.log ||
  fail "mixed: no line says which step and who heals: $(grep -v '| loss' mixed.log | head -30)"
grep -q "worker 0: resumes at step 30 with the others; its committed step 40 is dropped" mixed.log || fail "mixed: rank 0 did not say it drops step 40"
grep -q "worker 2 caught up at round" mixed.log || fail "mixed: rank 2 did not take a donor's state: $(grep 'rank 2' mixed.log | tail)"
! grep -q "killed by gasloc launch\|restarts as incarnation" mixed.log || fail "mixed: a rank was killed: $(grep '^launch' mixed.log)"
for r in 0 1 2; do [ "$(last_step mixed $r)" = 80 ] || fail "mixed: rank $r did not reach step 80"; done
grep -q '"steps":\[80,70\]' mixed/checkpoints/rank0.committed || fail "mixed: rank 0's commits: $(cat mixed/checkpoints/rank0.committed)"
echo "gloo_elastic_faults (mixed commits): resumed at step 30 in $took s, rank 2 healed, every rank reached step 80"

# 3. Rank 0 killed within its first second.
timeout 120 "$G" launch --elastic -n 3 -- "$G" train "${job[@]}" --set train.steps=60 --set train.run_dir=early \
  > early.log 2>&1 &
launcher=$!; pids+=("$launcher")
victim=$(rank_pid early 0 0)
[ -n "$victim" ] || fail "early: rank 0 never started: $(tail early.log)"
kill -9 "$victim"
set +e; wait "$launcher"; rc=$?; set -e
[ $rc -eq 0 ] || fail "early kill: status $rc: $(grep -v '| loss' early.log | tail -30)"
grep -q "rank 0 (incarnation 1) \(re\)\?joined" early.log || fail "early kill: rank 0 did not come back: $(grep '^launch' early.log)"
for r in 0 1 2; do [ "$(last_step early $r)" = 60 ] || fail "early kill: rank $r did not reach step 60"; done
echo "gloo_elastic_faults (start-up kill): rank 0 killed at start, restarted into a job that ran to the end"

# 4. A failure that a restart would meet again.
set +e
timeout 60 "$G" launch --elastic -n 2 -- "$G" train "${job[@]}" --set data.dir=no-such-data --set train.run_dir=bad > bad.log 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || fail "bad data: status $rc (want 2): $(tail -20 bad.log)"
grep -q "which a restart would meet again; stopping the job" bad.log || fail "bad data: no reason given: $(grep '^launch' bad.log)"
! grep -q "restarts as incarnation" bad.log || fail "bad data: a rank was restarted: $(grep '^launch' bad.log)"
# ... and a full disk (a tmpfs too small for the first checkpoint; root only).
mkdir full
if mount -t tmpfs -o size=600k tmpfs full 2>/dev/null; then
  set +e
  timeout 60 "$G" launch --elastic -n 2 -- "$G" train "${job[@]}" --set train.steps=40 --set train.checkpoint_every=10 \
    --set train.run_dir=full/run > full.log 2>&1
  rc=$?
  set -e
  umount full
  [ $rc -eq 2 ] || fail "full disk: status $rc (want 2): $(tail -20 full.log)"
  grep -q "No space left on device" full.log || fail "full disk: the error was not shown: $(tail -20 full.log)"
  ! grep -q "restarts as incarnation" full.log || fail "full disk: a rank was restarted into the same disk"
else
  echo "gloo_elastic_faults: no tmpfs (not root): the full-disk case is left out"
fi
echo "gloo_elastic_faults (exit status 2): a bad data directory and a full disk are not restarted, the launcher exits 2"

# 5. Every rank killed at once.
timeout 60 "$G" launch --elastic -n 2 --max-restarts 4 -- "$G" train "${job[@]}" --set train.steps=4000 \
  --set train.run_dir=wiped > wiped.log 2>&1 &
launcher=$!; pids+=("$launcher")
for _ in $(seq 1 600); do [ -f wiped/metrics.jsonl ] && [ "$(wc -l < wiped/metrics.jsonl)" -ge 4 ] && break; sleep 0.05; done
kill -9 "$(rank_pid wiped 0 0)" "$(rank_pid wiped 1 0)"
set +e; wait "$launcher"; rc=$?; set -e
[ $rc -ne 0 ] || fail "every rank killed: the launcher exited 0: $(grep '^launch' wiped.log)"
grep -q "no member of the job is left" wiped.log || fail "every rank killed: no reason given: $(grep '^launch' wiped.log)"
for r in 0 1; do grep -q "^launch: rank $r: incarnation 0 " wiped.log || fail "every rank killed: no summary line for rank $r"; done
echo "gloo_elastic_faults (every rank killed): stopped with status $rc and a line per rank"
