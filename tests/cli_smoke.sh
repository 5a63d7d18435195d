#!/usr/bin/env bash
# End-to-end check of the gasloc CLI as a user runs it: prepare, train, Ctrl+C-free resume,
# export, init_from, model-info, and errors that name the problem (exit status 2).
#   tests/cli_smoke.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
# expect_error "needle" cmd...: the command must fail with status 2 and print the needle.
expect_error() {
  local needle=$1; shift
  set +e; out=$("$@" 2>&1); rc=$?; set -e
  [ $rc -eq 2 ] || fail "expected exit 2 from '$*', got $rc: $out"
  grep -qF -- "$needle" <<<"$out" || fail "expected '$needle' in the error of '$*': $out"
}

prepare_corpus
[ -f data/dataset.json ] || fail "prepare wrote no dataset.json"

common=("${nano[@]}"
        --set data.val_batches=2 --set train.log_every=5 --set train.eval_every=10 --set train.threads=1)
"$G" train "${common[@]}" --set train.steps=20 --set train.stop_at=10 --set train.run_dir=run > log1.txt
grep -q "stopped\|done after 10 steps" log1.txt || fail "first half did not stop at 10: $(cat log1.txt)"
"$G" train --resume run > log2.txt
grep -q "done after 20 steps" log2.txt || fail "resume did not finish: $(cat log2.txt)"
[ "$(metric_rows run train step | wc -l)" -eq 4 ] || fail "metrics.jsonl has the wrong number of train lines"

"$G" export --run run --out hf --dtype bfloat16 >/dev/null
[ -f hf/model.safetensors ] && [ -f hf/config.json ] || fail "export wrote no files"
grep -q '"LlamaForCausalLM"' hf/config.json || fail "config.json is not a Llama config"
"$G" export --run run --out hf32 >/dev/null
"$G" train "${common[@]}" --set train.steps=2 --set model.init_from=hf32 --set train.run_dir=run2 > log3.txt
grep -q "done after 2 steps" log3.txt || fail "init_from run failed: $(cat log3.txt)"

# GPA: trains, exports its evaluation point, and the report shows its state and when it reached
# a target (10: the first evaluation, as any loss is below 100).
"$G" train "${common[@]}" --set optim.name=gpa --set train.steps=20 --set train.run_dir=gpa > log4.txt
grep -q "done after 20 steps" log4.txt || fail "GPA run failed: $(cat log4.txt)"
"$G" export --run gpa --out hfgpa >/dev/null
report=$("$G" report run gpa --target 100)
grep -q '^| gpa | none | gpa | 1 | 20 | 20 | .* | 0.0% | [0-9.]*% | 12.0 | 10 | ' <<<"$report" || fail "report of the GPA run: $report"
grep -q '^| run | none | adamw | 1 | 20 | 20 | .* | 8.0 | 10 | ' <<<"$report" || fail "report of the AdamW run: $report"

# One document (no blank line) is split by tokens: the last 10% are the validation split; a
# split too small for one default evaluation batch is a warning with the fix.
for i in $(seq 1 300); do printf 'Sentence %d of one long text about foxes number %d.\n' $i $((i % 13)); done > book.txt
"$G" prepare --input book.txt --out book --byte-level --val-fraction 0.1 > prep.txt 2> prep_err.txt
grep -q '"split": "tokens"' book/dataset.json || fail "one-document prepare did not split by tokens"
total=$(( $(wc -c < book.txt) ))  # the trailing newline is dropped, BOS added: the same count
val=$(sed -nE 's/.*"val_tokens": ([0-9]+).*/\1/p' book/dataset.json)
[ "$val" -eq $(( (total + 5) / 10 )) ] || fail "one-document val split has $val of $total tokens, not 10%"
grep -q "fewer than one evaluation batch" prep_err.txt || fail "no warning for a small validation split: $(cat prep_err.txt)"
grep -q "unigram baseline" prep.txt || fail "prepare printed no unigram baseline: $(cat prep.txt)"

# A 2-worker run stopped between rounds (the workers differ), in a directory with a quote.
"$G" train "${common[@]}" --set cluster.workers=2 --set algo.name=diloco --set algo.H=4 --set train.steps=10 \
  --set train.eval_every=5 --set "train.run_dir=it's 2w" > log5.txt
"$G" export --run "it's 2w" --out hf2 > exp.txt
grep -q "average of 2 workers at step 10" exp.txt || fail "export of a 2-worker run: $(cat exp.txt)"
grep -q '"eos_token_id": 256' hf2/config.json || fail "export has no eos id: $(cat hf2/config.json)"
loss_of() { sed -nE 's/^loss ([0-9.]+) nats.*/\1/p' <<<"$1"; }
e_run=$(loss_of "$("$G" eval --run "it's 2w" --data data)")
e_hf=$(loss_of "$("$G" eval --model hf2 --data data --batch-size 4 --seq-len 32 --batches 2)")
final=$(metric_rows "it's 2w" eval val_loss | tail -1)
[ -n "$e_run" ] && [ "$e_run" = "$e_hf" ] || fail "eval of the run ($e_run) and of its export ($e_hf) differ"
awk -v a="$e_run" -v b="$final" 'BEGIN { exit !(a - b < 1e-5 && b - a < 1e-5) }' || fail "eval $e_run is not the run's own final val_loss $final"
e_w1=$(loss_of "$("$G" eval --run "it's 2w" --worker 1 --data data)")
[ "$e_w1" != "$e_run" ] || fail "worker 1's own model scores the same as the average"
# Ranks spread over two hosts' directories: the average needs both.
step=$(ls "it's 2w/checkpoints" | grep '^step-' | tail -1)
mkdir -p "host2/checkpoints/$step" && mv "it's 2w/checkpoints/$step/rank1.pt" "host2/checkpoints/$step/"
cp "it's 2w/checkpoints/rank1.committed" host2/checkpoints/
expect_error "rank(s) 1 have no checkpoint" "$G" export --run "it's 2w" --out hf3
"$G" export --run "it's 2w" --run host2 --out hf3 >/dev/null
cmp hf2/model.safetensors hf3/model.safetensors || fail "the average from two directories differs"
mv "host2/checkpoints/$step/rank1.pt" "it's 2w/checkpoints/$step/"

# A real Gloo run as two hosts leave it: each rank writes into its own run_dir, each with run.json
# (so each host's part resumes and reads back on its own); the average from both directories
# scores what the run itself reported.
"$G" launch -n 2 -- bash -c 'exec "$0" train "$@" --set train.run_dir=gloo$RANK' "$G" "${common[@]}" \
  --set cluster.backend=gloo --set cluster.timeout_s=60 --set algo.name=diloco --set algo.H=4 --set train.steps=10 \
  --set train.eval_every=5 > log7.txt 2>&1 || fail "2-rank Gloo run failed: $(tail -5 log7.txt)"
[ -f gloo0/checkpoints/rank0.committed ] && [ -f gloo1/checkpoints/rank1.committed ] && [ -f gloo1/run.json ] ||
  fail "Gloo ranks' files"
expect_error "rank(s) 1 have no checkpoint" "$G" eval --run gloo0 --data data
e_gloo=$(loss_of "$("$G" eval --run gloo0 --run gloo1 --data data)")
final=$(metric_rows gloo0 eval val_loss | tail -1)
awk -v a="$e_gloo" -v b="$final" 'BEGIN { exit !(a - b < 1e-5 && b - a < 1e-5) }' || fail "Gloo average $e_gloo is not the run's $final"
# ... and each host resumes from its own directory (rank 1's had no run.json before).
"$G" launch -n 2 -- bash -c 'exec "$0" train --resume gloo$RANK --set train.steps=14' "$G" > log7b.txt 2>&1 ||
  fail "resume from each host's directory: $(tail -5 log7b.txt)"
[ "$(metric_rows gloo0 train step | tail -1)" = 14 ] || fail "the two-host resume did not reach step 14"

# Generation: the same seed gives the same text; --max-tokens bounds it.
g1=$("$G" generate --run "it's 2w" --prompt "Line 3" --max-tokens 7 --seed 5 --no-stop 2> gen_err.txt)
g2=$("$G" generate --model hf2 --prompt "Line 3" --max-tokens 7 --seed 5 --no-stop 2>/dev/null)
[ "$g1" = "$g2" ] || fail "generate with one seed differs between the run and its export"
grep -q "7 new tokens" gen_err.txt || fail "generate did not make 7 tokens: $(cat gen_err.txt)"
[ "${#g1}" -le $(( 6 + 7 )) ] || fail "generate wrote more than 7 new bytes: '$g1'"

# SentencePiece export: the tokenizer travels with the weights. A build that cannot load
# SentencePiece (ASan: tests/CMakeLists.txt sets GASLOC_TEST_NO_SENTENCEPIECE) must say so.
if [ -n "${GASLOC_TEST_NO_SENTENCEPIECE:-}" ]; then
  expect_error "AddressSanitizer" "$G" prepare --input corpus.txt --out spdata --vocab-size 300 --val-fraction 0.2
  echo "cli_smoke: SentencePiece export skipped: this build cannot load SentencePiece" >&2
else
  "$G" prepare --input corpus.txt --out spdata --vocab-size 300 --val-fraction 0.2 >/dev/null 2>&1
  "$G" train "${common[@]}" --set data.dir=spdata --set train.steps=2 --set train.run_dir=sprun > log6.txt
  "$G" export --run sprun --out sphf >/dev/null
  [ -f sphf/tokenizer.model ] && grep -q '"tokenizer_class": "LlamaTokenizer"' sphf/tokenizer_config.json ||
    fail "SentencePiece export has no tokenizer files"
  grep -q '"bos_token_id": 1' sphf/config.json && grep -q '"eos_token_id": 1' sphf/config.json ||
    fail "SentencePiece export ids"
  # A run carries its tokenizer: moved to another path and read from another directory, it still
  # exports one (it only warned and wrote none before).
  mkdir moved elsewhere && mv sprun moved/
  (cd elsewhere && "$G" export --run ../moved/sprun --out hf >/dev/null 2>err.txt)
  [ -f elsewhere/hf/tokenizer.model ] || fail "a moved run exported no tokenizer: $(cat elsewhere/err.txt)"
  # The run's data directory prepared again: refused without --force; with it, eval on that
  # directory names the change instead of printing a plausible loss, and generate still decodes
  # with the run's own tokenizer.
  expect_error "already holds a prepared dataset" "$G" prepare --input corpus.txt --out spdata --vocab-size 290
  "$G" prepare --input corpus.txt --out spdata --vocab-size 290 --force >/dev/null 2>&1
  expect_error "holds another dataset now" "$G" eval --run moved/sprun --data spdata
  "$G" generate --run moved/sprun --prompt "Line" --max-tokens 5 --seed 1 >/dev/null || fail "generate with the run's own tokenizer"
fi

# report --csv: one tidy table of every train and eval line (2 workers x 2 train lines, 2
# evaluations of the average, 2 x 2 of each worker's own model), and plots where the path has a
# quote and a space (gnuplot gets no shell).
"$G" report "it's 2w" run --csv "out dir/it's.csv" --plot "out dir/it's plot.png" >/dev/null
[ -s "out dir/it's plot.png" ] || fail "no plot at a path with a quote"
grep -q "^set title" "out dir/it's plot.gp" && grep -q "unigram baseline" "out dir/it's plot.gp" || fail "plot has no title or baseline"
head -1 "out dir/it's.csv" | grep -q '^run,event,worker,step,train_loss,val_loss,' || fail "csv header: $(head -1 "out dir/it's.csv")"
[ "$(grep -c "^it's 2w,train," "out dir/it's.csv")" -eq 4 ] || fail "csv train rows of the 2-worker run"
[ "$(grep -c "^it's 2w,eval,," "out dir/it's.csv")" -eq 2 ] || fail "csv eval rows of the 2-worker run"
[ "$(grep -c "^it's 2w,eval_worker," "out dir/it's.csv")" -eq 4 ] || fail "csv eval_worker rows"
[ "$(grep -c '^run,train,0,' "out dir/it's.csv")" -eq 4 ] || fail "csv rows of the 1-worker run"
mkdir -p a/r b/r && cp run/run.json run/metrics.jsonl a/r/ && cp run/run.json run/metrics.jsonl b/r/
report=$("$G" report a/r b/r)
grep -q '^| a/r |' <<<"$report" && grep -q '^| b/r |' <<<"$report" || fail "colliding run names are not told apart: $report"

# Consensus distance against step (single-worker runs have none: a linear axis, still a plot).
"$G" report run gpa --plot cons.png --plot-x consensus >/dev/null
[ -s cons.png ] || fail "report --plot-x consensus wrote no plot"
expect_error "--plot-x" "$G" report run --plot x.png --plot-x loss

# Gossip with GASLoC's outer step: on the complete graph, round 1 leaves 0.33^2 of the
# disagreement (docs/topology.md), where plain averaging leaves none.
topo=$("$G" topo -t complete -n 8 --consensus 2 --outer-lr 0.7 --outer-momentum 0.9)
grep -q "outer step (lr 0.7, momentum 0.9)" <<<"$topo" || fail "topo with the outer step: $topo"
grep -qE '^ +1 +1\.0890e-01 ' <<<"$topo" || fail "topo: round 1 should leave 0.1089 of the disagreement: $topo"
expect_error "momentum" "$G" topo -t 1peer -n 8 --consensus 2 --outer-momentum 1
# A compressed round's bits: the tiny preset's 7,342,336 parameters are 28,681 chunks of 256; the
# owners' int8 all-reduce over 8 sends 2 x 7 payloads of 3,586 chunks of 260 bytes: 14.22 bits.
topo=$("$G" topo -t complete -n 8 --compression int8)
grep -q "13.05 MB per worker per round (to chunk owners and back, 2(n-1) payloads of P/n), 14.22 bits per parameter per round" <<<"$topo" ||
  fail "topo --compression int8: $topo"
expect_error "topk is for all-reduces" "$G" topo -t 1peer -n 8 --compression topk

# Capture first: `| grep -q` would close the pipe early and, under pipefail, fail on SIGPIPE.
info=$("$G" model-info --preset tiny)
grep -q "parameters: 7342336" <<<"$info" || fail "model-info tiny: $info"

printf '[optim]\nlr = 0.1\n[train\n' > bad.toml
expect_error "bad.toml:3" "$G" train --config bad.toml
expect_error "optim.learning_rate" "$G" train "${common[@]}" --set optim.learning_rate=1
expect_error "unknown model preset 'huge'" "$G" train "${common[@]}" --set model.preset=huge
expect_error "data.seq_len" "$G" train "${common[@]}" --set data.seq_len=4096
expect_error "already holds checkpoints" "$G" train "${common[@]}" --set train.run_dir=run
expect_error "differs" "$G" train --resume run --set model.n_layers=3
expect_error 'optim is "adamw" in the checkpoint' "$G" train --resume run --set optim.name=gpa --set train.steps=30
expect_error "optim.mu_y" "$G" train "${common[@]}" --set optim.name=gpa --set optim.mu_y=0
expect_error "missing.txt" "$G" prepare --input missing.txt --out d2
printf '{"text": "ok"}\nnot json\n' > bad.jsonl
expect_error "line 2" "$G" prepare --input bad.jsonl --out d3

# Input that used to be ignored or misread: each is refused before any work, naming the fix.
expect_error "is a directory" "$G" train --config data
expect_error "not a regular file" "$G" train --config /dev/zero
head -c 2000000 /dev/zero > big.toml
expect_error "larger than" "$G" train --config big.toml
expect_error "--timeout -5 must be a positive" "$G" launch -n 2 --timeout -5 -- "$G" comm-check
expect_error "--timeout 0 must be a positive" "$G" launch -n 2 --timeout 0 -- "$G" comm-check
expect_error "--master-port 70000 is outside 0..65535" "$G" launch -n 2 --master-port 70000 -- "$G" comm-check
expect_error "workers in this process need about" "$G" train "${common[@]}" --set model.n_layers=100000 --set train.run_dir=huge
[ ! -e huge ] || fail "a refused model left a run directory"
cp -r data vocab2048 && sed -i -E 's/"vocab_size": [0-9]+/"vocab_size": 2048/' vocab2048/dataset.json
expect_error "records a vocabulary of 2048 tokens but its tokenizer (byte-level) has 257" \
  "$G" train "${common[@]}" --set data.dir=vocab2048 --set train.run_dir=v
sed -i -E 's/"vocab_size": [0-9]+/"vocab_size": 0/' vocab2048/dataset.json
expect_error "records a vocabulary of 0 tokens" "$G" train "${common[@]}" --set data.dir=vocab2048 --set train.run_dir=v
# A run resumed with another world is told so, not that its checkpoints are from mixed steps.
expect_error "was saved by 2 workers but this job has 3" "$G" train --resume "it's 2w" --set cluster.workers=3
# A run that died during its first checkpoint (files written, nothing committed) starts over;
# --resume says so.
"$G" train "${common[@]}" --set train.steps=10 --set train.checkpoint_every=5 --set train.run_dir=first > /dev/null
rm first/checkpoints/rank0.committed
expect_error "without --resume (it starts over" "$G" train --resume first
"$G" train "${common[@]}" --set train.steps=10 --set train.checkpoint_every=5 --set train.run_dir=first > first.log
grep -q "holds no committed checkpoint (its run stopped during its first one): starting over" first.log ||
  fail "no start-over message: $(head -5 first.log)"
grep -q "done after 10 steps" first.log || fail "the run that started over did not finish: $(tail -3 first.log)"
[ -f first/checkpoints/rank0.committed ] || fail "the run that started over committed nothing"
echo "cli_smoke: all checks passed"
