#!/usr/bin/env bash
# gasloc launch --netns: every rank its own network namespace on a private bridge, links shaped
# with tbf. Needs root and network namespaces; elsewhere it says why and is skipped (exit 77).
#  1. comm-check measures each rank's real exchange rate: a 10% straggler's is within 20% of the
#     configured rate, the others are not slowed by it;
#  2. faults on real links, each bounded: a rank's link set down mid-exchange, a link shaped down
#     to a trickle, a stalled rank (SIGSTOP): the survivors stop within the timeout naming it;
#  3. a training rank killed with SIGKILL: the launcher names it, --resume (again under --netns)
#     finishes the run;
#  4. elastic (launch --elastic): a rank's link down for 8 s: the others train on, nobody restarts
#     but it;
#  5. --keep leaves the test bed, --cleanup removes it;
#  6. compressed rounds on the wire: the bytes the kernel counted on each rank's veth match the
#     run's bytes_sent within 5% (TCP/IP headers, the store and the control channel are the
#     difference), uncompressed DiLoCo, int4 DiLoCo and int8 modulo GASLoC, and the kernel's bytes
#     fall by the codec's ratio.
#   tests/netns_launch.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: launch --netns needs root"; exit 77; fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then echo "SKIP: no ip/tc (apt-get install iproute2)"; exit 77; fi
if ! ip netns add gasloc_probe 2>/dev/null; then echo "SKIP: network namespaces are not available here"; exit 77; fi
ip netns del gasloc_probe
at_exit+=('"$G" launch --cleanup >/dev/null')
links=(--netns-set network.preset=straggler_bw10 --netns-set network.bandwidth_gbit=0.2)   # 25 MB/s; rank 3 2.5 MB/s

# 1. Measured rates.
timeout 60 "$G" launch -n 4 --netns "${links[@]}" --timeout 30 -- gasloc comm-check --numel 1000 --measure-bandwidth 8 > bw.log 2>&1 ||
  fail "comm-check under --netns failed: $(tail -20 bw.log)"
rate() { sed -nE "s/^\[rank $1\] comm-check rank $1\/4: exchange rate with rank 0 ([0-9.]+) MB\/s.*/\1/p" bw.log; }
for r in 1 2 3; do [ -n "$(rate $r)" ] || fail "no rate for rank $r: $(cat bw.log)"; done
awk -v s="$(rate 3)" 'BEGIN { exit !(s >= 2.0 && s <= 3.0) }' || fail "the straggler's rate $(rate 3) MB/s is not within 20% of 2.5"
for r in 1 2; do
  awk -v s="$(rate $r)" 'BEGIN { exit !(s >= 17.5) }' || fail "rank $r's rate $(rate $r) MB/s is slowed (configured 25)"
done
echo "netns_launch: measured rates (MB/s): rank 1 $(rate 1), rank 2 $(rate 2), straggler $(rate 3) (configured 25, 25, 2.5)"

# 2. Faults on real links. $1: what to do to rank 3's host once its measurement is under way.
fault() {
  local name=$1; shift
  timeout 60 "$G" launch -n 4 --netns "${links[@]}" --timeout 5 --grace 1 -- gasloc comm-check --numel 1000 \
    --measure-bandwidth 40 > "$name.log" 2>&1 &
  local launcher=$!
  # Rank 3 prints this between the barrier and its 16 s exchange with rank 0: a fault before it
  # would hit the barrier, which cannot tell which rank is missing.
  for _ in $(seq 1 400); do grep -q "\[rank 3\] comm-check rank 3/4: measuring" "$name.log" 2>/dev/null && break; sleep 0.05; done
  local id; id=$(sed -nE 's/.*hosts on bridge glb([0-9]+) .*/\1/p' "$name.log")
  [ -n "$id" ] || fail "$name: no test bed line: $(cat "$name.log")"
  "$@" "gasloc${id}r3"
  local t0=$SECONDS rc=0
  wait $launcher || rc=$?
  [ $rc -ne 0 ] || fail "$name: the run did not fail"
  [ $rc -ne 124 ] || fail "$name: the launcher hung"
  [ $((SECONDS - t0)) -le 30 ] || fail "$name: stopping took $((SECONDS - t0)) s"
  grep -q "rank 3" "$name.log" || fail "$name: rank 3 is not named: $(tail -20 "$name.log")"
  grep -qE "reports that rank 3 failed first|the failure started at rank 3|exchange with rank 3 (timed out|failed)" "$name.log" ||
    fail "$name: the survivors do not blame rank 3: $(grep -E 'error|launch:' "$name.log" | head)"
}
link_down() { ip -n "$1" link set eth0 down; }
trickle() { tc -n "$1" qdisc replace dev eth0 root tbf rate 8kbit burst 65536 latency 100ms; }
fault link_down link_down
fault trickle trickle
# A stalled rank: comm-check stops itself with SIGSTOP before its exchange.
timeout 60 "$G" launch -n 3 --netns "${links[@]}" --timeout 4 --grace 1 -- gasloc comm-check --numel 1000 --stall-rank 1 \
  > stall.log 2>&1 && fail "a stalled rank did not fail the run"
grep -q "reports that rank 1 failed first" stall.log || fail "the stalled rank is not named: $(tail -20 stall.log)"
echo "netns_launch: a link set down, a trickle and a stalled rank each stopped the run naming the rank"

# 3. SIGKILL of a training rank, resume under --netns.
prepare_corpus 200
job=("${nano[@]}" --set data.val_batches=2
     --set train.steps=40 --set train.log_every=5 --set train.eval_every=20 --set train.checkpoint_every=5
     --set train.threads=1 --set train.blas_threads=1 --set algo.name=diloco --set algo.H=5 --set cluster.backend=gloo
     --set train.run_dir=run --set network.bandwidth_gbit=0.5)
timeout 60 "$G" launch -n 2 --netns --timeout 10 -- "$G" train "${job[@]}" > k1.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do [ -f run/checkpoints/rank1.committed ] && break; sleep 0.05; done
# The first process whose environment has RANK=1 (the loop stops there: a `| head -1` would let
# pipefail fail the script when a second match is written after head has exited).
victim=$(pgrep -f -- "--set train.run_dir=run" | while read -r p; do
  if grep -qzx RANK=1 /proc/$p/environ 2>/dev/null; then echo "$p"; break; fi; done)
[ -n "$victim" ] || fail "could not find training rank 1: $(tail k1.log)"
kill -9 "$victim"
rc=0; wait $launcher || rc=$?
if [ $rc -ne 0 ]; then
  grep -q "rank 1 of 2 failed with signal 9" k1.log || fail "the launcher did not name rank 1: $(tail -20 k1.log)"
fi
timeout 60 "$G" launch -n 2 --netns --timeout 10 -- "$G" train --resume run > k2.log 2>&1 || fail "resume failed: $(tail -20 k2.log)"
grep -q "done after 40 steps" k2.log || fail "the resumed run did not finish: $(tail -20 k2.log)"

# 4. Elastic: rank 2's link set down for 8 s in GASLoC-1peer. Its heartbeat stalls, the launcher
# kills it, its partners' waits are aborted (a dead link sends them no reset) and the others train
# on without a restart; rank 2's next incarnation rejoins once its link is back.
ejob=("${nano[@]}" --set data.val_batches=2
      --set train.steps=400 --set train.log_every=20 --set train.eval_every=200 --set train.threads=1
      --set train.blas_threads=1 --set algo.name=gasloc --set algo.topology=1peer --set algo.H=5
      --set cluster.backend=gloo --set cluster.timeout_s=120 --set train.run_dir=elastic)
timeout 200 "$G" launch -n 4 --netns --elastic --heartbeat-timeout 4 --max-restarts 3 -- "$G" train "${ejob[@]}" > el.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do [ -f elastic/metrics.jsonl ] && [ "$(wc -l < elastic/metrics.jsonl)" -ge 8 ] && break; sleep 0.05; done
id=$(sed -nE 's/.*hosts on bridge glb([0-9]+) .*/\1/p' el.log)
[ -n "$id" ] || fail "elastic: no test bed line: $(head el.log)"
t0=$SECONDS
ip -n "gasloc${id}r2" link set eth0 down
sleep 8
ip -n "gasloc${id}r2" link set eth0 up
rc=0; wait $launcher || rc=$?
[ $rc -eq 0 ] || fail "elastic: the run did not complete through a dead link (status $rc): $(grep -v '| loss' el.log | tail -20)"
grep -q "worker(s) 2 left" el.log || fail "elastic: rank 2 never left the view: $(grep -v '| loss' el.log | tail -20)"
! grep -E "launch: rank [013] \(incarnation" el.log | grep -q failed || fail "elastic: a survivor failed: $(grep '^launch:' el.log)"
[ $((SECONDS - t0)) -lt 100 ] || fail "elastic: the survivors waited $((SECONDS - t0)) s (the collective timeout is 120 s)"
echo "netns_launch: elastic: a dead link cost its rank, the others trained on ($((SECONDS - t0)) s from the cut to the end)"

# 5. --keep and --cleanup.
timeout 60 "$G" launch -n 2 --netns --keep -- gasloc comm-check --numel 100 > keep.log 2>&1 || fail "--keep run failed: $(tail keep.log)"
id=$(sed -nE 's/.*hosts on bridge glb([0-9]+) .*/\1/p' keep.log)
ip netns list | grep -q "gasloc${id}r0" || fail "--keep did not keep the namespaces"
"$G" launch --cleanup | grep -q "removed" || fail "--cleanup said nothing"
! ip netns list | grep -q "gasloc${id}r" || fail "--cleanup left namespaces"
[ ! -e "/sys/class/net/glb${id}" ] || fail "--cleanup left the bridge"
# 6. Bytes on the wire, counted by the kernel. 100 steps of H = 5 (20 rounds), no evaluation of
# the average model (which is sent on the control channel, outside bytes_sent).
wire() {
  local name=$1; shift
  timeout 120 "$G" launch -n 2 --netns --keep --timeout 30 -- "$G" train --set model.preset=nano --set data.dir=data \
    --set data.seq_len=32 --set data.batch_size=4 --set data.val_batches=2 --set train.steps=100 --set train.log_every=100 \
    --set train.eval_every=0 --set train.eval_model=local --set train.threads=1 --set train.blas_threads=1 --set algo.H=5 \
    --set cluster.backend=gloo --set train.run_dir="$name" "$@" > "$name.log" 2>&1 || fail "$name: $(tail -20 "$name.log")"
  local id; id=$(sed -nE 's/.*hosts on bridge glb([0-9]+) .*/\1/p' "$name.log")
  for r in 0 1; do
    local tx sent
    tx=$(ip netns exec "gasloc${id}r$r" cat /sys/class/net/eth0/statistics/tx_bytes)
    sent=$(metric_rows "$name" train worker step bytes_sent | awk -v r="$r" '$1 == r && $2 == 100 { print $3 }')
    [ -n "$sent" ] && [ "$sent" -gt 0 ] || fail "$name: no bytes_sent for rank $r"
    awk -v t="$tx" -v s="$sent" 'BEGIN { exit !(t >= s && t <= 1.05 * s) }' ||
      fail "$name: rank $r: the kernel counted $tx bytes on its veth, the run $sent (not within 5%)"
    echo "$name $r $tx $sent" >> wire.txt
  done
  "$G" launch --cleanup >/dev/null
}
rm -f wire.txt
wire plain --set algo.name=diloco
wire int4 --set algo.name=diloco --set algo.compression=int4
wire modulo8 --set algo.name=gasloc --set algo.topology=1peer --set algo.compression=int8 --set algo.gossip_codec=modulo
# int4 sends 4 + 32/256 bits a value for fp32's 32: 7.76x fewer counted, and the kernel's bytes fall
# at least 95% as much (the fixed part, store and control channel, does not shrink).
awk '$2 == 0 { tx[$1] = $3; sent[$1] = $4 } END {
  r = sent["plain"] / sent["int4"]; k = tx["plain"] / tx["int4"];
  printf "netns_launch: bytes on the wire (kernel / bytes_sent): plain %.3f, int4 %.3f, modulo int8 %.3f; int4 %.2fx fewer counted, %.2fx on the wire\n",
    tx["plain"] / sent["plain"], tx["int4"] / sent["int4"], tx["modulo8"] / sent["modulo8"], r, k;
  exit !(r >= 7.5 && k >= 0.95 * r) }' wire.txt || fail "the kernel's bytes did not fall by int4's ratio: $(cat wire.txt)"

echo "netns_launch: all checks passed"
