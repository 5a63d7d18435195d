#!/usr/bin/env bash
# Elastic Gloo ranks started by hand at a `gasloc store --elastic` (docs/training.md, "Elastic
# runs started by hand"), as on two hosts, with no launcher:
#  1. 4 ranks of GASLoC-1peer start one by one and the job runs once all have started;
#  2. a second process for a rank that is alive is refused, naming the rank;
#  3. a rank SIGKILLed mid-run is declared dead by the store while the others train on, and the
#     same command started again rejoins as incarnation 1 with a donor's state;
#  4. a rank SIGSTOPped past the heartbeat timeout is declared dead, leaves by itself once resumed,
#     and rejoins when started again; then Ctrl+C stops every rank at one step, checkpointed;
#  5. a rank whose WORLD_SIZE differs from the store's -n is refused, and one started with
#     cluster.join before the job has started is told it is a founder;
#  6. the run, resumed on 5 ranks at a store with --founders 4, takes rank 4 in as a joiner.
# The stores have no --heartbeat-timeout: they take the job's cluster.heartbeat_timeout_s (6 s).
#   tests/gloo_store_elastic.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
prepare_corpus

# start_store LOG ARGS...: a gasloc store in the background; sets store_port to the port it serves.
start_store() {
  local log=$1; shift
  "$G" store --elastic --port 0 "$@" > "$log" 2>&1 &
  pids+=($!)
  store_port=""
  for _ in $(seq 1 200); do
    store_port=$(grep -o 'on 127.0.0.1:[0-9]*' "$log" | head -1 | cut -d: -f2 || true)
    [ -n "$store_port" ] && break
    sleep 0.05
  done
  [ -n "$store_port" ] || fail "gasloc store $* did not start: $(cat "$log")"
}
start_store store.log -n 4 --job-id hand
port=$store_port

job=("${nano[@]}"
     --set data.val_batches=2 --set train.threads=1 --set train.blas_threads=1 --set algo.H=5
     --set train.steps=100000 --set train.log_every=20 --set train.eval_every=1000 --set train.checkpoint_every=1000
     --set algo.name=gasloc --set algo.topology=1peer --set cluster.backend=gloo --set cluster.elastic=true
     --set cluster.timeout_s=60 --set cluster.heartbeat_timeout_s=6 --set train.run_dir=run)
# rank ID LOG [WORLD]: one rank started by hand, in the background.
rank() {
  RANK=$1 WORLD_SIZE=${3:-4} MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$G" train "${job[@]}" --job-id hand \
    > "$2" 2>&1 &
  pids+=($!)
}

# 0. cluster.join before the job has started: the rank is one of its founders, and is told so.
set +e
out=$(RANK=3 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" train "${job[@]}" --job-id hand \
      --set cluster.join=true 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "the job at the store has not started yet" <<<"$out" || fail "an early joiner was not refused (status $rc): $out"

# 1. One by one: nobody trains before the last has started.
rank 0 r0.log; p0=$!
rank 1 r1.log; p1=$!
rank 2 r2.log; p2=$!
sleep 1
[ ! -f run/metrics.jsonl ] || [ "$(wc -l < run/metrics.jsonl)" -le 1 ] || fail "the job trained before rank 3 started: $(cat run/metrics.jsonl)"
rank 3 r3.log; p3=$!

# 2. A second rank 1 while rank 1 lives.
for _ in $(seq 1 300); do grep -q "all 4 ranks started" store.log && break; sleep 0.05; done
set +e
out=$(RANK=1 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" train "${job[@]}" --job-id hand 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "rank 1 is already alive" <<<"$out" || fail "a second rank 1 was not refused (status $rc): $out"
echo "gloo_store_elastic: a second process for a living rank is refused"

# 3. Kill rank 2 once the run has logged a while; start it again.
for _ in $(seq 1 400); do
  [ -f run/metrics.jsonl ] && [ "$(wc -l < run/metrics.jsonl)" -ge 12 ] && break
  sleep 0.05
done
kill -9 "$p2"
await() {  # await PATTERN WHAT: in the store's log within 30 s
  for _ in $(seq 1 600); do grep -q "$1" store.log && return 0; sleep 0.05; done
  fail "$2: $(cat store.log)"
}
await "rank 2 (incarnation 0) .*declared dead" "the store never declared rank 2 dead"
rank 2 r2b.log; p2=$!
await "rank 2 (incarnation 1) rejoined" "rank 2 did not rejoin"
grep -q "rejoined at round" r2b.log || fail "rank 2's new incarnation did not heal from a donor: $(tail -n 5 r2b.log)"
echo "gloo_store_elastic: rank 2, SIGKILLed, was declared dead; started again by hand, it rejoined with a donor's state"

# 4. Rank 1 stopped past the heartbeat timeout: declared dead, it leaves by itself when it
#    resumes (nobody can kill it from another host), and started again it rejoins.
kill -STOP "$p1"
await "rank 1 (incarnation 0) sent no heartbeat for 6 s" "the store never declared the stopped rank 1 dead after the job's 6 s"
grep -q "heartbeat timeout 6 s, the job's cluster.heartbeat_timeout_s" store.log || fail "the store did not take the job's heartbeat timeout: $(head store.log)"
kill -CONT "$p1"
set +e; wait "$p1"; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "worker 1 (incarnation 0) is not in round" r1.log ||
  fail "rank 1, declared dead, did not leave by itself (status $rc): $(tail -n 5 r1.log)"
rank 1 r1b.log; p1=$!
# Incarnation 2: the process refused in 2 used up 1 (an incarnation is claimed before it is judged).
await "rank 1 (incarnation 2) rejoined" "rank 1 did not rejoin"
echo "gloo_store_elastic: rank 1, SIGSTOPped past the heartbeat timeout, left when resumed and rejoined when started again"

# Ctrl+C to every rank: they stop at one step agreed in the store, each checkpoint committed.
for _ in $(seq 1 100); do [ "$(grep -c 'rank [12] (incarnation [12]) rejoined' store.log)" -eq 2 ] && break; sleep 0.05; done
sleep 1
kill -INT $p0 $p1 $p2 $p3
for p in $p0 $p1 $p2 $p3; do
  set +e; wait "$p"; rc=$?; set -e
  [ $rc -eq 130 ] || fail "a rank did not stop on Ctrl+C (status $rc): $(tail -n 5 r*.log)"
done
steps=$(cat r0.log r1b.log r2b.log r3.log | grep -o 'stopped after [0-9]* steps' | sort -u)
[ "$(wc -l <<<"$steps")" -eq 1 ] || fail "the ranks stopped at different steps: $steps"
n=$(printf '%08d' "$(grep -o '[0-9]*' <<<"$steps")")
for r in 0 1 2 3; do [ -f "run/checkpoints/step-$n/rank$r.pt" ] || fail "rank $r has no committed checkpoint at step $n"; done
echo "gloo_store_elastic: every rank $steps, each with its checkpoint committed"

# 5. Another world size.
set +e
out=$(RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" train "${job[@]}" --job-id hand 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "WORLD_SIZE is 3 here but the job's gasloc store serves 4 ranks" <<<"$out" ||
  fail "WORLD_SIZE 3 at a store of 4 was not refused (status $rc): $out"
echo "gloo_store_elastic: a rank of another world size is refused"

# 6. The run resumed on 5 ranks at a store with room for one more: ranks 0..3 found the job from
#    their checkpoints; rank 4, started first, waits until the job runs, then joins it with a
#    donor's state.
start_store store5.log -n 5 --founders 4 --job-id more
port5=$store_port
resumed() {
  RANK=$1 WORLD_SIZE=5 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port5 "$G" train --resume run --job-id more > "$2" 2>&1 &
  pids+=($!)
}
resumed 4 m4.log; m4=$!
sleep 1
resumed 0 m0.log; m0=$!
resumed 1 m1.log; m1=$!
resumed 2 m2.log; m2=$!
resumed 3 m3.log; m3=$!
for _ in $(seq 1 600); do grep -q "rank 4 (incarnation 0) joined" store5.log && break; sleep 0.05; done
grep -q "rank 4 (incarnation 0) started: it joins the running job" store5.log ||
  fail "rank 4 was not admitted as a joiner: $(cat store5.log)"
grep -q "worker 4 joined at round" m4.log || fail "rank 4 did not take a donor's state: $(tail -n 5 m4.log) $(cat store5.log)"
grep -q "ids 4..4 join at the first round's merge" m0.log || fail "rank 0 did not say rank 4 joins: $(head -n 5 m0.log)"
sleep 1
kill -INT $m0 $m1 $m2 $m3 $m4
for p in $m0 $m1 $m2 $m3 $m4; do
  set +e; wait "$p"; rc=$?; set -e
  [ $rc -eq 130 ] || fail "a resumed rank did not stop on Ctrl+C (status $rc): $(tail -n 5 m*.log)"
done
steps=$(cat m?.log | grep -o 'stopped after [0-9]* steps' | sort -u)
[ "$(wc -l <<<"$steps")" -eq 1 ] || fail "the resumed ranks stopped at different steps: $steps"
n=$(printf '%08d' "$(grep -o '[0-9]*' <<<"$steps")")
[ -f "run/checkpoints/step-$n/rank4.pt" ] || fail "the joined rank 4 has no committed checkpoint at step $n"
echo "gloo_store_elastic: resumed on 5 ranks at --founders 4, rank 4 joined with a donor's state and $steps"
