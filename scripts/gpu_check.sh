#!/usr/bin/env bash
# GPU check (not part of CI): on a machine with an NVIDIA GPU and PyTorch 2.x, builds gasloc
# against the LibTorch inside the Python package, then runs a short CUDA training at fp32 and
# bf16 and prints the throughput, then checks the NCCL backend with gasloc comm-check and (with two
# GPUs) gasloc train with cluster.backend = "nccl" against the in-process run on the GPU.
# Finishes in a few minutes.
#   scripts/gpu_check.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
  echo "gpu_check: $PY cannot import torch; pass the Python that has PyTorch 2.x" >&2; exit 1; }
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device visible to PyTorch"'
for h in toml++/toml.h CLI/CLI.hpp nlohmann/json.hpp spdlog/spdlog.h sentencepiece_processor.h; do
  [ -f "/usr/include/$h" ] || echo "gpu_check: missing /usr/include/$h (install the packages in scripts/setup.sh)" >&2
done
# nccl.h for the NCCL backend: pip's nvidia-nccl-cu12 (a dependency of CUDA torch wheels).
nccl_inc=$("$PY" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "include"))' 2>/dev/null || true)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DGASLOC_BUILD_TESTS=OFF \
  ${nccl_inc:+-DNCCL_INCLUDE_DIR="$nccl_inc"} >/dev/null
cmake --build build-gpu -j"$(nproc)" --target gasloc bench_train
if [ ! -f data/default/dataset.json ]; then
  # Without the default corpus, a byte-level dataset of the sources themselves is enough here.
  build-gpu/gasloc prepare --byte-level --input $(ls src/gasloc/*/*.cpp) --out data/gpu_check
  data=data/gpu_check
else
  data=data/default
fi
for dtype in fp32 bf16; do
  rm -rf "runs/gpu_check_$dtype"
  build-gpu/gasloc train --config configs/tiny.toml --device cuda --dtype "$dtype" \
    --set data.dir="$data" --set train.steps=200 --set train.eval_every=100 \
    --set train.run_dir="runs/gpu_check_$dtype" | tail -4
done
# NCCL backend: two ranks run comm-check (all-reduce, exchanges, broadcast against exact values).
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); on a one-GPU machine that answer
# is reported and a one-rank check (process-group creation and single-rank paths only) runs instead.
ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
log=build-gpu/gpu_check_nccl.log
if NCCL_DEBUG=WARN build-gpu/gasloc launch -n 2 --timeout 120 -- gasloc comm-check --backend nccl --numel 1000000 >"$log" 2>&1; then
  grep "all checks passed" "$log"
elif [ "$ngpu" -lt 2 ] && grep -qi "duplicate gpu" "$log"; then
  echo "gpu_check: NCCL refuses two ranks on one GPU (Duplicate GPU detected); checking one NCCL rank instead"
  build-gpu/gasloc launch -n 1 -- gasloc comm-check --backend nccl --numel 1000000 | tail -1
else
  tail -30 "$log"
  echo "gpu_check: the NCCL comm-check failed (full log: $log)" >&2
  exit 1
fi
# gasloc train over NCCL (cluster.backend = "nccl", one GPU per rank) against the in-process
# reference on the GPU: the same 2-worker GASLoC job. Exchanges copy bytes, so the losses agree
# up to CUDA's own run-to-run differences (atomics in some backward kernels): within 1e-3.
if [ "$ngpu" -ge 2 ]; then
  job=(--config configs/tiny.toml --device cuda --set data.dir="$data" --set train.steps=20 --set train.log_every=1
       --set train.eval_every=10 --set algo.name=gasloc --set algo.topology=1peer --set algo.H=5)
  rm -rf runs/gpu_check_inproc runs/gpu_check_nccl
  build-gpu/gasloc train "${job[@]}" --set cluster.workers=2 --set train.run_dir=runs/gpu_check_inproc >/dev/null
  build-gpu/gasloc launch -n 2 --timeout 120 -- gasloc train "${job[@]}" --set cluster.backend=nccl \
    --set train.run_dir=runs/gpu_check_nccl >/dev/null
  G=build-gpu/gasloc
  source tests/metrics_lib.sh
  losses() { metric_rows "$1" train worker step train_loss | sort -n -k1 -k2; }
  paste <(losses runs/gpu_check_inproc) <(losses runs/gpu_check_nccl) | awk '
    { n++; d = $3 - $6; if (d < 0) d = -d; if (d > max) max = d; if ($1 != $4 || $2 != $5) bad = 1 }
    END { printf "gpu_check: NCCL training vs in-process on the GPU: %d losses, max |diff| %.3g\n", n, max;
          exit (bad || n != 40 || max > 1e-3) }' || { echo "gpu_check: NCCL training differs from the in-process run" >&2; exit 1; }
else
  echo "gpu_check: one GPU: NCCL training needs two (one per rank); skipped"
fi
