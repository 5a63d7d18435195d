#!/usr/bin/env bash
# Elastic Gloo runs under `gasloc launch --elastic` (docs/training.md, "Elastic runs over Gloo"):
#  1. without a failure, 4 elastic Gloo ranks train exactly as the in-process reference: the same
#     training losses bit for bit for GASLoC-2peer (pair groups), DiLoCo (its all-reduce over pair
#     groups sums in id order, as the reference does) and DAdam (a round every step); and with network.throttle_gloo, held to its links' limit;
#  2. GASLoC-1peer with a rank SIGKILLed mid-run: the others never stop (none is restarted), the rank leaves the
#     view, restarts, takes a donor's state and finishes; every rank ends at the last step with
#     its final checkpoint committed;
#  3. DiLoCo with a rank SIGKILLed: the aborted all-reduces are retried over the survivors, and
#     so are compressed ones (int8; int4 gives the reference's bits without a failure); GASLoC's
#     int4 modulo gossip drops the dead rank's edges, and the rejoined rank's pairs resend in fp32;
#  4. a rank SIGSTOPped past the heartbeat timeout: the launcher kills it, and it rejoins;
#  5. --min-ranks above -n or without --elastic, and --elastic around another command, are refused;
#  6. a run resumed on fewer workers than saved it continues each id from its own checkpoint; one
#     resumed on more starts the ranks beyond as joiners (cluster.join), healed from a donor;
#  and Ctrl+C stops every rank at one step, from which --resume continues bit for bit.
#   tests/gloo_elastic.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
prepare_corpus
base=("${nano[@]}"
      --set data.val_batches=2 --set train.threads=1 --set train.blas_threads=1 --set algo.H=5)
extract() { metric_rows "$1" train worker step train_loss | sort -n -k1 -k2; }

# 1. The reference's bits.
same_bits() {
  local name=$1; shift
  local job=("${base[@]}" --set train.steps=20 --set train.log_every=1 --set train.eval_every=10 "$@")
  "$G" train "${job[@]}" --set cluster.workers=4 --set cluster.elastic=true --set train.run_dir="$name-inproc" >/dev/null
  timeout 120 "$G" launch --elastic -n 4 -- "$G" train "${job[@]}" --set cluster.backend=gloo --set cluster.timeout_s=60 \
    --set train.run_dir="$name-gloo" > "$name.log" 2>&1 || fail "$name: the elastic Gloo run failed: $(tail -20 "$name.log")"
  extract "$name-inproc" > "$name-a.txt"
  extract "$name-gloo" > "$name-b.txt"
  [ "$(wc -l < "$name-a.txt")" -eq 80 ] || fail "$name: expected 80 loss lines, got $(wc -l < "$name-a.txt")"
  diff "$name-a.txt" "$name-b.txt" >/dev/null || fail "$name: in-process and elastic Gloo losses differ: $(diff "$name-a.txt" "$name-b.txt" | head)"
  echo "gloo_elastic ($name): 80 training losses match the in-process reference exactly"
}
same_bits gasloc2 --set algo.name=gasloc --set algo.topology=2peer
same_bits diloco --set algo.name=diloco
same_bits dadam --set algo.name=dadam --set algo.topology=2peer --set algo.H=1
same_bits diloco_int4 --set algo.name=diloco --set algo.compression=int4
same_bits gasloc2_modulo --set algo.name=gasloc --set algo.topology=2peer --set algo.compression=int8 --set algo.gossip_codec=modulo
same_bits gasloc1_delta --set algo.name=gasloc --set algo.topology=1peer --set algo.compression=int8 --set algo.gossip_codec=delta \
  --set algo.reference_every=2
# network.throttle_gloo holds each rank's pair links to network.bandwidth_gbit: the same bits, and
# at least the time the limit asks for. 4 rounds of a payload to 2 peers each way at 1.25 MB/s;
# the token bucket makes a rank wait at least that long in all (a lower bound, never flaky).
same_bits throttled --set algo.name=gasloc --set algo.topology=2peer --set network.throttle_gloo=true \
  --set network.bandwidth_gbit=0.01
payload=$(metric_rows throttled-gloo train worker step bytes_sent | awk '$1 == 0 && $2 == 5 { print $3 }')
[ -n "$payload" ] && [ "$payload" -gt 0 ] || fail "throttled: no bytes sent by worker 0 after its first round"
while read -r worker idle sent; do
  # bytes_sent counts what this rank sent; its peers sent it as much, and both directions pay.
  awk -v i="$idle" -v b="$sent" 'BEGIN { exit !(i >= 0.9 * b / 1.25e6) }' ||
    fail "throttled: worker $worker sent $sent bytes in $idle s of waiting, under the 1.25 MB/s limit's $(awk -v b="$sent" 'BEGIN { print b / 1.25e6 }') s"
done < <(metric_rows throttled-gloo train worker step idle_s bytes_sent | awk '$2 == 20 { print $1, $3, $4 }')
echo "gloo_elastic (throttled): the same bits, every rank held to the link's limit ($payload bytes a round to its peers)"

# Ctrl+C to the launcher: every rank stops at the step agreed in the store, and --resume continues
# each from its own checkpoint, bit for bit as the uninterrupted run.
resume_job=("${base[@]}" --set train.steps=100 --set train.log_every=10 --set train.eval_every=50
            --set train.checkpoint_every=50 --set algo.name=gasloc --set algo.topology=1peer --set cluster.backend=gloo)
timeout 120 "$G" launch --elastic -n 4 -- "$G" train "${resume_job[@]}" --set train.run_dir=whole > whole.log 2>&1 ||
  fail "uninterrupted elastic run: $(tail -20 whole.log)"
timeout 120 "$G" launch --elastic -n 4 -- "$G" train "${resume_job[@]}" --set train.run_dir=cut > cut.log 2>&1 &
launcher=$!; pids+=("$launcher")
for _ in $(seq 1 400); do [ -f cut/metrics.jsonl ] && [ "$(wc -l < cut/metrics.jsonl)" -ge 6 ] && break; sleep 0.05; done
# To the launcher itself: GNU timeout would forward it and signal its process group too, and a
# second interrupt kills every rank (status 137), which happened under load.
kill -INT "$(pgrep -P "$launcher")"
set +e; wait "$launcher"; rc=$?; set -e
[ $rc -eq 130 ] || fail "interrupted elastic run: status $rc: $(tail -20 cut.log)"
stopped=$(grep -c "stopped after" cut.log || true)
[ "$stopped" -eq 4 ] || fail "expected 4 ranks to stop with a checkpoint, got $stopped: $(tail -20 cut.log)"
[ "$(grep -o 'stopped after [0-9]* steps' cut.log | sort -u | wc -l)" -eq 1 ] || fail "the ranks stopped at different steps: $(grep 'stopped after' cut.log)"
timeout 120 "$G" launch --elastic -n 4 -- "$G" train --resume cut > cut2.log 2>&1 || fail "elastic resume: $(tail -20 cut2.log)"
extract whole > whole.txt
extract cut > cut.txt
[ "$(wc -l < whole.txt)" -eq 40 ] || fail "expected 40 loss lines, got $(wc -l < whole.txt)"
diff whole.txt cut.txt >/dev/null || fail "the resumed elastic run differs: $(diff whole.txt cut.txt | head)"
echo "gloo_elastic (resume): stopped at $(grep -o 'stopped after [0-9]* steps' cut.log | head -1), resumed bit for bit"

# Resumed on fewer workers: each id left continues from its own checkpoint, so until the first
# merge after the resume its losses are the 4-worker run's bit for bit (in-process); over Gloo,
# 3 elastic ranks continue a run that 4 saved. More workers than saved are refused.
fewer=("${base[@]}" --set train.log_every=1 --set train.eval_every=10 --set train.checkpoint_every=20
       --set algo.name=gasloc --set algo.topology=1peer --set cluster.elastic=true --set cluster.workers=4)
"$G" train "${fewer[@]}" --set train.steps=40 --set train.run_dir=fewer-whole >/dev/null
"$G" train "${fewer[@]}" --set train.steps=20 --set train.run_dir=fewer-cut >/dev/null
"$G" train --resume fewer-cut --set train.steps=40 --set cluster.workers=3 > fewer.log 2>&1 || fail "resume on 3 of 4: $(tail -5 fewer.log)"
grep -q "ids 3..3 are left out" fewer.log || fail "the resume on fewer workers did not say so: $(head -5 fewer.log)"
metric_rows fewer-whole train worker step train_loss | awk '$1 < 3 && $2 > 20 && $2 <= 25' | sort -n -k1 -k2 > fewer-a.txt
metric_rows fewer-cut train worker step train_loss | awk '$2 > 20 && $2 <= 25' | sort -n -k1 -k2 > fewer-b.txt
[ "$(wc -l < fewer-a.txt)" -eq 15 ] || fail "expected 15 loss lines before the first merge, got $(wc -l < fewer-a.txt)"
diff fewer-a.txt fewer-b.txt >/dev/null || fail "resumed on 3, the ids' own steps differ: $(diff fewer-a.txt fewer-b.txt | head)"
[ "$(metric_rows fewer-cut train worker step | awk '$2 == 40' | wc -l)" -eq 3 ] || fail "3 workers did not reach step 40"
timeout 120 "$G" launch --elastic -n 3 -- "$G" train --resume whole --set train.steps=120 > fewer-gloo.log 2>&1 ||
  fail "elastic Gloo resume on 3 of 4 ranks: $(tail -20 fewer-gloo.log)"
for r in 0 1 2; do
  metric_rows whole train worker step | awk -v r=$r '$1 == r' | tail -1 | grep -q " 120$" || fail "rank $r of 3 did not reach step 120"
done
echo "gloo_elastic (fewer): resumed on 3 of 4 workers, in-process (bit for bit until the first merge) and over Gloo"

# Resumed on more: the 3 ranks' run on 5, whose ranks 3 and 4 join with a donor's state at the
# first round they find (the in-process bits are pinned in test_elastic). The run is long enough
# (36 rounds) that a joiner slowed by a loaded machine still joins before the last round.
timeout 120 "$G" launch --elastic -n 5 -- "$G" train --resume whole --set train.steps=300 > more-gloo.log 2>&1 ||
  fail "elastic Gloo resume on 5 ranks of a run saved by 3: $(tail -20 more-gloo.log)"
grep -q "ranks 3..4 join it with a donor's state" more-gloo.log || fail "the launcher did not say ranks 3..4 join: $(head more-gloo.log)"
for r in 3 4; do
  grep -q "\[rank $r\].*worker $r joined at round" more-gloo.log || fail "rank $r did not take a donor's state: $(grep "rank $r" more-gloo.log | tail)"
done
for r in 0 1 2 3 4; do
  metric_rows whole train worker step | awk -v r=$r '$1 == r' | tail -1 | grep -q " 300$" || fail "rank $r of 5 did not reach step 300"
done
echo "gloo_elastic (more): resumed on 5 ranks, ranks 3 and 4 joined with a donor's state"

# A long run of 4 elastic ranks, one of which is hit by `signal` once it has trained a while.
# Checks that the run completes, that every rank reached the last step, and that the launcher
# and the survivors said what happened (pattern).
long_job=("${base[@]}" --set train.steps=300 --set train.log_every=20 --set train.eval_every=200
          --set train.checkpoint_every=100 --set cluster.backend=gloo --set cluster.timeout_s=60)
hit() {
  local name=$1 signal=$2 pattern=$3; shift 3
  timeout 150 "$G" launch --elastic --max-restarts 2 --heartbeat-timeout 4 -n 4 -- "$G" train "${long_job[@]}" "$@" \
    --set train.run_dir="$name" > "$name.log" 2>&1 &
  local launcher=$!
  pids+=("$launcher")
  # Rank 2's first incarnation, once the run has logged its first steps.
  local victim=""
  for _ in $(seq 1 300); do
    if [ -f "$name/metrics.jsonl" ] && [ "$(wc -l < "$name/metrics.jsonl")" -ge 8 ]; then
      victim=$(pgrep -f -- "--incarnation 0 .*train.run_dir=$name" | while read -r p; do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=2 && echo "$p"; done | head -1 || true)
      [ -n "$victim" ] && break
    fi
    sleep 0.05
  done
  [ -n "$victim" ] || fail "$name: rank 2 never started: $(tail -20 "$name.log")"
  kill "-$signal" "$victim"
  set +e; wait "$launcher"; local rc=$?; set -e
  [ $rc -eq 0 ] || fail "$name: the elastic run did not complete (status $rc): $(tail -30 "$name.log")"
  grep -q "$pattern" "$name.log" || fail "$name: no '$pattern' in: $(grep -v '| loss' "$name.log" | tail -30)"
  grep -q "rank 2 (incarnation 1) rejoined" "$name.log" || fail "$name: rank 2 did not rejoin: $(grep -v '| loss' "$name.log" | tail -30)"
  # Nobody else stopped: the survivors were never restarted.
  ! grep -E "launch: rank [013] \(incarnation" "$name.log" | grep -q failed ||
    fail "$name: a surviving rank failed: $(grep '^launch:' "$name.log")"
  for r in 0 1 2 3; do
    [ -f "$name/checkpoints/step-00000300/rank$r.pt" ] || fail "$name: rank $r has no committed final checkpoint"
    metric_rows "$name" train worker step | awk -v r=$r '$1 == r' | tail -1 | grep -q " 300$" ||
      fail "$name: rank $r did not log step 300"
  done
  echo "gloo_elastic ($name): the run completed through the $signal of rank 2, which rejoined"
}
# 2-4.
hit gasloc_kill KILL "worker(s) 2 left" --set algo.name=gasloc --set algo.topology=1peer
hit diloco_kill KILL "worker(s) 2 left" --set algo.name=diloco
hit diloco_int8_kill KILL "worker(s) 2 left" --set algo.name=diloco --set algo.compression=int8
hit gasloc_modulo_kill KILL "worker(s) 2 left" --set algo.name=gasloc --set algo.topology=1peer --set algo.compression=int4 \
  --set algo.gossip_codec=modulo
hit gasloc_stop STOP "rank 2 sent no heartbeat" --set algo.name=gasloc --set algo.topology=1peer

# 5. Refused options.
set +e
out=$("$G" launch --elastic --min-ranks 5 -n 4 -- "$G" train "${base[@]}" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "min-ranks 5 is outside 1..4" <<<"$out" || fail "--min-ranks 5 of 4: $out"
set +e
out=$("$G" launch --elastic -n 2 -- "$G" comm-check 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "runs gasloc train ranks" <<<"$out" || fail "--elastic comm-check: $out"
set +e
out=$("$G" launch --min-ranks 1 -n 2 -- "$G" train "${base[@]}" 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -qF -- "--min-ranks requires --elastic" <<<"$out" || fail "--min-ranks without --elastic: $out"
echo "gloo_elastic: bad options refused"
