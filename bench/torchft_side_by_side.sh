#!/usr/bin/env bash
# DiLoCo over 4 ranks three ways, side by side (bench/torchft_diloco.py): torchft's DiLoCo wrapper
# (its Manager, ProcessGroupGloo and Lighthouse), gasloc.Run (algo.name = diloco), and by hand over
# torch.distributed Gloo (the reference, as tests/python/diloco_worker.py). The same MLP (68,353
# fp32 parameters), batches, AdamW, H and outer Nesterov step. All under `gasloc launch -n 4`: with
# root and network namespaces on its test bed (`--netns`: every rank its own host on a veth link,
# 1 Gbit/s tbf), where the bytes are the kernel's counters of each rank's eth0; elsewhere on
# loopback, where /proc/net/dev's lo counts every process's traffic (the bytes column is then
# the whole machine's, not a rank's). Seconds and bytes per round from the end of the first round
# to the end of the last but one, the mean over ranks, the median over repeats (turns alternate, the order
# rotates); the launch's wall seconds (start-up included) beside them. Then the final parameters
# of torchft and gasloc against the reference's (max abs difference over every rank's tensors).
#   bench/torchft_side_by_side.sh [ROUNDS=12] [REPEATS=3] [H=10]
# Needs build-torch2/ (scripts/setup.sh --torch pip: the Python module for PyPI's torch 2.x and a
# launcher whose store torch 2.x's clients accept) and requirements/torch2.txt's torchft in .venv;
# PYTHON, GASLOC_PYTHONPATH and LAUNCHER override where they are. NETNS=0 forces loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-12}
REPEATS=${2:-3}
H=${3:-10}
PYTHON=${PYTHON:-.venv/bin/python}
LAUNCHER=${LAUNCHER:-build-torch2/gasloc}
export PYTHONPATH=${GASLOC_PYTHONPATH:-build-torch2/python}
export BENCH_ROUNDS=$ROUNDS BENCH_H=$H
for f in "$PYTHON" "$LAUNCHER"; do [ -x "$f" ] || { echo "no $f: run scripts/setup.sh --torch pip" >&2; exit 1; }; done
"$PYTHON" -c "import torchft, gasloc" || { echo "torchft or gasloc does not import under $PYTHON" >&2; exit 1; }
bed=(--netns) where="netns test bed (kernel counters of each rank's eth0)"
if [ "${NETNS:-1}" = 0 ] || [ "$(id -u)" -ne 0 ] || ! ip netns add gasloc_tft_probe 2>/dev/null; then
  bed=() where="loopback (bytes: every process's on lo)"
else
  ip netns del gasloc_tft_probe
fi
out=$(mktemp -d)
trap '[ ${#bed[@]} -eq 0 ] || "$LAUNCHER" launch --cleanup >/dev/null 2>&1 || true; rm -rf "$out"' EXIT

one_run() {  # one_run MODE REP: launch 4 ranks; appends "MODE wall s_per_round bytes_per_round" to runs.txt
  local mode=$1 rep=$2 t0 t1 log=$out/$1.$2.log
  rm -rf "$out/$mode.run"  # gasloc.Run's run directory of the previous turn
  t0=$(date +%s.%N)
  timeout 300 "$LAUNCHER" launch -n 4 "${bed[@]}" -- "$PYTHON" bench/torchft_diloco.py "$mode" "$out/$mode" \
    > "$log" 2>&1 || { grep -v 'frame #' "$log" | tail -20 >&2; exit 1; }
  t1=$(date +%s.%N)
  sed -n 's/^\[rank [0-9]*\] BENCH //p' "$log" | "$PYTHON" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
assert len(rows) == 4, f"{len(rows)} ranks reported"
mean = lambda k: sum(r[k] for r in rows) / len(rows)
print(sys.argv[1], float(sys.argv[3]) - float(sys.argv[2]), mean("s_per_round"), mean("tx_bytes_per_round"))' \
    "$mode" "$t0" "$t1" >> "$out/runs.txt"
}
modes=(torchft gasloc torch)
for rep in $(seq 1 "$REPEATS"); do
  for i in 0 1 2; do one_run "${modes[$(( (i + rep - 1) % 3 ))]}" "$rep"; done
done

echo "torchft_side_by_side: DiLoCo, 4 ranks, MLP 8-256-256-1 (68,353 parameters), batch 32, H = $H, $ROUNDS rounds;"
echo "$where; torchft $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torchft"))'), torch $("$PYTHON" -c 'import torch; print(torch.__version__)'); median of $REPEATS alternating turns on $(nproc) cores"
"$PYTHON" - "$out" <<'EOF'
import statistics, sys, torch
out = sys.argv[1]
runs = {}
for line in open(f"{out}/runs.txt"):
    mode, *vals = line.split()
    runs.setdefault(mode, []).append([float(v) for v in vals])
med = {m: [statistics.median(col) for col in zip(*rows)] for m, rows in runs.items()}

def max_diff(mode):
    worst = 0.0
    for r in range(4):
        a, b = torch.load(f"{out}/{mode}.rank{r}.pt"), torch.load(f"{out}/torch.rank{r}.pt")
        worst = max(worst, max((a[k] - b[k]).abs().max().item() for k in b))
    return worst

names = {"torchft": "torchft DiLoCo (Manager, Lighthouse, Gloo)", "gasloc": "gasloc.Run, algo.name = diloco",
         "torch": "by hand, torch.distributed Gloo"}
print("| DiLoCo through | s/round | vs torchft | bytes/round/rank | launch wall s | max abs diff vs by hand |")
print("| --- | --- | --- | --- | --- | --- |")
for m in ("torchft", "gasloc", "torch"):
    wall, spr, bpr = med[m]
    diff = "reference" if m == "torch" else f"{max_diff(m):.3g}"
    print(f"| {names[m]} | {spr * 1e3:.1f} ms | {med['torchft'][1] / spr:.2f}x | {bpr:,.0f} | {wall:.1f} | {diff} |")
print("s/round of every turn:", {m: [round(r[1] * 1e3, 1) for r in rows] for m, rows in runs.items()})
EOF
