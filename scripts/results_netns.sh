#!/usr/bin/env bash
# Real shaped links (issue 18): E3's straggler scenarios over real TCP between network namespaces
# (`gasloc launch --netns`, root), against the virtual clock's prediction for the same runs.
# DiLoCo against GASLoC-1peer and -2peer with time_budget, 4 ranks of the `micro` preset on the
# default corpus with a 1024-token tokenizer. Regenerates the "netns" section of docs/results.md.
#   sudo scripts/results_netns.sh [STEPS] [--report]   (default 60 = 6 rounds of H = 10;
#                                                     --report: the section from the runs already there)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/results.sh
source scripts/lib/results.sh
steps=${1:-60}
report_only=false; [ "${2:-}" = "--report" ] && report_only=true
[ "$(id -u)" -eq 0 ] || { echo "results_netns.sh needs root (gasloc launch --netns)" >&2; exit 1; }
[ -x build/gasloc ] || scripts/setup.sh
data=data/micro1024
if [ ! -f "$data/dataset.json" ]; then
  scripts/default_corpus.sh >/dev/null
  mapfile -t inputs < <(scripts/default_corpus.sh)
  build/gasloc prepare --input "${inputs[@]}" --out "$data" --vocab-size 1024 >/dev/null
fi
out="runs/results/netns-$steps"
$report_only || { rm -rf "$out"; mkdir -p "$out"; }
common=(--set model.preset=micro --set data.dir="$data" --set data.batch_size=8 --set data.seq_len=64
        --set data.val_batches=4 --set train.steps="$steps" --set train.eval_every=10 --set train.log_every=10
        --set train.checkpoint_every=0 --set algo.H=10 --set optim.lr=0.003 --set optim.warmup_steps=10
        --set train.threads=1 --set train.blas_threads=1 --set network.bandwidth_gbit=0.05
        --set network.latency_s=0 --set cluster.timeout_s=600)
declare -A algo=(
  [diloco]="--set algo.name=diloco"
  [gasloc-1peer-tb]="--set algo.name=gasloc --set algo.topology=1peer --set algo.h_policy=time_budget"
  [gasloc-2peer-tb]="--set algo.name=gasloc --set algo.topology=2peer --set algo.h_policy=time_budget"
)
declare -A scenario=([bw10]="--set network.preset=straggler_bw10" [bw20]="--set network.preset=straggler_bw20")
real_run() {  # dir, settings...
  local dir=$1; shift
  build/gasloc launch -n 4 --netns -- build/gasloc train "${common[@]}" "$@" --set cluster.backend=gloo \
    --set train.run_dir="$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
}
# "wall virtual" of the latest train line over the ranks.
last_times() {
  awk -F'[,:}]' '/"event":"train"/ {
      for (i = 1; i < NF; i++) { if ($i ~ /"wall_time_s"/) w = $(i+1); if ($i ~ /"virtual_time_s"/) v = $(i+1) }
      if (w > W) W = w; if (v > V) V = v }
    END { printf "%.1f %.1f", W, V }' "$1/metrics.jsonl"
}
# The first eval line at or below a loss: "step wall virtual", or "- - -".
reach() {  # run, target
  awk -F'[,:}]' -v t="$2" '/"event":"eval"/ {
      for (i = 1; i < NF; i++) { if ($i ~ /"val_loss"/) l = $(i+1); if ($i ~ /"wall_time_s"/) w = $(i+1);
                                 if ($i ~ /"virtual_time_s"/) v = $(i+1); if ($i ~ /"step"/) s = $(i+1) }
      if (l <= t && !done) { printf "%d %.1f %.1f", s, w, v; done = 1 } }
    END { if (!done) print "- - -" }' "$1/metrics.jsonl"
}
final_loss() { grep '"event":"eval"' "$1/metrics.jsonl" | tail -1 | sed -E 's/.*"val_loss":([^,}]+).*/\1/'; }

if ! $report_only; then
echo "== calibration: 4 ranks in namespaces, fast links =="
real_run "$out/calibration" --set algo.name=diloco --set network.bandwidth_gbit=100
fi
read -r cal_wall _ <<<"$(last_times "$out/calibration")"
step_s=$(awk -v w="$cal_wall" -v n="$steps" 'BEGIN { printf "%.3f", w / n }')
echo "   $cal_wall s for $steps steps: network.step_time_s = $step_s"
runs=()
for sc in bw10 bw20; do
  for a in diloco gasloc-1peer-tb gasloc-2peer-tb; do
    runs+=("$a-$sc")
    $report_only && continue
    echo "== $a, $sc: real (netns) and virtual (in-process) =="
    # shellcheck disable=SC2086
    real_run "$out/real-$a-$sc" ${algo[$a]} ${scenario[$sc]} --set network.step_time_s="$step_s"
    # shellcheck disable=SC2086
    build/gasloc train "${common[@]}" ${algo[$a]} ${scenario[$sc]} --set network.step_time_s="$step_s" \
      --set cluster.workers=4 --set train.run_dir="$out/virtual-$a-$sc" > "$out/virtual-$a-$sc.log" 2>&1
  done
done
# Target: the worst final loss of the real runs, so that every run reaches it.
target=$(for r in "${runs[@]}"; do final_loss "$out/real-$r"; done | sort -g | tail -1)
unigram=$(sed -nE 's/.*"unigram_val_loss": *([0-9.]+).*/\1/p' "$data/dataset.json")
rows=""
for r in "${runs[@]}"; do
  read -r s_real w_real _ <<<"$(reach "$out/real-$r" "$target")"
  read -r s_virt _ v_virt <<<"$(reach "$out/virtual-$r" "$target")"
  read -r wall _ <<<"$(last_times "$out/real-$r")"
  read -r _ virt <<<"$(last_times "$out/virtual-$r")"
  ratio=$(awk -v a="$w_real" -v b="$v_virt" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
  # What the real runs pay and the virtual clock does not: each evaluation all-reduces the model
  # (4 bytes x params) over a ring whose slowest link is the straggler's.
  frac=0.1; [ "${r##*-}" = bw20 ] && frac=0.2
  evals=$(grep -c '"event":"eval"' "$out/real-$r/metrics.jsonl")
  params=$(sed -nE 's/.*"num_params": *([0-9]+).*/\1/p' "$out/real-$r/run.json" | head -1)
  eval_s=$(awk -v e="$evals" -v p="$params" -v f="$frac" 'BEGIN { printf "%.1f", e * 1.5 * 4 * p / (0.05e9 / 8 * f) }')
  rest=$(awk -v w="$wall" -v e="$eval_s" 'BEGIN { printf "%.1f", w - e }')
  rows+="| ${r%-bw*} | ${r##*-} | $(final_loss "$out/real-$r" | cut -c1-6) | $s_real | $w_real | $s_virt | $v_virt | $ratio | $wall | $eval_s | $rest | $virt |"$'\n'
done
section=$(cat <<MD
<!-- netns:begin (generated by scripts/results_netns.sh; edits here are overwritten) -->
## Real shaped links: stragglers between network namespaces, against the virtual clock

Generated by \`sudo scripts/results_netns.sh $steps\` on $(date -u +%Y-%m-%d) ($(nproc) CPU cores). Four
ranks train the \`micro\` preset (1.0M parameters, 1024-token tokenizer prepared from the default
corpus, batch 8 x 64, $steps steps, H = 10) as four processes under \`gasloc launch --netns\`: each
rank is its own host in a network namespace, and tbf holds each host's link to 0.05 Gbit/s
(6.25 MB/s) each way, the straggler's (rank 3) to 10% or 20% of that. Messages are the real 4 MB
fp32 model over TCP. The same jobs then run on the in-process cluster, whose virtual clock
predicts the time from the same \`[network]\` section, with the step time calibrated by a run
over fast links ($cal_wall s for $steps steps: \`network.step_time_s = $step_s\`).

Target: $target, the worst final validation loss of the real runs (so every run reaches it);
the data's unigram baseline is $unigram nats. Time to target is when the average model first
evaluated at or below it (every 10 steps).

| algorithm | scenario | final val loss (real) | step to target (real) | wall s to target | step to target (virtual) | virtual s to target | real / virtual | wall s total | of which evaluations (est.) | wall s without them | virtual s total |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
${rows}
Reading it:
- Real and virtual runs give the same losses at every step (the same computation); only time
  differs. Times exclude start-up.
- The real runs take about 2 to 3 times the virtual prediction, and almost all of the gap is
  the evaluations: each one all-reduces the 4 MB model through a ring whose slowest link is the
  straggler's, which the virtual clock does not price (in-process evaluation is free). The
  estimate, evaluations x 1.5 x 4 MB / straggler bandwidth, is the "of which evaluations"
  column; without it the real times come close to the virtual clock's (compare the last two
  columns; the calibrated step time is only as good as a shared machine allows). So the time
  model holds for training rounds, and a fair wall-clock comparison evaluates rarely or out of
  band.
- With the evaluations included, DiLoCo reaches the target first on real links even where the
  virtual clock ranks GASLoC-1peer ahead; without them the ranking is the virtual clock's.
- These \`micro\` models end only 0.1 to 0.2 nats below the unigram baseline after 60 steps:
  the section measures time, not the methods' quality.
<!-- netns:end -->
MD
)
write_results_section netns "$section"
