# Sourced by scripts/setup_torch2.sh and scripts/gpu_check.sh.
# cuda_from_wheels SITE OUT: where SITE (a site-packages folder) has PyPI's nvidia-* CUDA wheels
# with nvcc (nvidia/cu13/bin/nvcc), lays out OUT as the toolkit folder that LibTorch's CMake
# configuration (CMake's FindCUDA) looks for: bin/, include/, lib/ and lib64/ with unversioned
# .so names, all links into the wheels. Prints OUT; returns 1 (printing nothing) where the wheels
# have no nvcc.
cuda_from_wheels() {
  local site=$1 out=$2 f name
  [ -x "$site/nvidia/cu13/bin/nvcc" ] || return 1
  mkdir -p "$out/lib"
  ln -sfn "$site/nvidia/cu13/bin" "$out/bin"
  ln -sfn "$site/nvidia/cu13/include" "$out/include"
  ln -sfn lib "$out/lib64"
  for f in "$site"/nvidia/cu13/lib/*; do
    name=${f##*/}
    ln -sf "$f" "$out/lib/$name"
    case "$name" in *.so.*) ln -sf "$f" "$out/lib/${name%%.so.*}.so" ;; esac
  done
  echo "$out"
}
