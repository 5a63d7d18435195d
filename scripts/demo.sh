#!/usr/bin/env bash
# The main job on the embedded default data: prepare the default corpus (once), train the
# `tiny` preset on one CPU worker, and print the validation loss.
#   scripts/demo.sh [--set section.key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ ! -f data/default/dataset.json ]; then
  mapfile -t inputs < <(scripts/default_corpus.sh)
  build/gasloc prepare --input "${inputs[@]}" --out data/default --vocab-size 8192
fi
run="runs/demo-$(date +%Y%m%d-%H%M%S)"
build/gasloc train --config configs/tiny.toml --set train.run_dir="$run" "$@"
echo "demo: metrics in $run/metrics.jsonl; export the model with: build/gasloc export --run $run --out $run/hf"
