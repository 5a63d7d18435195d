#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then the installed program on a tiny job from the
# installed job files, run from a directory outside the checkout: the program, its configs/ and
# experiments/ under PREFIX/share/gasloc, found without a checkout, and nothing test-only.
#   tests/install_prefix.sh BUILD_DIR SOURCE_DIR
source "$(dirname "$(readlink -f "$0")")/lib.sh"
build=$(readlink -f "$1")
src=$(readlink -f "$2")
P=$tmp/prefix
cmake --install "$build" --prefix "$P" >"$tmp/install.log" || fail "cmake --install failed: $(cat "$tmp/install.log")"
G=$P/bin/gasloc

# What was installed: the program, the job and study files, the README; nothing else.
[ -x "$G" ] || fail "no $G"
for f in configs/research.toml configs/tiny.toml configs/demo_cluster.toml; do
  [ -f "$P/share/gasloc/$f" ] || fail "no share/gasloc/$f"
done
for f in "$src"/experiments/*.toml; do
  [ -f "$P/share/gasloc/experiments/$(basename "$f")" ] || fail "experiments/$(basename "$f") not installed"
done
unexpected=$(cd "$P" && find . -type f | grep -vE '^\./(bin/gasloc|share/gasloc/(configs|experiments)/[^/]+\.toml|share/doc/gasloc/README\.md|lib/python3/dist-packages/gasloc/[_a-z]+(\.py|\.cpython-[^/]+\.so))$' || true)
[ -z "$unexpected" ] || fail "installed files beyond the program and its share files: $unexpected"
if readelf -d "$G" | grep -qE "R(UN)?PATH.*$build"; then fail "the installed program still points into the build tree: $(readelf -d "$G" | grep PATH)"; fi

# A working directory outside the checkout with its own tiny data; no configs/ here.
work=$tmp/work
mkdir -p "$work" && cd "$work"
case "$(pwd -P)/" in "$src"/*) fail "the work directory $(pwd -P) is inside the checkout $src";; esac
[ ! -e configs ] || fail "configs/ exists in the work directory"
prepare_corpus
tiny=(--set data.dir=data --set data.seq_len=32 --set data.batch_size=4 --set data.val_batches=2
      --set train.steps=4 --set train.log_every=2 --set train.eval_every=4 --set train.checkpoint_every=4
      --set train.threads=1)

# The research job by its installed path (as the package's users run it), 2 simulated workers.
"$G" train --config "$P/share/gasloc/configs/research.toml" "${tiny[@]}" --set cluster.workers=2 --set algo.H=2 \
  --set train.run_dir=research > research.log || fail "installed research job failed: $(cat research.log)"
grep -q "done after 4 steps" research.log || fail "research job did not finish: $(cat research.log)"
[ -s research/metrics.jsonl ] && metric_rows research eval val_loss | grep -q . || fail "research run wrote no metrics.jsonl with an evaluation"
grep -qE '"preset": ?"micro"' research/run.json || fail "research run did not take the installed research.toml (model.preset micro): $(head -c 400 research/run.json)"

# A relative --config missing here is the installed one (tiny.toml: preset tiny, run_dir runs/tiny).
"$G" train --config configs/tiny.toml "${tiny[@]}" --set model.preset=nano > tiny.log || fail "--config configs/tiny.toml failed: $(cat tiny.log)"
grep -q "done after 4 steps" tiny.log || fail "tiny job did not finish: $(cat tiny.log)"
[ -s runs/tiny/metrics.jsonl ] || fail "the installed tiny.toml's run_dir runs/tiny has no metrics.jsonl"
# ... unless the working directory has its own, which wins (a checkout behaves as before).
mkdir -p configs && printf '[model]\npreset = "nano"\n[train]\nrun_dir = "own"\n' > configs/tiny.toml
"$G" train --config configs/tiny.toml "${tiny[@]}" > own.log || fail "local configs/tiny.toml failed: $(cat own.log)"
[ -s own/metrics.jsonl ] || fail "a local configs/tiny.toml did not take precedence over the installed one"
rm -rf configs

# A file in neither place: exit 2, and the hint says where relative paths are looked up.
set +e; out=$("$G" train --config configs/none.toml 2>&1); rc=$?; set -e
[ $rc -eq 2 ] || fail "a missing config exited $rc, not 2: $out"
grep -qF "$P/share/gasloc" <<<"$out" || fail "the error for a missing config does not name the installed share dir: $out"

# A study by its relative path; its job = "configs/research.toml" is found the same way.
"$G" sweep experiments/e1_one_step.toml --quick --dry-run > sweep.log || fail "installed study failed: $(cat sweep.log)"
grep -qi "to run" sweep.log || fail "sweep --dry-run listed no runs: $(cat sweep.log)"

# The Python package, when the build has it: imported from the prefix by Debian's python3 outside
# the checkout, it trains a model alone and keeps no path into the build tree.
mods=("$build"/python/gasloc/_core*.so)
if [ -f "${mods[0]}" ]; then
  site=$P/lib/python3/dist-packages
  [ -f "$site/gasloc/__init__.py" ] && ls "$site"/gasloc/_core*.so >/dev/null 2>&1 || fail "the Python package was not installed into $site"
  if readelf -d "$site"/gasloc/_core*.so | grep -qE "R(UN)?PATH.*$build"; then fail "the installed module points into the build tree"; fi
  PYTHONPATH=$site /usr/bin/python3 - > python.log 2>&1 <<'PY' || fail "the installed Python package failed: $(cat python.log)"
import gasloc, torch
assert "/lib/python3/dist-packages/gasloc/" in gasloc.__file__, gasloc.__file__
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with gasloc.Run(model, opt, settings={"algo.name": "diloco", "algo.H": 2, "train.run_dir": "py"}) as run:
    for step in range(run.start_step, 4):
        loss = model(torch.ones(2, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        run.step(loss=loss.item())
print("python ok")
PY
  [ -s py/metrics.jsonl ] || fail "the installed package's run wrote no metrics.jsonl"
fi

help=$("$G" train --help)
grep -q "installed share/gasloc" <<<"$help" || fail "gasloc train --help does not say where configs are looked up: $help"
help=$("$G" --help)
grep -qF "$P/share/gasloc" <<<"$help" || fail "gasloc --help does not name the installed job files: $help"
echo "install_prefix: OK ($P)"
