#!/usr/bin/env bash
# GPU check (not part of CI): on a machine with an NVIDIA GPU and PyTorch 2.x, builds gasloc
# against the LibTorch inside the Python package, then runs a short CUDA training at fp32 and
# bf16 and prints the throughput. Finishes in a few minutes.
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
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DGASLOC_BUILD_TESTS=OFF >/dev/null
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
