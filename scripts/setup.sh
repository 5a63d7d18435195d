#!/usr/bin/env bash
# Installs what gasloc needs on a Debian 12 machine (idempotent), fetches the default corpus,
# and builds. Safe to run repeatedly: each part is skipped when already done.
#   scripts/setup.sh               # install + corpus + build everything into build/ (program, tests, benchmarks)
#   scripts/setup.sh --program     # only what the program needs (scripts/demo.sh): no test packages, no tests built
#   scripts/setup.sh --torch pip   # PyPI's torch 2.x into .venv/ and build-torch2/ against it (docs/testing.md)
#   GASLOC_SKIP_BUILD=1 ...        # install + corpus only
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
while (($#)); do
  case "$1" in
    --program) mode=program ;;
    --torch)
      [ "${2:-}" = pip ] || { echo "setup: --torch takes 'pip' (Debian's LibTorch 1.13 is the default)" >&2; exit 2; }
      shift; mode=torch2 ;;
    *) echo "setup: unknown option '$1' (--program, --torch pip)" >&2; exit 2 ;;
  esac
  shift
done

PACKAGES=(
  build-essential cmake pkg-config git
  libtorch-dev libopenblas0-pthread          # LibTorch 1.13 (CPU); OpenBLAS or it runs ~9x slower
  libgloo-dev                                # Gloo headers (c10d backend)
  libsentencepiece-dev                       # tokenizer training and loading
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libssl-dev                                 # OpenSSL 3's libcrypto: job secrets, authenticated store
  gnuplot-nox                                # plots
  ccache                                     # rebuilds (CI, a second build directory) reuse compiled objects
)
# Only the tests and benchmarks need these; the demo (--program) goes without them.
[ "$mode" = program ] || PACKAGES+=(
  libgtest-dev libgmock-dev libbenchmark-dev
  iproute2 procps                            # ss, ip, pgrep: the process and network-namespace tests
  chromium                                   # headless: the dashboard test draws its page (tests/dashboard_page.sh)
  python3-dev pybind11-dev python3-torch     # the Python API (python/, docs/python.md) for Debian's python3
  python3-pytest                             # its tests (tests/python)
)
[ "$mode" = torch2 ] && PACKAGES+=(python3-venv)
# `npm pack` fetches the default corpus; some machines ship npm with their own Node.js build.
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

missing=()
for p in "${PACKAGES[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Default corpus: the npm package nlp-corpus (100 JSON arrays of English sentences, ~9 MB).
CORPUS_VERSION=4.4.0
CORPUS_DIR=data/corpus/nlp-corpus
if [ ! -f "$CORPUS_DIR/.complete" ]; then
  echo "setup: fetching the default corpus (npm package nlp-corpus@$CORPUS_VERSION)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if (cd "$tmp" && npm pack --silent "nlp-corpus@$CORPUS_VERSION" >/dev/null 2>&1) && tar -xzf "$tmp"/nlp-corpus-*.tgz -C "$tmp"; then
    rm -rf "$CORPUS_DIR" && mkdir -p "$(dirname "$CORPUS_DIR")"
    mv "$tmp/package" "$CORPUS_DIR"
    touch "$CORPUS_DIR/.complete"
  else
    # Tests do not need the corpus, so this is a warning here; the demo stops with the same hint.
    echo "setup: WARNING: npm could not fetch nlp-corpus@$CORPUS_VERSION (is the npm registry reachable?)." >&2
    echo "setup: the demo needs it; any corpus works with: build/gasloc prepare --input FILES --out data/default" >&2
  fi
fi

# The dashboard's chart library (gasloc dashboard, report --html): the npm package uplot (MIT),
# embedded into the program at build time (cmake/embed_uplot.cmake); nothing is fetched at run time.
UPLOT_VERSION=1.6.32
UPLOT_DIR=third_party/uplot
if [ ! -f "$UPLOT_DIR/.complete" ] || [ "$(cat "$UPLOT_DIR/.complete")" != "$UPLOT_VERSION" ]; then
  echo "setup: fetching the dashboard's chart library (npm package uplot@$UPLOT_VERSION)"
  tmp_uplot=$(mktemp -d)
  if (cd "$tmp_uplot" && npm pack --silent "uplot@$UPLOT_VERSION" >/dev/null 2>&1) && tar -xzf "$tmp_uplot"/uplot-*.tgz -C "$tmp_uplot"; then
    rm -rf "$UPLOT_DIR" && mkdir -p "$(dirname "$UPLOT_DIR")"
    mv "$tmp_uplot/package" "$UPLOT_DIR"
    echo "$UPLOT_VERSION" > "$UPLOT_DIR/.complete"
  else
    echo "setup: WARNING: npm could not fetch uplot@$UPLOT_VERSION: gasloc builds without it, but" \
         "gasloc dashboard and report --html need it (run scripts/setup.sh again when npm works)" >&2
  fi
  rm -rf "$tmp_uplot"
fi

[ -n "${GASLOC_SKIP_BUILD:-}" ] && exit 0
# ccache keyed on paths relative to this checkout, so that another clone (CI's) reuses the objects.
export CCACHE_BASEDIR=$PWD CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
case "$mode" in
  all)
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" -DGASLOC_BUILD_TESTS=ON -DGASLOC_BUILD_BENCH=ON -DCMAKE_UNITY_BUILD=OFF \
      -DGASLOC_BUILD_PYTHON=ON >/dev/null
    cmake --build build -j"$(nproc)" ;;
  program)
    # A build directory that has the tests keeps them; a new one is configured without.
    # A new one also compiles each layer as a few unity batches: LibTorch's headers cost every
    # object about 7 s of CPU however small its source, so batches of 8 need about a third of the
    # CPU (a bare 2-core machine's first command; docs/testing.md). The tests' build turns them
    # off: one object a source keeps rebuilds small and ccache's keys the same in every checkout.
    [ -f build/CMakeCache.txt ] || launcher+=(-DGASLOC_BUILD_TESTS=OFF -DGASLOC_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON)
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
    echo "setup: building the program (build/gasloc; the tests are built by scripts/test.sh)"
    cmake --build build -j"$(nproc)" --target gasloc ;;
  torch2) exec scripts/setup_torch2.sh ;;
esac
