#!/usr/bin/env bash
# `pip install .` (pyproject.toml, scikit-build-core): the package built by pip for an interpreter
# and its torch (build-torch2: the virtual environment's PyPI torch 2.x) imports outside the
# checkout and trains one worker alone; imported under another torch version it is an ImportError
# naming both versions and the pip command that rebuilds it. --target keeps the environment as it
# is; pip builds in SOURCE/build-pip (kept: a second install compiles only what changed) through
# ccache (a first one takes the objects of the build that runs this test).
#   tests/pip_install.sh SOURCE PYTHON
source "$(dirname "$(readlink -f "$0")")/lib.sh"
SRC=$(readlink -f "$1")
PY=$2
export CCACHE_BASEDIR=$SRC CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# The compiler CMake picks for the other builds (scikit-build-core would take the interpreter's,
# x86_64-linux-gnu-g++, whose objects ccache keeps apart), and the machine's two cores.
export CXX=${CXX:-c++} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
start=$(date +%s)
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps --target site "$SRC" >pip.log 2>&1 ||
  { tail -40 pip.log; fail "pip install . failed (whole log above)"; }
took=$(( $(date +%s) - start ))
[ -f site/gasloc/__init__.py ] && ls site/gasloc/_core*.so >/dev/null || fail "pip installed no gasloc/_core module: $(ls -R site | head)"
PYTHONPATH=$PWD/site "$PY" - <<'PYEOF' || fail "the pip-installed package did not train"
import os, torch, gasloc
assert os.path.dirname(gasloc.__file__) == os.path.join(os.getcwd(), "site", "gasloc"), gasloc.__file__
assert gasloc._build_info.TORCH_VERSION == torch.__version__
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
losses = []
with gasloc.Run(model, opt, settings={"algo.name": "diloco", "algo.H": 5, "train.run_dir": "run"}) as run:
    for step in range(run.start_step, 20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        run.step(loss=loss.item())
        losses.append(loss.item())
assert losses[-1] < losses[0], losses
PYEOF
PYTHONPATH=$PWD/site "$PY" -c "import torch; torch.__version__ = '0.0.1-other'; import gasloc" 2>err.txt &&
  fail "imported under another torch version"
for want in ImportError 0.0.1-other "torch $("$PY" -c 'import torch; print(torch.__version__)')" "pip install --no-build-isolation $SRC"; do
  grep -qF -- "$want" err.txt || fail "the ImportError does not say '$want': $(cat err.txt)"
done
echo "pip_install: pip install . built and installed the module in ${took} s; it trains; another torch is an ImportError naming both and the pip command"
