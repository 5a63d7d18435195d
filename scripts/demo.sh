#!/usr/bin/env bash
# The main job on the embedded default data, in the research regime (configs/research.toml):
# prepare the default corpus with a 1024-token tokenizer (once), then train the `micro` preset
# (1.0M parameters) on 8 simulated workers with DiLoCo, GASLoC-1peer and GASLoC-2peer (H = 30,
# 10 outer rounds of 512 tokens a step per worker), and print a comparison table beside the
# data's unigram baseline and a validation-loss plot with that baseline drawn. About 6 minutes
# on 2 cores.
#   scripts/demo.sh [--set section.key=value ...]     (extra settings apply to all three runs)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --program
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
research_data
out="runs/demo-$(date +%Y%m%d-%H%M%S)"
runs=()
for spec in diloco:complete gasloc:1peer gasloc:2peer; do
  algo=${spec%%:*} topo=${spec##*:}
  name="$algo"; [ "$algo" = gasloc ] && name="gasloc-$topo"
  echo "== $name: 8 workers, micro preset, H = 30 =="
  build/gasloc train --config configs/research.toml --set algo.name="$algo" --set algo.topology="$topo" \
    --set train.run_dir="$out/$name" "$@" | grep --line-buffered -v -e '^    ' -e '^  \[[a-z_]*\]$'
  runs+=("$out/$name")
done
echo
build/gasloc report "${runs[@]}" --plot "$out/val_loss.png"
echo "demo: runs and plot in $out"
