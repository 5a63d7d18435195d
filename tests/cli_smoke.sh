#!/usr/bin/env bash
# End-to-end check of the gasloc CLI as a user runs it: prepare, train, Ctrl+C-free resume,
# export, init_from, model-info, and errors that name the problem (exit status 2).
#   tests/cli_smoke.sh path/to/gasloc
set -euo pipefail
G=$(readlink -f "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error "needle" cmd...: the command must fail with status 2 and print the needle.
expect_error() {
  local needle=$1; shift
  set +e; out=$("$@" 2>&1); rc=$?; set -e
  [ $rc -eq 2 ] || fail "expected exit 2 from '$*', got $rc: $out"
  grep -qF -- "$needle" <<<"$out" || fail "expected '$needle' in the error of '$*': $out"
}

for i in $(seq 1 300); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' $i $((i % 17)); done > corpus.txt
"$G" prepare --input corpus.txt --out data --byte-level --val-fraction 0.1 >/dev/null
[ -f data/dataset.json ] || fail "prepare wrote no dataset.json"

common=(--set model.preset=nano --set data.dir=data --set data.seq_len=32 --set data.batch_size=4
        --set data.val_batches=2 --set train.log_every=5 --set train.eval_every=10 --set train.threads=1)
"$G" train "${common[@]}" --set train.steps=20 --set train.stop_at=10 --set train.run_dir=run > log1.txt
grep -q "stopped\|done after 10 steps" log1.txt || fail "first half did not stop at 10: $(cat log1.txt)"
"$G" train --resume run > log2.txt
grep -q "done after 20 steps" log2.txt || fail "resume did not finish: $(cat log2.txt)"
[ "$(grep -c '"event":"train"' run/metrics.jsonl)" -eq 4 ] || fail "metrics.jsonl has the wrong number of train lines"

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
grep -q '^| gpa | none | gpa | 1 | 20 | 20 | .* | 0.0% | 12.0 | 10 | ' <<<"$report" || fail "report of the GPA run: $report"
grep -q '^| run | none | adamw | 1 | 20 | 20 | .* | 8.0 | 10 | ' <<<"$report" || fail "report of the AdamW run: $report"

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
echo "cli_smoke: all checks passed"
