#!/usr/bin/env bash
# Tokenizes the default corpus (fetched by scripts/setup.sh) into a dataset directory, once:
#   scripts/prepare_data.sh                      # data/default, 8192-token tokenizer (configs/tiny.toml, configs/demo_cluster.toml)
#   scripts/prepare_data.sh data/micro1024 1024  # the research regime's data (configs/research.toml)
# A directory already prepared is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/gasloc ] || scripts/setup.sh --program
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
prepare_corpus "${1:-data/default}" "${2:-8192}"
echo "prepared: ${1:-data/default}"
