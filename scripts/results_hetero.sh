#!/usr/bin/env bash
# Evidence for heterogeneous clusters (issue 6): 8 in-process workers train the `tiny` preset on
# the default corpus with H = 30, while the virtual clock prices every message as the 134M model
# in bf16 over 1 Gbit/s links and every inner step at 1.0 s (a 134M model's step on one GPU).
# Scenarios: homogeneous, one straggler at 20%, 10% and 1% of the bandwidth. Algorithms: DiLoCo,
# GASLoC-1peer and GASLoC-2peer, with h_policy fixed and time_budget. Regenerates the
# "Heterogeneous clusters" section of docs/results.md (tables and plots of validation loss
# versus virtual time) from the runs.
#   scripts/results_hetero.sh [STEPS]   (default 150 = 5 rounds; finished runs are reused)
# RESULTS_EXTRA="--set ..." adds settings to every run and RESULTS_OUT moves the runs (for a
# quick check of the script itself, e.g. with the nano preset); the section then says so.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
steps=${1:-150}
[ -x build/gasloc ] || scripts/setup.sh
[ -f data/default/dataset.json ] || { echo "run scripts/demo.sh once first (it prepares data/default)" >&2; exit 1; }
out=${RESULTS_OUT:-runs/results/hetero-$steps}
read -r -a extra_settings <<<"${RESULTS_EXTRA:-}"
common=(--config configs/demo_cluster.toml --set train.steps="$steps" --set train.eval_every=30 --set algo.H=30
        --set network.simulated_model=134m:bf16 --set network.step_time_s=1.0 --set network.bandwidth_gbit=1.0)
declare -A scenario=(
  [homogeneous]="--set network.preset=homogeneous"
  [bw20]="--set network.preset=straggler_bw20"
  [bw10]="--set network.preset=straggler_bw10"
  [bw1]="--set network.stragglers=[{rank=7,bandwidth=0.01}]"
)
declare -A algo=(
  [diloco]="--set algo.name=diloco"
  [gasloc-1peer]="--set algo.name=gasloc --set algo.topology=1peer"
  [gasloc-1peer-tb]="--set algo.name=gasloc --set algo.topology=1peer --set algo.h_policy=time_budget"
  [gasloc-2peer]="--set algo.name=gasloc --set algo.topology=2peer"
  [gasloc-2peer-tb]="--set algo.name=gasloc --set algo.topology=2peer --set algo.h_policy=time_budget"
)
# Without a straggler every worker's budget is H, so time_budget computes exactly what fixed does
# (tests/test_hetero.cpp); the 1% case runs only the policies whose behaviour is in question.
declare -A runs_of=(
  [homogeneous]="diloco gasloc-1peer gasloc-2peer"
  [bw20]="diloco gasloc-1peer gasloc-1peer-tb gasloc-2peer gasloc-2peer-tb"
  [bw10]="diloco gasloc-1peer gasloc-1peer-tb gasloc-2peer gasloc-2peer-tb"
  [bw1]="diloco gasloc-1peer-tb gasloc-2peer-tb"
)
order="homogeneous bw20 bw10 bw1"
t0=$(date +%s)
for sc in $order; do
  for a in ${runs_of[$sc]}; do
    dir="$out/$sc/$a"
    if grep -q "\"event\":\"eval\",\"step\":$steps," "$dir/metrics.jsonl" 2>/dev/null; then echo "== $sc/$a: finished, reused"; continue; fi
    echo "== $sc/$a =="
    rm -rf "$dir"  # an unfinished run of this size is cheaper to redo than to untangle
    # shellcheck disable=SC2086
    build/gasloc train "${common[@]}" ${scenario[$sc]} ${algo[$a]} "${extra_settings[@]}" --set train.run_dir="$dir" |
      grep --line-buffered -v '^    '
  done
done
elapsed=$(( $(date +%s) - t0 ))

# The target: the worst final validation loss among the homogeneous runs, so that every method
# reaches it when nothing straggles (column 7 of the report is the final average-model loss).
hom_dirs=()
for a in ${runs_of[homogeneous]}; do hom_dirs+=("$out/homogeneous/$a"); done
target=$(build/gasloc report "${hom_dirs[@]}" | awk -F'|' '/^\| [a-z]/ && $2 !~ /run/ { v = $8 + 0; if (v > m) m = v } END { printf "%.4f", m }')
mkdir -p docs/results
tables=""
declare -A t_to=()
for sc in $order; do
  dirs=()
  for a in ${runs_of[$sc]}; do dirs+=("$out/$sc/$a"); done
  cmd="build/gasloc report ${dirs[*]} --target $target --plot docs/results/hetero-$sc.png --plot-x time"
  table=$($cmd | grep '^|')
  tables+="### $sc"$'\n\n'"\`$cmd\`"$'\n\n'"$table"$'\n\n'"![validation loss versus virtual time, $sc](results/hetero-$sc.png)"$'\n\n'
  # run name -> virtual seconds to target (last column)
  while IFS='|' read -r _ name rest; do
    name=$(xargs <<<"$name")
    t=$(awk -F'|' '{ print $(NF-1) }' <<<"|$rest" | xargs)
    t_to["$sc/$name"]=$t
  done < <(grep '^| [a-z]' <<<"$table" | grep -v '^| run ')
done
summary="| algorithm | "
for sc in $order; do summary+="$sc | "; done
summary+=$'\n'"| --- |"
for sc in $order; do summary+=" --- |"; done
summary+=$'\n'
for a in diloco gasloc-1peer gasloc-1peer-tb gasloc-2peer gasloc-2peer-tb; do
  row="| $a |"
  for sc in $order; do
    t=${t_to["$sc/$a"]:-}
    [ -z "$t" ] && [ "$sc" = homogeneous ] && t=${t_to["$sc/${a%-tb}"]:-}  # time_budget = fixed here
    d=${t_to["$sc/diloco"]:-}
    if [ -n "$t" ] && [ "$t" != "-" ] && [ -n "$d" ] && [ "$d" != "-" ]; then
      row+=" $t s ($(awk -v a="$d" -v b="$t" 'BEGIN { printf "%.2fx", a / b }')) |"
    else
      row+=" ${t:-n/a} |"
    fi
  done
  summary+="$row"$'\n'
done
section=$(cat <<MD
<!-- hetero:begin (generated by scripts/results_hetero.sh; edits here are overwritten) -->
## Heterogeneous clusters: time to a target loss on the virtual clock

Generated by \`scripts/results_hetero.sh $steps\` on $(date -u +%Y-%m-%d) ($(nproc) CPU cores; the
runs took $((elapsed / 60)) min here, 0 if they were reused). 8 in-process workers train the
\`tiny\` preset (7.3M parameters) on the default corpus, batch 4 x 64 tokens per worker, $steps
steps, H = 30, lr 3e-3 (\`configs/demo_cluster.toml\`). The virtual clock prices each message as
the 134M model in bf16 (\`network.simulated_model = "134m:bf16"\`, 268 MB) over 1 Gbit/s links
with 1 ms latency, and each inner step at 1.0 s. The straggler is worker 7. This is a small model
on a small corpus for few rounds, so the losses are high; what the runs measure is how the
communication pattern turns into waiting.${RESULTS_EXTRA:+ Extra settings for this generation: \`$RESULTS_EXTRA\`.}

Target loss: $target, the worst final validation loss among the homogeneous runs. The cells give
the virtual seconds until the average model first reaches it, interpolated between evaluations
every 30 steps, and in brackets the speed-up over DiLoCo in the same scenario. "-" means the
target was not reached within $steps steps. "-tb" is \`algo.h_policy = "time_budget"\`. Without
a straggler, time_budget computes exactly what fixed does, so those cells repeat the fixed run.

$summary

$tables<!-- hetero:end -->
MD
)
write_results_section hetero "$section"
