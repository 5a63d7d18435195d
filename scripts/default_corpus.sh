#!/usr/bin/env bash
# Prints the input files of the default corpus that scripts/setup.sh fetched, one per line.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f data/corpus/nlp-corpus/.complete ]; then
  ls data/corpus/nlp-corpus/builds/doc-*.json | sort -V
else
  echo "default corpus missing (data/corpus/nlp-corpus): run scripts/setup.sh, or prepare your own" >&2
  echo "corpus with: build/gasloc prepare --input FILES --out data/default" >&2
  exit 1
fi
