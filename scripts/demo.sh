#!/usr/bin/env bash
# The main job on the embedded default data: prepare the default corpus (once), then train the
# `tiny` preset on 8 simulated workers with DiLoCo, GASLoC-1peer and GASLoC-2peer (H = 30), and
# print a comparison table and a validation-loss plot.
#   scripts/demo.sh [--set section.key=value ...]     (extra settings apply to all three runs)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ ! -f data/default/dataset.json ]; then
  scripts/default_corpus.sh >/dev/null  # stops here with a hint if the corpus is missing
  mapfile -t inputs < <(scripts/default_corpus.sh)
  build/gasloc prepare --input "${inputs[@]}" --out data/default --vocab-size 8192
fi
out="runs/demo-$(date +%Y%m%d-%H%M%S)"
runs=()
for spec in diloco:complete gasloc:1peer gasloc:2peer; do
  algo=${spec%%:*} topo=${spec##*:}
  name="$algo"; [ "$algo" = gasloc ] && name="gasloc-$topo"
  echo "== $name: 8 workers, tiny preset, H = 30 =="
  build/gasloc train --config configs/demo_cluster.toml --set algo.name="$algo" --set algo.topology="$topo" \
    --set train.run_dir="$out/$name" "$@" | grep --line-buffered -v '^    '
  runs+=("$out/$name")
done
echo
build/gasloc report "${runs[@]}" --plot "$out/val_loss.png"
echo "demo: runs and plot in $out"
