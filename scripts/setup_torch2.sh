#!/usr/bin/env bash
# build-torch2/: gasloc compiled against PyPI's torch 2.x (the CUDA build) in the virtual
# environment .venv/, beside build/ on Debian's LibTorch 1.13 (docs/testing.md, "Two LibTorches").
# The wheel brings LibTorch, CUDA's runtime headers and NCCL; requirements/torch2.txt adds nvcc,
# which LibTorch's CMake configuration looks for. Nothing here needs a GPU: the CUDA code is
# compiled and linked, and the tests run on the CPU.
#   scripts/setup_torch2.sh        (scripts/setup.sh --torch pip runs it after the Debian packages)
#   GASLOC_TORCH2_BENCH=ON ...     # the benchmarks too (bench_train beside build/'s: docs/performance.md)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || /usr/bin/python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements/torch2.txt
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_prefix=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
# The wheels lay CUDA out for Python; CMake's FindCUDA wants a toolkit's folder (scripts/lib/).
source scripts/lib/cuda_from_wheels.sh
cuda=$(cuda_from_wheels "$site" "$PWD/.venv/cuda") ||
  { echo "setup_torch2: no nvcc in $site/nvidia/cu13 (requirements/torch2.txt pins nvidia-cuda-nvcc)" >&2; exit 1; }
# The part of the suite that runs on torch 2.x (docs/testing.md, "Two LibTorches"): the model, the
# optimizers, checkpoints and safetensors, the algorithms, both communication backends, the CLI, an
# elastic Gloo job, transformers against the HF export and import, the same job on both builds, and
# the Python API (its module built for the virtual environment's interpreter and torch).
TESTS="test_model;test_optim;test_safetensors;test_algo;test_comm_inproc;test_comm_gloo;test_train;cli_smoke"
TESTS+=";gloo_store_elastic;hf_transformers;two_torches;python_api"
export CCACHE_BASEDIR=$PWD CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# No GPU here: name the architecture instead of probing for one (Hopper, as scripts/gpu_check.sh);
# kept in the cache, so that a later reconfigure does not probe either.
arch=${TORCH_CUDA_ARCH_LIST:-9.0}
mkdir -p build-torch2
cmake -S . -B build-torch2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_PREFIX_PATH="$site/torch;$torch_prefix" -DCUDA_TOOLKIT_ROOT_DIR="$cuda" -DCUDAToolkit_ROOT="$cuda" \
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DTORCH_CUDA_ARCH_LIST="$arch" -DCMAKE_CUDA_ARCHITECTURES="${arch//./}" \
  -DGASLOC_WITH_NCCL=ON -DNCCL_INCLUDE_DIR="$site/nvidia/nccl/include" -DNCCL_LIBRARY="$site/nvidia/nccl/lib/libnccl.so.2" \
  -DGASLOC_BUILD_TESTS=ON -DGASLOC_TESTS="$TESTS" -DGASLOC_TEST_PYTHON="$PWD/.venv/bin/python" \
  -DGASLOC_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PWD/.venv/bin/python" \
  -DGASLOC_REFERENCE_PROGRAM="$PWD/build/gasloc" -DGASLOC_BUILD_BENCH="${GASLOC_TORCH2_BENCH:-OFF}" \
  >build-torch2/configure.log 2>&1 ||
  { tail -30 build-torch2/configure.log >&2; echo "setup_torch2: configuring build-torch2 failed (whole log: build-torch2/configure.log)" >&2; exit 1; }
cmake --build build-torch2 -j"$(nproc)"
