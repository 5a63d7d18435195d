#!/usr/bin/env bash
# Prints the input files of the default corpus that scripts/setup.sh fetched, one per line.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f data/corpus/nlp-corpus/.complete ]; then
  ls data/corpus/nlp-corpus/builds/doc-*.json | sort -V
elif [ -f data/corpus/bible-kjv/.complete ]; then
  ls /usr/share/bible-kjv/*.txt 2>/dev/null || echo /usr/share/dict/words
else
  echo "default corpus missing: run scripts/setup.sh" >&2
  exit 1
fi
