#!/usr/bin/env bash
# gasloc against the same model in PyTorch eager (bench/torch_eager.py, Debian's python3-torch),
# alternating runs in one session, with the same thread settings, then the in-process cluster of
# 8 micro workers against one worker. Each gasloc round times the step with train.streams = 1 and
# with 2 (the batch's two halves on two threads, one BLAS thread each: what train.streams = 0
# plans for one worker alone on 2 cores) in one process.
# Prints a Markdown table (docs/performance.md shows it).
#
#   bench/side_by_side.sh [ROUNDS]        ROUNDS alternations per row (default 5; the best of each side is
#                                         reported: on a shared machine, other work only ever slows a run)
#   THREADS=2 bench/side_by_side.sh       LibTorch intra-op threads for both sides (default: LibTorch's)
#
# Needs build/bench_train and build/bench_cluster, /usr/bin/python3 with torch
# (apt-get install -y python3-torch), and for the cluster row a 1024-token dataset, prepared
# here on first use into build/bench_datasets/micro1024 from the default corpus. Not used by
# tests or CI.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
threads=${THREADS:-0}
steps=${STEPS:-6}
py=/usr/bin/python3
"$py" -c "import torch" 2>/dev/null || { echo "needs $py with torch: apt-get install -y python3-torch" >&2; exit 1; }
for b in bench_train bench_cluster; do
  [ -x build/$b ] || { echo "build/$b missing: cmake --build build --target $b" >&2; exit 1; }
done

best() { sort -g | tail -1; }

# row LABEL PRESET B T DIM LAYERS HEADS KV FFN VOCAB
row() {
  local label=$1 preset=$2 B=$3 T=$4 dim=$5 layers=$6 heads=$7 kv=$8 ffn=$9 vocab=${10}
  local g=() g2=() p=() gf=() roof=() line lines
  for ((r = 0; r < rounds; r++)); do
    lines=$(build/bench_train --presets "$preset" --batch "$B" --seq "$T" --steps "$steps" --threads "$threads" --streams 1,2)
    line=$(awk -v p="$preset" '$1 == p && $3 == "fused"' <<<"$lines")
    g+=("$(echo "$line" | awk '{print $5}')")
    gf+=("$(echo "$line" | awk '{print $6}')")
    roof+=("$(echo "$line" | awk '{print $7}')")
    g2+=("$(awk -v p="$preset" '$1 == p && $3 == "fused/s2" {print $5}' <<<"$lines")")
    p+=("$("$py" bench/torch_eager.py --dim "$dim" --layers "$layers" --heads "$heads" --kv-heads "$kv" --ffn "$ffn" \
      --vocab "$vocab" --batch "$B" --seq "$T" --steps "$steps" --threads "$threads" |
      "$py" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
  done
  local gm g2m pm gfm roofm
  gm=$(printf '%s\n' "${g[@]}" | best)
  g2m=$(printf '%s\n' "${g2[@]}" | best)
  pm=$(printf '%s\n' "${p[@]}" | best)
  gfm=$(printf '%s\n' "${gf[@]}" | best)
  roofm=$(printf '%s\n' "${roof[@]}" | best)
  awk -v l="$label" -v g="$gm" -v g2="$g2m" -v p="$pm" -v gf="$gfm" -v roof="$roofm" 'BEGIN {
    fpt = gf * 1e9 / g;  # FLOPs per token, from the gasloc line
    printf "| %s | %.0f | %.0f | %.2fx | %.0f | %.2fx | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f |\n", l, g, p, g / p,
           g2, g2 / p, gf, 100 * gf / roof, g2 * fpt / 1e9, 100 * g2 * fpt / 1e9 / roof, p * fpt / 1e9,
           100 * p * fpt / 1e9 / roof, roof
  }'
  echo "  (rounds: gasloc ${g[*]}; gasloc 2 streams ${g2[*]}; PyTorch $(printf '%.0f ' "${p[@]}"))" >&2
  rounds_log+="- $label: gasloc ${g[*]}; gasloc with 2 streams ${g2[*]}; PyTorch $(printf '%.0f ' "${p[@]}")"$'\n'
}

echo "side_by_side: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $rounds alternations per row, best of each side; torch threads ${threads/#0/default} on both sides"
echo
echo "| model, batch | gasloc, train.streams = 1, tokens/s | PyTorch eager tokens/s | gasloc / PyTorch | gasloc, train.streams = 2 (the default for one worker on 2 cores), tokens/s | that / PyTorch | gasloc GFLOP/s (of GEMM roof) | gasloc, 2 streams, GFLOP/s (of roof) | PyTorch GFLOP/s (of GEMM roof) | GEMM roof GFLOP/s |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
rounds_log=""
row "tiny (7.34M), B=8 T=128" tiny 8 128 256 4 8 4 768 8192
row "micro (1.00M), B=8 T=64" micro 8 64 128 4 4 2 352 1024
row "micro (1.00M), B=8 T=128" micro 8 128 128 4 4 2 352 1024
echo
echo "Every round's tokens/s, in order:"
echo
printf '%s' "$rounds_log"

data=build/bench_datasets/micro1024
if [ ! -f $data/dataset.json ]; then
  corpus=$(scripts/default_corpus.sh | head -6)
  build/gasloc prepare --input $corpus --out $data --vocab-size 1024 >/dev/null
fi
echo
cmd="build/bench_cluster --preset micro --workers 8 --batch 8 --seq 64 --steps 21 --data $data --threads $threads --rounds $rounds"
echo "In-process cluster, \`$cmd\`:"
echo
$cmd | tail -n +2
