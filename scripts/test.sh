#!/usr/bin/env bash
# Runs the whole test suite (installs and builds first). Extra arguments go to ctest,
# e.g. scripts/test.sh -R Trainer
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@"
