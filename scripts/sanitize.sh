#!/usr/bin/env bash
# The sanitizer runs (docs/testing.md), each in its own build directory at -O1 -g:
#   address: ASan + UBSan over the whole suite (build-asan/)
#   thread:  TSan over the in-process cluster and the Gloo threads tests (build-tsan/)
#   scripts/sanitize.sh [address|thread ...] [-- ctest arguments]   # default: address, then thread
# scripts/test.sh --sanitize runs this. One sanitizer builds at a time; only the targets its run
# needs are built.
set -euo pipefail
cd "$(dirname "$0")/.."

kinds=()
while (($#)) && [ "$1" != "--" ]; do
  case "$1" in
    address|thread) kinds+=("$1") ;;
    *) echo "sanitize: unknown sanitizer '$1' (address or thread)" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = "--" ] && shift
((${#kinds[@]})) || kinds=(address thread)
jobs=${GASLOC_JOBS:-2}

# LibTorch and OpenBLAS are not instrumented. Their thread pools are kept to the calling thread
# so that TSan sees every hand-off between gasloc's threads (a pool's own synchronization is
# invisible to it), and the suites stay fast enough under the sanitizers.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
supp=$PWD/tests/sanitizers
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1:print_suppressions=0"

for kind in "${kinds[@]}"; do
  dir=build-$([ "$kind" = address ] && echo asan || echo tsan)
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGASLOC_SANITIZE="$kind" -DGASLOC_BUILD_BENCH=OFF >/dev/null
  if [ "$kind" = address ]; then
    cmake --build "$dir" -j"$jobs"
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@"
  else
    cmake --build "$dir" -j"$jobs" --target test_comm_inproc test_comm_gloo
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" \
      -R '^(NetworkModel|InProc|InProcClock|InProcErrors|GlooEnv|GlooTokenBucket|GlooThreads)\.' "$@"
  fi
done
