# Shared by scripts/experiments.sh and scripts/results_*.sh (source it).

# prepare_corpus DIR VOCAB: the default corpus tokenized into DIR with a VOCAB-token tokenizer,
# once (a prepared DIR is kept).
prepare_corpus() {
  local dir=$1 vocab=$2 inputs
  [ -f "$dir/dataset.json" ] && return 0
  scripts/default_corpus.sh >/dev/null  # stops here with a hint if the corpus is missing
  mapfile -t inputs < <(scripts/default_corpus.sh)
  echo "preparing $dir (the default corpus, $vocab-token tokenizer; once)" >&2
  build/gasloc prepare --input "${inputs[@]}" --out "$dir" --vocab-size "$vocab" >/dev/null
}

# Builds gasloc if needed and prepares data/default (configs/tiny.toml reads it;
# scripts/bench_train_report.sh uses it).
results_prereqs() {
  [ -x build/gasloc ] || scripts/setup.sh --program
  prepare_corpus data/default 8192
}

# The research regime's data (configs/research.toml): a 1024-token tokenizer, in data/micro1024.
research_data() { prepare_corpus data/micro1024 1024; }

# run_study FILE [gasloc sweep options: --quick, --dry-run, --runs DIR]: builds gasloc if needed
# and runs the study, writing its section of docs/results.md (or $RESULTS_DOC). The study file
# holds everything else: the runs, the claims and the section's text.
run_study() {
  local file=$1
  shift
  # The old scripts took STEPS (and N ROUNDS); the study file fixes them now, before any run.
  if [[ ${1:-} =~ ^[0-9]+$ ]]; then
    echo "$(basename "$0") takes no step or round count any more: $file fixes them (--quick runs fewer)" >&2
    return 2
  fi
  [ -x build/gasloc ] || scripts/setup.sh --program
  build/gasloc sweep "$file" --doc "${RESULTS_DOC:-docs/results.md}" "$@"
}
