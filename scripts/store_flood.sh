#!/usr/bin/env bash
# The rendezvous store under a flood of connections that never prove the job's secret
# (docs/communication.md, "Authenticated jobs"): a `gasloc store --secret-file` on 127.0.0.1,
# flooders that open IDLE idle connections and HALF half-sent frames (a header announcing 64 KiB
# and all of it but one byte) and hold them, and meanwhile 2 ranks that join by hand with the
# secret and train STEPS steps of the nano preset. Prints whether the ranks joined and how long
# they took (and without the flood), what the flood opened and the store closed, the store's CPU
# time and peak memory. Loopback only, bounded (the ranks by cluster.timeout_s = 60, the script by
# `timeout`). Not in CI: about a minute on 2 cores.
#   scripts/store_flood.sh [GASLOC] [IDLE] [HALF] [STEPS]      (default build/gasloc 20000 3000 20)
set -euo pipefail
cd "$(dirname "$0")/.."
G=$(readlink -f "${1:-build/gasloc}") idle=${2:-20000} half=${3:-3000} steps=${4:-20}
[ -x "$G" ] || { echo "build gasloc first (scripts/setup.sh)" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)"
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp"
"$G" secret --out job.secret >/dev/null
for i in $(seq 1 300); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > corpus.txt
"$G" prepare --input corpus.txt --out data --byte-level --val-fraction 0.1 >/dev/null

# One flooder: COUNT connections from source address SRC, each idle or a half-sent frame, held
# until SIGTERM (one the store closes stays closed); prints "opened closed_by_store failed".
cat > flood.py <<'PY'
import selectors, signal, socket, sys
port, count, mode, src = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sel, stop, opened, closed, failed = selectors.DefaultSelector(), [False], 0, 0, 0
signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
for _ in range(count):
    if stop[0]: break
    s = socket.socket()
    s.settimeout(2)
    try:
        s.bind((src, 0)); s.connect(("127.0.0.1", port))
        if mode == "half": s.sendall((65535).to_bytes(4, "little") + b"x" * 65534)
    except OSError:
        failed += 1; s.close(); continue
    s.setblocking(False); sel.register(s, selectors.EVENT_READ); opened += 1
print("ready", flush=True)
while not stop[0]:
    for key, _ in sel.select(0.5):
        try:
            if key.fileobj.recv(4096): continue
        except BlockingIOError: continue
        except OSError: pass
        sel.unregister(key.fileobj); key.fileobj.close(); closed += 1
print(opened, closed, failed, flush=True)
PY

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$G" store --addr 127.0.0.1 --port "$port" --job-id flood --secret-file job.secret > store.log 2>&1 &
store=$!
pids+=("$store")
listening() { for _ in $(seq 100); do ss -ltnH "sport = :$port" | grep -q . && return; sleep 0.1; done; echo "no store" >&2; exit 1; }
listening
cpu() { awk '{print $14 + $15}' "/proc/$store/stat"; }
hz=$(getconf CLK_TCK)

# 2 ranks of a job with the secret, by hand at the store; "joined SECONDS" or "failed SECONDS".
train() {
  local t0=$SECONDS rc=0 run=$1 r
  local rank_pids=()
  for r in 0 1; do
    TORCHELASTIC_USE_AGENT_STORE=True RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 \
      "$G" train --set model.preset=nano --set data.dir=data --set data.seq_len=32 --set data.batch_size=4 \
      --set data.val_batches=2 --set train.threads=1 --set train.blas_threads=1 --set cluster.backend=gloo --set algo.name=diloco --set algo.H=5 \
      --set train.steps="$steps" --set train.eval_every=0 --set train.checkpoint_every=0 --set cluster.timeout_s=60 \
      --set cluster.secret_file="$tmp/job.secret" --set train.run_dir="$run" --job-id flood > "$run.$r.log" 2>&1 &
    rank_pids+=("$!")
  done
  for r in "${rank_pids[@]}"; do wait "$r" || rc=$?; done
  [ "$rc" = 0 ] && echo "joined and trained in $((SECONDS - t0)) s" || echo "FAILED (exit $rc) after $((SECONDS - t0)) s: $(tail -qn 2 "$run".*.log | tr '\n' ' ')"
}

echo "without a flood: 2 ranks $(train quiet)"
rss() { awk '/VmHWM/ {printf "%.0f MB", $2 / 1024}' "/proc/$store/status"; }
quiet_rss=$(rss)
kill -9 "$store"; wait "$store" 2>/dev/null || true
"$G" store --addr 127.0.0.1 --port "$port" --job-id flood --secret-file job.secret > store.log 2>&1 &
store=$!
pids+=("$store")
listening
cpu0=$(cpu) t0=$SECONDS
flooders=() per=5000 n=0
for ((left = idle; left > 0; left -= per)); do
  n=$((n + 1)); python3 flood.py "$port" $((left < per ? left : per)) idle "127.0.0.$((n + 1))" > "flood$n.out" &
  flooders+=("$!")
done
n=$((n + 1)); python3 flood.py "$port" "$half" half "127.0.0.$((n + 1))" > "flood$n.out" &
flooders+=("$!")
pids+=("${flooders[@]}")
sleep 1
echo "under the flood: 2 ranks $(train flooded)"
for _ in $(seq 600); do [ "$(cat flood*.out | grep -c ready)" = "${#flooders[@]}" ] && break; sleep 0.1; done
kill -TERM "${flooders[@]}"
wait "${flooders[@]}" 2>/dev/null || true
read -r opened closed failed < <(grep -hv ready flood*.out | awk '{o += $1; c += $2; f += $3} END {print o, c, f}')
echo "the flood: $opened connections opened ($failed failed to open), $closed of them closed by the store"
echo "the store: $(awk -v t=$((SECONDS - t0)) -v c=$(( $(cpu) - cpu0 )) -v hz="$hz" 'BEGIN {printf "%.1f s of CPU in %d s", c / hz, t}'), peak RSS $(rss) (without the flood: $quiet_rss)"
