#!/usr/bin/env bash
# Makes docs/images/dashboard.png, the picture of `gasloc dashboard` in docs/training.md: the
# research regime (configs/research.toml) with 4 in-process GASLoC workers over 2peer rings, one
# of which (id 2) dies at round 3 and rejoins 3 rounds later, drawn by headless Chromium from the
# page `gasloc report --html` writes (the dashboard's page with the data inside).
#   scripts/dashboard_screenshot.sh        (about 1 minute on 2 cores; needs Debian's chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/results.sh
[ -x build/gasloc ] || scripts/setup.sh
research_data
CHROMIUM=$(command -v chromium || command -v chromium-browser) || { echo "needs chromium (scripts/setup.sh installs it)" >&2; exit 2; }
run=runs/dashboard-shot
rm -rf "$run"
build/gasloc train --config configs/research.toml --set algo.name=gasloc --set algo.topology=2peer \
  --set cluster.workers=4 --set cluster.elastic=true --set train.steps=300 --set train.log_every=10 \
  --set train.checkpoint_every=0 --set 'faults.kill=[{ id = 2, round = 3, restart_after_rounds = 3 }]' \
  --set train.run_dir="$run"
build/gasloc report "$run" --html "$run/dashboard.html"
mkdir -p docs/images
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$profile" --hide-scrollbars \
  --virtual-time-budget=8000 --window-size=1280,1500 --screenshot="$PWD/docs/images/dashboard.png" \
  "file://$PWD/$run/dashboard.html" 2>/dev/null
echo "wrote docs/images/dashboard.png"
