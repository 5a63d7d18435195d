#!/usr/bin/env bash
# GPU check (not part of CI): on a machine with an NVIDIA GPU and PyTorch 2.x, builds gasloc
# against the LibTorch inside the Python package, then runs a short CUDA training at fp32 and
# bf16 and prints the throughput, then checks the NCCL backend with gasloc comm-check.
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
