# The per-failure part of scripts/soak_elastic.sh's report. Input: faults.txt ("T WHAT RANK", one
# line per injected failure) then launch.log (every line time-stamped on the same clock). Each
# launcher restart must follow a fault of its rank (else a rank that was not hit failed too). Per
# failure, until the next failure of the same rank: the seconds from the fault to the first view
# that leaves the rank out, and to its next incarnation's rejoin; then, per kind of failure, the
# median and the largest. -v quiet=1: the summary lines only.
function sort(a, k,   i, j, x) { for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x } }
function median(a, k) { return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
NR == FNR { n++; t[n] = $1; what[n] = $2; r[n] = $3; next }
FNR == 1 {
  for (i = 1; i <= n; i++) { until[i] = 1e18; for (j = i + 1; j <= n; j++) if (r[j] == r[i]) { until[i] = t[j]; break } }
}
{
  # Restarts: each must follow a fault of its rank (a fault covers one failure of its rank).
  while (next_fault < n && t[next_fault + 1] <= $1) { next_fault++; hit[r[next_fault]] = 1 }
  if (match($0, /launch: rank [0-9]+ \(incarnation [0-9]+\) failed/)) {
    split(substr($0, RSTART, RLENGTH), w, " "); restarts++
    if (hit[w[3]]) hit[w[3]] = 0
    else { unhit++; unhit_list = unhit_list sprintf(" rank %s at %s s;", w[3], $1) }
  }
  for (i = 1; i <= n; i++) {
    if ($1 < t[i] || $1 >= until[i]) continue
    if (!(i in left) && /left \(died/ && $0 ~ ("worker\\(s\\) ([0-9]+, )*" r[i] "[ ,]")) left[i] = $1
    if (!(i in restart) && $0 ~ ("launch: rank " r[i] " \\(incarnation [0-9]+\\) failed")) restart[i] = $1
    if (!(i in back) && $0 ~ ("launch: rank " r[i] " \\(incarnation [0-9]+\\) rejoined")) back[i] = $1
  }
}
END {
  # A kill that comes with a stop (the soak stops a rank right after some kills): its round, and
  # so its view, wait for the stopped rank to be named dead.
  for (i = 1; i <= n; i++)
    for (j = 1; j <= n; j++)
      if (what[i] == "kill" && what[j] == "stop" && t[j] - t[i] >= 0 && t[j] - t[i] < 1) with_stop[i] = 1
  for (i = 1; i <= n; i++) {
    k = what[i] ((i in with_stop) ? "+stop" : "")
    if (!(i in left) && !(i in back)) {
      detail = detail sprintf("%s rank %s at %s s: never left the view and was not restarted (its transfers waited out the outage)\n", what[i], r[i], t[i])
      stayed[k]++
      continue
    }
    # A rank whose leaving no view printed, only its rejoin: views are printed by their lowest
    # surviving id, which may be the stopped rank; or the views pinned ahead (ranks that did not
    # wait for it ran a few rounds on) listed it until its next incarnation joined.
    if (i in left) { l = left[i] - t[i]; nl[k]++; L[k, nl[k]] = l } else unseen[k]++
    b = (i in back) ? back[i] - t[i] : -1
    if (b >= 0) { nb[k]++; B[k, nb[k]] = b } else notback[k]++
    if (b >= 0 && (i in restart)) { nr[k]++; R[k, nr[k]] = back[i] - restart[i] }
    detail = detail sprintf("%s rank %s at %s s: %s, back in the mixing after %s s%s\n", what[i] ((i in with_stop) ? " (with a stop)" : ""), r[i], t[i],
                            ((i in left) ? sprintf("left the view after %.1f s", l) : "no view printed its leaving"),
                            (b >= 0 ? sprintf("%.1f", b) : "?"), (b >= 0 && (i in restart) ? sprintf(" (%.1f s after its restart)", back[i] - restart[i]) : ""))
  }
  printf "restarts: %d for %d injected failures, %d of a rank that was not hit%s\n", restarts, n, unhit, unhit ? ":" unhit_list : ""
  split("kill kill+stop stop link", kinds, " ")
  for (q = 1; q <= 4; q++) {
    k = kinds[q]
    if (!nl[k] && !stayed[k]) continue
    delete x; for (i = 1; i <= nl[k]; i++) x[i] = L[k, i]; sort(x, nl[k])
    line = sprintf("%s: %d left the view after %.1f s (median), %.1f s at most", k, nl[k], median(x, nl[k]), x[nl[k]])
    delete x; for (i = 1; i <= nb[k]; i++) x[i] = B[k, i]; sort(x, nb[k])
    if (nb[k]) line = line sprintf("; back in the mixing after %.1f s (median), %.1f s at most", median(x, nb[k]), x[nb[k]])
    delete x; for (i = 1; i <= nr[k]; i++) x[i] = R[k, i]; sort(x, nr[k])
    if (nr[k]) line = line sprintf(", %.1f s (median) and %.1f s at most after its restart", median(x, nr[k]), x[nr[k]])
    if (notback[k]) line = line sprintf("; %d not back before the run ended", notback[k])
    if (stayed[k]) line = line sprintf("; %d never left the view", stayed[k])
    if (unseen[k]) line = line sprintf("; %d whose leaving no view printed", unseen[k])
    print line
  }
  if (!quiet) printf "per failure:\n%s", detail
}
