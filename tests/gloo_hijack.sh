#!/usr/bin/env bash
# An outsider on the host connects first to the Gloo ports of a sealed elastic job
# (docs/communication.md, "Gloo's first-come listener"). Gloo takes the first connection on each
# pair's listening port, so the honest peer's connect is refused. Before the fix the refused end
# reported its peer and gasloc launch --elastic killed it: ranks 0, 1 and 2 were restarted until
# --max-restarts ran out, and the job stopped within seconds. Now a pair group that does not form
# is tried again on fresh ports, and a report kills no rank whose heartbeat moves: the 3-rank job
# finishes with no rank restarted. Loopback only; the intruder (python3) watches /proc/net/tcp for
# new listening ports of the job's ranks and connects to the first few, as the adversarial pass did.
#   tests/gloo_hijack.sh path/to/gasloc
set -euo pipefail
G=$(readlink -f "$1")
source "$(dirname "$(readlink -f "$0")")/lib.sh"
command -v python3 >/dev/null || { echo "gloo_hijack: skipped (no python3)"; exit 0; }

prepare_corpus
"$G" secret --out job.secret >/dev/null
job=("${nano[@]}" --set data.val_batches=2 --set train.threads=1 --set train.blas_threads=1 --set algo.H=5
     --set algo.name=gasloc --set algo.topology=1peer --set cluster.backend=gloo --set cluster.timeout_s=40 --set cluster.heartbeat_timeout_s=10 --set train.log_every=10
     --set train.steps=60 --set train.run_dir=run)

# The intruder: connects to each new 127.0.0.1 listening port that a process of the job (a
# descendant of the launcher other than the launcher itself) owns, the first $2 of them, and holds
# the connections until the launcher exits. Writes how many it took to $3.
cat > intruder.py <<'EOF'
import os, socket, sys, time
launcher, most, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []
def job_sockets():
    inodes, todo = set(), children(launcher)
    while todo:
        pid = todo.pop()
        todo += children(pid)
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    return inodes
def listening_ports(inodes):
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            addr, port = fields[1].split(":")
            if fields[3] == "0A" and addr == "0100007F" and fields[9] in inodes:
                yield int(port, 16)
seen, held = set(), []
while os.path.exists(f"/proc/{launcher}") and len(held) < most:
    for port in listening_ports(job_sockets()):
        if port in seen:
            continue
        seen.add(port)
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port))
            held.append(s)
        except OSError:
            s.close()
    time.sleep(0.001)
with open(out, "w") as f:
    f.write(f"{len(held)}\n")
while os.path.exists(f"/proc/{launcher}"):
    time.sleep(0.1)
EOF

timeout 240 "$G" launch --elastic -n 3 --max-restarts 3 --secret-file job.secret -- "$G" train "${job[@]}" > job.log 2>&1 &
launcher=$!; pids+=("$launcher")
timeout 240 python3 intruder.py "$launcher" 6 taken &
intruder=$!; pids+=("$intruder")
set +e; wait "$launcher"; rc=$?; set -e
wait "$intruder" || true
[ $rc -eq 0 ] || fail "the job failed with status $rc: $(grep -v '| loss\|step ' job.log | tail -30)"
[ -s taken ] && [ "$(cat taken)" -ge 1 ] || fail "the intruder connected to no port of the job (it proved nothing)"
grep -q "did not form on try" job.log || fail "no pair group's first try was hijacked (the intruder took $(cat taken) port(s) but won no race)"
! grep -q "killed it\|restarts as incarnation\|declared dead" job.log || fail "a rank was killed or restarted: $(grep '^launch' job.log)"
for r in 0 1 2; do
  [ "$(metric_rows run train worker step | awk -v r=$r '$1 == r' | tail -1 | awk '{print $2}')" = 60 ] || fail "rank $r did not reach step 60"
done
echo "gloo_hijack: $(cat taken) port(s) taken by the intruder, $(grep -c 'did not form on try' job.log) try(s) failed and retried on fresh ports, no rank restarted, the job finished"
