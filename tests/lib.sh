# The shell tests' common start, sourced first by every tests/*.sh (G, the gasloc binary, is the
# test's own: it is read only when a function here runs).
#   fail MESSAGE        ends the test with FAIL: MESSAGE
#   tmp                 a fresh directory (KEEP_TMP=DIR: that one, kept), the working directory,
#                       removed at exit
#   pids                the test appends every process it starts in the background: at exit each
#                       is continued (a stopped one would not die) and killed
#   at_exit             commands (strings) run at exit before the directory goes, e.g. an umount
#   prepare_corpus [N]  corpus.txt of N lines (300) and its byte-level dataset in data/
#   nano                the settings of a nano model on data/ (sequences of 32, batches of 4)
# and metric_rows (metrics_lib.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/metrics_lib.sh"

fail() { echo "FAIL: $*" >&2; exit 1; }

tmp=${KEEP_TMP:-$(mktemp -d)}
mkdir -p "$tmp"
pids=()
at_exit=()
end_test() {
  local p c
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  # Gone before their directory is removed (a child of this shell; others are not waited for).
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for c in "${at_exit[@]}"; do eval "$c" 2>/dev/null || true; done
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap end_test EXIT
cd "$tmp"

prepare_corpus() {
  local lines=${1:-300} i
  for i in $(seq 1 "$lines"); do printf 'Line %d of a small corpus about foxes and dogs number %d.\n\n' "$i" $((i % 17)); done > corpus.txt
  "$G" prepare --input corpus.txt --out data --byte-level --val-fraction 0.1 >/dev/null
}

nano=(--set model.preset=nano --set data.dir=data --set data.seq_len=32 --set data.batch_size=4)
