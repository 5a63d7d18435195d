#!/usr/bin/env bash
# Runs the whole test suite (installs and builds first). Extra arguments go to ctest,
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
