#!/usr/bin/env bash
# Runs the whole test suite (installs and builds first): all of it on Debian's LibTorch 1.13
# (build/), then its torch-2.x part on PyPI's torch 2.x (build-torch2/, docs/testing.md "Two
# LibTorches"; GASLOC_TORCH2=0 skips it). Extra arguments go to both ctest runs,
# e.g. scripts/test.sh -R Trainer
#   scripts/test.sh --sanitize [address|thread] [-- ctest arguments]: the sanitizer builds instead
#   (scripts/sanitize.sh, docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  shift
  GASLOC_SKIP_BUILD=1 scripts/setup.sh
  exec scripts/sanitize.sh "$@"
fi
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@"
if [ "${GASLOC_TORCH2:-1}" != 0 ]; then
  scripts/setup.sh --torch pip
  ctest --test-dir build-torch2 --output-on-failure -j2 --timeout 900 "$@"
fi
