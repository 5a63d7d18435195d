#!/usr/bin/env bash
# The table "Gossip codecs on the nano job" in docs/communication.md: GASLoC on 4 in-process
# workers of the nano preset (research data, H = 10, 120 steps, seed 1), uncompressed and with
# each gossip codec, on 1peer and 2peer graphs. One seed and no tuning: it compares what each
# codec does to the workers' consensus and to the bytes they send, not final losses (all runs
# pass the unigram baseline; their losses differ by under 0.5%). About 3 minutes on 2 cores.
#   scripts/table_gossip_codecs.sh [OUT_DIR]   (default runs/gossip_codecs)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gossip_codecs}
G=${GASLOC:-build/gasloc}
[ -x "$G" ] || { echo "table_gossip_codecs: build gasloc first (cmake --build build)" >&2; exit 1; }
[ -f data/micro1024/dataset.json ] || { source scripts/lib/results.sh; research_data; }
mkdir -p "$out"
run() {
  local name=$1 topo=$2; shift 2
  rm -rf "${out:?}/$name"
  "$G" train -c configs/research.toml --set model.preset=nano --set cluster.workers=4 --set algo.name=gasloc \
    --set algo.topology="$topo" --set algo.H=10 --set train.steps=120 --set train.eval_every=60 \
    --set train.log_every=10 --set train.checkpoint_every=0 --set train.run_dir="$out/$name" "$@" >"$out/$name.log" 2>&1 ||
    { tail -3 "$out/$name.log" >&2; exit 1; }
  # Chunks resent in fp32 after a wrap (modulo), from worker 0's last train line.
  local resends
  resends=$(grep '"event":"train"' "$out/$name/metrics.jsonl" | grep '"worker":0}' | tail -1 |
            sed -n 's/.*"codec_resends":\([0-9]*\).*/\1/p' || true)
  echo "$name ${resends:--}" >>"$out/resends.txt"
}
: >"$out/resends.txt"
runs=()
for topo in 1peer 2peer; do
  run "$topo-none" "$topo"
  run "$topo-int8-direct" "$topo" --set algo.compression=int8 --set algo.gossip_codec=direct
  run "$topo-int8-delta-K5" "$topo" --set algo.compression=int8 --set algo.gossip_codec=delta
  run "$topo-int4-delta-K2" "$topo" --set algo.compression=int4 --set algo.gossip_codec=delta --set algo.reference_every=2
  run "$topo-int4-delta-K5" "$topo" --set algo.compression=int4 --set algo.gossip_codec=delta
  for m in 4 8 16; do run "$topo-int8-modulo-m$m" "$topo" --set algo.compression=int8 --set algo.gossip_codec=modulo --set algo.modulo_margin=$m; done
  for m in 2 4; do run "$topo-int4-modulo-m$m" "$topo" --set algo.compression=int4 --set algo.gossip_codec=modulo --set algo.modulo_margin=$m; done
done
for f in "$out"/*/metrics.jsonl; do runs+=("$(dirname "$f")"); done
"$G" report "${runs[@]}"
echo
echo "chunks worker 0 resent in fp32 after a wrap (modulo; its chunks a round: $(( ($(grep -o '"num_params": *[0-9]*' "${runs[0]}/run.json" | head -1 | tr -dc 0-9) + 255) / 256 )) x its neighbours):"
cat "$out/resends.txt"
