#!/usr/bin/env bash
# N processes of DiLoCo on this host, side by side in one run: `gasloc train` under `gasloc
# launch` (Gloo, with its thread plan: the host's cores shared by LOCAL_WORLD_SIZE), the same
# with OpenBLAS's own thread count in every rank (the oversubscribed default before the plan:
# train.blas_threads = cores), and the same DiLoCo in Python over torch.distributed Gloo
# (bench/python_diloco.py: PyTorch eager, one thread per rank). The research regime's model
# (micro), batch 8 x 64 tokens, H = 30. Whole-process tokens/s: every rank's tokens over the
# wall time of the launch, start-up included. Prints a table and the ratios; repeats alternate.
#   bench/launch_side_by_side.sh [N=4] [STEPS=120] [REPEATS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-4}
STEPS=${2:-120}
REPEATS=${3:-2}
source scripts/lib/results.sh
[ -x build/gasloc ] || scripts/setup.sh
research_data
cores=$(nproc)
tokens=$(( N * STEPS * 8 * 64 ))
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
job=(--config configs/research.toml --set cluster.backend=gloo --set train.steps=$STEPS --set train.eval_every=0
     --set train.checkpoint_every=0 --set train.log_every=$STEPS --set data.val_batches=1)

seconds_of() {  # seconds_of CMD...: wall seconds of one command, which must succeed
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$run_dir/last.log" 2>&1 || { tail -20 "$run_dir/last.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
declare -A total
for rep in $(seq 1 "$REPEATS"); do
  total[plan]+=" $(seconds_of build/gasloc launch -n "$N" -- gasloc train "${job[@]}" --set train.run_dir="$run_dir/plan$rep")"
  total[all]+=" $(seconds_of build/gasloc launch -n "$N" -- gasloc train "${job[@]}" --set train.blas_threads=$cores \
    --set train.run_dir="$run_dir/all$rep")"
  total[python]+=" $(seconds_of build/gasloc launch -n "$N" -- /usr/bin/python3 bench/python_diloco.py --steps "$STEPS" --H 30 \
    --threads 1)"
done
best() { tr ' ' '\n' <<<"$1" | grep . | sort -g | head -1; }
p=$(best "${total[python]}")
echo "launch_side_by_side: $N ranks of DiLoCo (micro, batch 8 x 64, H = 30, $STEPS steps) on $cores cores; best of $REPEATS"
echo "| ranks run as | seconds | tokens/s | vs Python |"
echo "| --- | --- | --- | --- |"
for k in plan all python; do
  s=$(best "${total[$k]}")
  name=$([ $k = plan ] && echo "gasloc, thread plan (cores / LOCAL_WORLD_SIZE BLAS threads)" ||
         { [ $k = all ] && echo "gasloc, every rank $cores BLAS threads" || echo "Python DiLoCo, torch.distributed Gloo, 1 thread"; })
  awk -v n="$name" -v s="$s" -v t="$tokens" -v p="$p" 'BEGIN { printf "| %s | %.1f | %.0f | %.2fx |\n", n, s, t / s, p / s }'
done
