#!/usr/bin/env bash
# The same job on gasloc built against two LibTorches (PyPI's torch 2.x and Debian's 1.13): the
# same losses within the tolerance docs/testing.md states ("Two LibTorches"). Both runs are fp32
# on the CPU with one BLAS thread; they differ only in the LibTorch kernels beneath gasloc's
# (matrix products, softmax, reductions), so the step-0 loss agrees to rounding and the curves
# drift apart slowly as rounding differences compound through AdamW.
#   tests/two_torches.sh GASLOC_TORCH2 GASLOC_TORCH1
set -euo pipefail
G2=$(readlink -f "$1")
G1=$(readlink -f "$2")
[ -x "$G1" ] || { echo "FAIL: the reference program $2 is missing (build build/ first: scripts/setup.sh)" >&2; exit 1; }
G=$G2
source "$(dirname "$(readlink -f "$0")")/lib.sh"

G=$G1 prepare_corpus
job=(--config "$(dirname "$(readlink -f "$0")")/../configs/tiny.toml" --set model.preset=nano --set data.dir=data
     --set data.seq_len=32 --set data.batch_size=8 --set data.val_batches=2 --set train.steps=40 --set train.log_every=1
     --set train.eval_every=20 --set train.threads=1 --set train.checkpoint_every=0)
"$G1" train "${job[@]}" --set train.run_dir=run1 >/dev/null
"$G2" train "${job[@]}" --set train.run_dir=run2 >/dev/null
G=$G1 metric_rows run1 train step train_loss > loss1.txt
G=$G2 metric_rows run2 train step train_loss > loss2.txt
[ "$(wc -l < loss1.txt)" -ge 40 ] || fail "the 1.13 run logged $(wc -l < loss1.txt) steps"
# Step 0: rounding only (1e-5 relative); the whole 40 steps: 2e-3 relative.
paste loss1.txt loss2.txt | awk '
  $1 != $3 { print "FAIL: steps differ: " $0; bad = 1; exit }
  { d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > worst) { worst = d; at = $1 }
    tol = ($1 == 0) ? 1e-5 : 2e-3
    if (d > tol) { printf "FAIL: step %d: loss %s (torch 1.13) vs %s (torch 2.x), relative %.2e > %.0e\n", $1, $2, $4, d, tol; bad = 1 } }
  END { if (!bad) printf "same losses on both LibTorches: 40 steps, largest relative difference %.2e at step %d\n", worst, at; exit bad }'
