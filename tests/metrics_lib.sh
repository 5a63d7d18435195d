# Reading a run's metrics in tests, through `gasloc report --csv -` (the typed schema's reader),
# never with patterns over metrics.jsonl. Sourced by the shell tests; G is the gasloc binary.
#   metric_rows RUN EVENT COLUMN...: the named columns of RUN's rows of EVENT (train, eval,
#   eval_worker), one row a line, space-separated, in the file's order.
metric_rows() {
  local run=$1 event=$2; shift 2
  "$G" report "$run" --csv - | awk -F, -v ev="$event" -v cols="$*" '
    NR == 1 { for (i = 1; i <= NF; i++) idx[$i] = i; n = split(cols, want, " ");
              for (k = 1; k <= n; k++) if (!(want[k] in idx)) { print "metric_rows: no column " want[k] > "/dev/stderr"; exit 2 }
              next }
    $2 == ev { line = ""; for (k = 1; k <= n; k++) line = line (k > 1 ? " " : "") $(idx[want[k]]); print line }'
}
