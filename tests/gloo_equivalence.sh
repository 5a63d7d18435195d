#!/usr/bin/env bash
# The same GASLoC job (n = 4) on the in-process cluster and as 4 processes over Gloo under
# `gasloc launch` must give the same losses: exchanges copy tensors exactly and every worker sums
# its mixing row in the same order, so the training losses match bitwise. Both run one BLAS
# thread per product (train.blas_threads): another count may change the last bits of a product.
# Jobs: the anchor form on 2peer (the default), mix_after on 2peer, and the accelerated
# form on 1peer with bf16 messages (the cast on send is the same on both backends), and an
# overlapped anchor round (algo.overlap_steps = 3: Gloo's exchange is performed at its start and
# lands 3 steps later, as the in-process one, so the bits are the same), and compressed ones
# (algo.compression: three jobs blocking, two overlapped). Both backends
# report every worker's own validation loss at each evaluation: the same models, the same numbers.
#   tests/gloo_equivalence.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
prepare_corpus
# Per worker and step: the training loss (printed in the shortest form that reads back exactly).
extract() { metric_rows "$1" train worker step train_loss | sort -n -k1 -k2; }
# Per evaluation and worker: that worker's own validation loss.
worker_losses() { metric_rows "$1" eval_worker step worker val_loss; }
compare() {
  local name=$1; shift
  local job=("${nano[@]}"
             --set data.val_batches=2 --set train.steps=20 --set train.log_every=1 --set train.eval_every=10
             --set train.threads=1 --set train.blas_threads=1 --set algo.name=gasloc --set algo.H=5 "$@")
  "$G" train "${job[@]}" --set cluster.workers=4 --set train.run_dir="$name-inproc" >/dev/null
  "$G" launch -n 4 -- "$G" train "${job[@]}" --set cluster.backend=gloo --set cluster.timeout_s=60 \
    --set train.run_dir="$name-gloo" >/dev/null
  extract "$name-inproc" > "$name-a.txt"
  extract "$name-gloo" > "$name-b.txt"
  [ "$(wc -l < "$name-a.txt")" -eq 80 ] || { echo "FAIL ($name): expected 80 loss lines, got $(wc -l < "$name-a.txt")"; head "$name-a.txt"; exit 1; }
  if ! diff "$name-a.txt" "$name-b.txt" >/dev/null; then
    echo "FAIL ($name): in-process and Gloo losses differ:"; diff "$name-a.txt" "$name-b.txt" | head -20; exit 1
  fi
  worker_losses "$name-inproc" > "$name-wa.txt"
  worker_losses "$name-gloo" > "$name-wb.txt"
  [ "$(wc -l < "$name-wa.txt")" -eq 8 ] && [ "$(cut -d' ' -f1 "$name-wa.txt" | sort -u | wc -l)" -eq 2 ] ||
    { echo "FAIL ($name): expected 2 evaluations of 4 workers: $(cat "$name-wa.txt")"; exit 1; }
  diff "$name-wa.txt" "$name-wb.txt" >/dev/null ||
    { echo "FAIL ($name): the workers' own val_loss differ:"; diff "$name-wa.txt" "$name-wb.txt"; exit 1; }
  local va vb
  va=$(metric_rows "$name-inproc" eval val_loss | tail -1)
  vb=$(metric_rows "$name-gloo" eval val_loss | tail -1)
  # The average model is an all-reduce, whose summation order differs between the backends:
  # equal to fp32 rounding (relative 1e-6).
  awk -v a="$va" -v b="$vb" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * a) }' ||
    { echo "FAIL ($name): final average-model val_loss differs: $va vs $vb"; exit 1; }
  echo "gloo_equivalence ($name): 80 training losses and 8 workers' val_loss match exactly; average-model val_loss $va vs $vb"
}
compare anchor --set algo.topology=2peer
compare mix_after --set algo.topology=2peer --set algo.form=mix_after
compare accelerated_bf16 --set algo.topology=1peer --set algo.form=accelerated --set algo.gossip_step=0.8 \
  --set algo.outer_momentum=0.5 --set algo.wire_dtype=bf16
compare overlap_eager --set algo.topology=2peer --set algo.overlap_steps=3 --set algo.overlap=eager
compare overlap_delayed --set algo.topology=2peer --set algo.overlap_steps=3 --set algo.overlap=delayed
# Compressed rounds: byte payloads over pair exchanges, so the same bits on both backends. The
# owners' int4 all-reduce on the complete graph (every worker the same theta), int8 modulo gossip
# on 2peer rings (one pair exchange per colour, and a second for the chunks that wrapped), and
# int4 delta gossip on 1peer (its reference refreshed by the owners' all-reduce every 2 rounds).
compare complete_int4 --set algo.topology=complete --set algo.compression=int4
compare modulo_int8 --set algo.topology=2peer --set algo.compression=int8 --set algo.gossip_codec=modulo
compare delta_int4 --set algo.topology=1peer --set algo.compression=int4 --set algo.gossip_codec=delta --set algo.reference_every=2
# Overlapped compressed rounds (algo/relayed_mix.hpp): each of the round's exchanges is started
# between steps once the last has landed, over Gloo on its own thread; the same bits.
compare overlap_modulo_int8 --set algo.topology=2peer --set algo.compression=int8 --set algo.gossip_codec=modulo \
  --set algo.overlap_steps=3
compare overlap_complete_int8 --set algo.topology=complete --set algo.compression=int8 --set algo.overlap_steps=3
# The bf16 job must differ from its fp32 twin (the setting reached the run).
"$G" train "${nano[@]}" \
  --set data.val_batches=2 --set train.steps=20 --set train.log_every=1 --set train.eval_every=10 --set train.threads=1 \
  --set train.blas_threads=1 --set algo.name=gasloc --set algo.H=5 --set algo.topology=1peer --set algo.form=accelerated \
  --set algo.gossip_step=0.8 --set algo.outer_momentum=0.5 --set cluster.workers=4 --set train.run_dir=acc-fp32 >/dev/null
extract acc-fp32 > acc-fp32.txt
if diff acc-fp32.txt accelerated_bf16-a.txt >/dev/null; then echo "FAIL: bf16 messages changed nothing"; exit 1; fi
echo "gloo_equivalence: the bf16 job differs from its fp32 twin"
