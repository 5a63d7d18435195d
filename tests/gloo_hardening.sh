#!/usr/bin/env bash
# What a hostile or unlucky user meets with Gloo processes, each ending in a clear error within
# its timeout (docs/communication.md, "Timeouts"):
#  1. the store's host is stopped (SIGSTOP) during the rendezvous: a rank fails within its
#     timeout saying the store did not answer, and SIGTERM ends a rank waiting there at once;
#  2. a rank stopped before an all-reduce is named by the store's arrival records, and the
#     launcher reports it as the rank that failed first;
#  3. two jobs started by hand on one port: the second job's rank is refused, both jobs named;
#  4. ranks given two different datasets of one vocabulary stop, naming data.fingerprint;
#  5. a run directory in use: a second launch, or a --resume while the run trains, is refused
#     with the holder's pid, and the first run finishes untouched;
#  6. the launcher (the store's host) stopped and a rank killed: the survivor still exits within
#     its timeout and a few seconds, its store calls bounded too;
#  7. ranks started by hand meet at a `gasloc store` (no rank hosts it); another job is refused;
#  8. a rank stopped (SIGSTOP) while its peer waits with a 120 s timeout: its heartbeat stalls,
#     and the launcher kills it and stops the job naming it within the heartbeat timeout.
#   tests/gloo_hardening.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
free_port() { echo $(( 20000 + RANDOM % 30000 )); }
listening() { ss -ltnH "sport = :$1" | grep -q .; }
prepare_corpus
job=("${nano[@]}"
     --set data.val_batches=2 --set train.log_every=5 --set train.eval_every=10 --set train.threads=1
     --set train.blas_threads=1 --set algo.name=diloco --set algo.H=5 --set cluster.backend=gloo)

# 1. Rank 0 (the store's host for ranks started by hand) stopped during the rendezvous.
port=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$G" comm-check --timeout 60 > host.log 2>&1 &
host=$!; pids+=("$host")
for _ in $(seq 1 200); do listening "$port" && break; sleep 0.05; done
listening "$port" || fail "rank 0 never listened on $port: $(cat host.log)"
kill -STOP "$host"
t0=$SECONDS
set +e
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" comm-check --timeout 3 > r1.log 2>&1
rc=$?; set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "rank 1 against a stopped store host: status $rc: $(cat r1.log)"
[ $((SECONDS - t0)) -le 12 ] || fail "rank 1 took $((SECONDS - t0)) s with a 3 s timeout"
grep -q "did not answer" r1.log || fail "rank 1 did not say the store did not answer: $(cat r1.log)"
# SIGTERM to a rank of gasloc train waiting there (timeout 60 s) ends it at once.
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" train "${job[@]}" --set train.steps=5 \
  --set cluster.timeout_s=60 --set train.run_dir=term > term.log 2>&1 &
waiter=$!; pids+=("$waiter")
# Signal it once it is connected to the stopped host, not after a fixed delay: under load a
# rank 1.5 s old may still be loading, before its signal handlers exist.
for _ in $(seq 1 400); do ss -tnpH "dport = :$port" | grep -q "\"gasloc\"" && break; sleep 0.05; done
ss -tnpH "dport = :$port" | grep -q "\"gasloc\"" || fail "the rank never connected to the stopped store host: $(cat term.log)"
t0=$SECONDS
kill -TERM "$waiter"
set +e; wait "$waiter"; rc=$?; set -e
[ $rc -ne 124 ] && [ $((SECONDS - t0)) -le 5 ] || fail "SIGTERM did not end a rank waiting for a stopped store ($rc): $(cat term.log)"
grep -q "interrupted" term.log || fail "the rank did not say it was interrupted: $(cat term.log)"
kill -9 "$host" 2>/dev/null || true
wait "$host" 2>/dev/null || true

# 2. A rank stopped before the first all-reduce: named by the arrival records, blamed first.
set +e
timeout 60 "$G" launch -n 3 --timeout 4 --grace 1 -- "$G" comm-check --numel 100 --stall-rank 2 --stall-at all_reduce \
  > stall.log 2>&1
rc=$?; set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "a stopped rank did not end the job in time ($rc): $(tail -20 stall.log)"
grep -q "never arrived at this collective (#2): rank 2 (its last: #1 barrier)" stall.log ||
  fail "the survivors did not name rank 2 from the arrival records: $(tail -20 stall.log)"
grep -q "reports that rank 2 failed first" stall.log || fail "the launcher did not blame rank 2 first: $(tail -20 stall.log)"

# 3. Two jobs on one port: job B's rank 1 is refused by job A's store, both named.
port=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" train "${job[@]}" --set train.steps=5 \
  --set cluster.timeout_s=8 --set train.run_dir=job_a > a0.log 2>&1 &
a0=$!; pids+=("$a0")
for _ in $(seq 1 200); do listening "$port" && break; sleep 0.05; done
set +e
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$G" train "${job[@]}" --set train.steps=5 \
  --set cluster.timeout_s=8 --set train.run_dir=job_b > b1.log 2>&1
rc=$?; set -e
[ $rc -eq 2 ] || fail "job B's rank joined job A's store (status $rc): $(cat b1.log)"
grep -q "run_dir=job_a" b1.log && grep -q "run_dir=job_b" b1.log || fail "the refusal does not name both jobs: $(cat b1.log)"
[ ! -e job_b/metrics.jsonl ] || fail "job B's rank trained"
kill -9 "$a0" 2>/dev/null || true
wait "$a0" 2>/dev/null || true

# 4. Two datasets of one vocabulary.
for i in $(seq 1 300); do printf 'Another text %d about cats and birds, number %d.\n\n' $i $((i % 11)); done > other.txt
"$G" prepare --input other.txt --out data1 --byte-level --val-fraction 0.1 >/dev/null
cp -r data data0
set +e
timeout 60 "$G" launch -n 2 -- bash -c 'exec "$0" train "$@" --set data.dir=data$RANK' "$G" "${job[@]}" \
  --set train.steps=5 --set cluster.timeout_s=20 --set train.run_dir=twodata > twodata.log 2>&1
rc=$?; set -e
[ $rc -ne 0 ] || fail "ranks on two datasets trained together"
grep -q "data.fingerprint is" twodata.log || fail "the data difference was not named: $(tail -20 twodata.log)"

# 5. One run directory, one job. The first run trains until interrupted.
timeout 90 "$G" launch -n 2 --timeout 20 -- "$G" train --verbose "${job[@]}" --set train.steps=100000 --set train.eval_every=0 \
  --set train.checkpoint_every=0 --set train.blas_threads=0 --set train.run_dir=busy > busy1.log 2>&1 &
first=$!; pids+=("$first")
trained() { [ -f busy/run.json ] && metric_rows busy train step 2>/dev/null | grep -q .; }
for _ in $(seq 1 100); do trained && break; sleep 0.2; done
trained || fail "the first run never trained: $(tail -20 busy1.log)"
# The thread plan (--verbose): the launcher's ranks share the host's cores instead of each taking them all.
cores=$(nproc); share=$(( cores / 2 > 0 ? cores / 2 : 1 ))
grep -qF "2 processes of this job on this host (LOCAL_WORLD_SIZE) share its $cores cores: $share BLAS thread(s) per product each (train.blas_threads overrides)" \
  busy1.log || fail "no thread plan for 2 processes on $cores cores: $(head -30 busy1.log)"
set +e
timeout 60 "$G" launch -n 2 --timeout 20 -- "$G" train "${job[@]}" --set train.steps=300 --set train.run_dir=busy > busy2.log 2>&1
rc2=$?
timeout 60 "$G" launch -n 2 --timeout 20 -- "$G" train --resume busy > busy3.log 2>&1
rc3=$?; set -e
[ $rc2 -ne 0 ] && grep -q "run directory 'busy' is in use: rank [01]'s part is held by process [0-9]" busy2.log ||
  fail "a second launch into a busy run directory ($rc2): $(tail -20 busy2.log)"
[ $rc3 -ne 0 ] && grep -q "is in use" busy3.log || fail "a --resume of a running run ($rc3): $(tail -20 busy3.log)"
# Ctrl+C to the launcher itself: GNU timeout would forward it and signal its process group too,
# and two interrupts kill the ranks without a checkpoint.
kill -INT "$(pgrep -P "$first")"
set +e; wait "$first"; set -e
grep -q "interrupted: checkpoint written at step" busy1.log ||
  fail "the first run did not survive the second users to checkpoint at Ctrl+C: $(tail -20 busy1.log)"

# 6. The launcher stopped (SIGSTOP), then a rank killed: the survivor's failure reports go to a
#    store that never answers, and must not hold it (before: 61 s at timeout 15).
timeout 60 "$G" launch -n 2 --timeout 4 --grace 1 -- "$G" comm-check --numel 100 --stall-rank 1 > stopped.log 2>&1 &
guard=$!; pids+=("$guard")
launcher=""; r0=""; r1=""
for _ in $(seq 1 200); do
  launcher=$(pgrep -P "$guard" | head -n 1 || true)
  [ -n "$launcher" ] && for p in $(pgrep -P "$launcher" || true); do
    grep -qzx RANK=0 /proc/$p/environ 2>/dev/null && r0=$p
    grep -qzx RANK=1 /proc/$p/environ 2>/dev/null && r1=$p
  done
  [ -n "$r0" ] && [ -n "$r1" ] && [ "$(ps -o stat= -p "$r1" 2>/dev/null | cut -c1)" = "T" ] && break
  sleep 0.05
done
[ -n "$r0" ] && [ -n "$r1" ] || fail "could not find the ranks of the stopped-launcher case"
kill -STOP "$launcher"
kill -9 "$r1"
t0=$SECONDS
while kill -0 "$r0" 2>/dev/null && [ "$(ps -o stat= -p "$r0" | cut -c1)" != "Z" ] && [ $((SECONDS - t0)) -le 30 ]; do sleep 0.2; done
took=$((SECONDS - t0))
kill -CONT "$launcher"
set +e; wait "$guard"; set -e
[ $took -le 15 ] || fail "with the launcher stopped, the survivor took $took s to exit (timeout 4 s)"

# 7. A standalone store for ranks started by hand.
port=$(free_port)
"$G" store --port "$port" --job-id hand > store.log 2>&1 &
st=$!; pids+=("$st")
for _ in $(seq 1 200); do listening "$port" && break; sleep 0.05; done
listening "$port" || fail "gasloc store never listened: $(cat store.log)"
for r in 0 1; do
  TORCHELASTIC_USE_AGENT_STORE=True RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 \
    "$G" comm-check --numel 100 --timeout 10 --job-id hand > hand$r.log 2>&1 &
  pids+=("$!")
done
set +e; wait "${pids[-2]}"; h0=$?; wait "${pids[-1]}"; h1=$?; set -e
[ $h0 -eq 0 ] && [ $h1 -eq 0 ] && grep -q "all checks passed" hand0.log ||
  fail "ranks at a gasloc store failed ($h0/$h1): $(cat hand0.log hand1.log | tail -20)"
set +e
TORCHELASTIC_USE_AGENT_STORE=True RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 \
  "$G" comm-check --numel 100 --timeout 10 --job-id other > other.log 2>&1
rc=$?; set -e
[ $rc -eq 2 ] && grep -q "this store serves job hand" other.log || fail "another job joined a gasloc store ($rc): $(cat other.log)"
kill -TERM "$st"; wait "$st" || fail "gasloc store did not stop cleanly on SIGTERM: $(cat store.log)"
grep -q "gasloc store: stopped" store.log || fail "gasloc store did not say it stopped: $(cat store.log)"
# 8. A stopped rank is found by its silent heartbeat, long before the collective's timeout.
t0=$SECONDS
set +e
timeout 100 "$G" launch -n 2 --timeout 120 --heartbeat-timeout 3 --grace 1 -- "$G" comm-check --numel 100 --stall-rank 1 \
  > hb.log 2>&1
rc=$?; set -e
took=$((SECONDS - t0))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "a stopped rank did not end the job ($rc): $(tail -20 hb.log)"
[ $took -le 30 ] || fail "a stopped rank ended the job after $took s, not within the 3 s heartbeat timeout and a few s"
grep -q "launch: rank 1 sent no heartbeat for 3 s (stopped, frozen or cut off from the store); gasloc launch killed it" hb.log ||
  fail "the launcher did not name the silent rank: $(tail -20 hb.log)"
grep -q "launch: rank 1 of 2 failed" hb.log || fail "the launcher did not report rank 1 as the failure: $(tail -20 hb.log)"

echo "gloo_hardening: 8 scenarios behaved"
