#!/usr/bin/env bash
# gasloc dashboard end to end, as a user runs it: a tiny 2-worker run trains in the background, the
# dashboard serves it on a free port, and headless Chromium loads the page while the run is still
# training and must draw its charts; the server's answers to other requests, a taken port, Ctrl+C;
# then `report --html` writes the same page with the data inside, which Chromium draws from disk.
#   tests/dashboard_page.sh path/to/gasloc
# Needs Chromium (the Debian package chromium, which scripts/setup.sh installs): without it this
# test fails and says so, since a skipped test would hide a dashboard that draws nothing.
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || fail "chromium is not installed: run scripts/setup.sh (it installs the Debian package chromium)"

# The page as Chromium builds it; --virtual-time-budget lets its script fetch and draw first.
dump_dom() {
  timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$tmp/chrome" \
    --virtual-time-budget=8000 --dump-dom "$1" 2>chromium.log
}
charts_drawn() { sed -nE 's/.*data-charts-drawn="([0-9]+)".*/\1/p' "$1" | head -1; }
# http_get PORT REQUEST-LINE: the answer's status line, over bash's /dev/tcp (no curl needed).
http_status() {
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf '%s\r\nHost: localhost\r\n\r\n' "$2" >&3
  head -1 <&3 | tr -d '\r'
  exec 3<&-
}

prepare_corpus

# Far more steps than the test waits for: the run is still training while the page is loaded.
"$G" train "${nano[@]}" \
  --set data.val_batches=2 --set train.threads=1 --set cluster.workers=2 --set algo.name=diloco --set algo.H=4 \
  --set train.steps=100000 --set train.log_every=2 --set train.eval_every=4 --set train.checkpoint_every=0 \
  --set train.run_dir=run > train.log 2>&1 &
train_pid=$!
pids+=("$train_pid")
for _ in $(seq 1 120); do
  [ -f run/metrics.jsonl ] && [ "$(metric_rows run eval step 2>/dev/null | wc -l)" -ge 2 ] && break
  kill -0 "$train_pid" 2>/dev/null || fail "training stopped early: $(cat train.log)"
  sleep 0.5
done
[ "$(metric_rows run eval step | wc -l)" -ge 2 ] || fail "no evaluations after 60 s: $(cat train.log)"

"$G" dashboard run --port 0 --refresh 1 > dash.log 2>&1 &
dash_pid=$!
pids+=("$dash_pid")
for _ in $(seq 1 100); do grep -q '^dashboard: http://' dash.log && break; sleep 0.1; done
url=$(sed -nE 's|^dashboard: (http://[0-9.]+:[0-9]+/) .*|\1|p' dash.log)
[ -n "$url" ] || fail "the dashboard printed no URL: $(cat dash.log)"
port=$(sed -nE 's|.*:([0-9]+)/$|\1|p' <<<"$url")

[ "$(http_status "$port" "GET /data.json HTTP/1.1")" = "HTTP/1.1 200 OK" ] || fail "GET /data.json did not answer 200"
[ "$(http_status "$port" "POST / HTTP/1.1")" = "HTTP/1.1 405 Method Not Allowed" ] || fail "POST was not refused with 405"
[ "$(http_status "$port" "GET /nothing-here HTTP/1.1")" = "HTTP/1.1 404 Not Found" ] || fail "an unknown path was not 404"
set +e; taken=$("$G" dashboard run --port "$port" 2>&1); rc=$?; set -e
[ $rc -eq 2 ] && grep -q "already in use" <<<"$taken" || fail "a taken port gave status $rc: $taken"

dump_dom "$url" > live.html || fail "chromium could not load $url: $(tail -5 chromium.log)"
kill -0 "$train_pid" 2>/dev/null || fail "the run finished before the page was loaded: not a live view"
drawn=$(charts_drawn live.html)
[ -n "$drawn" ] && [ "$drawn" -ge 5 ] || fail "the live page drew ${drawn:-no} charts, not 5: $(head -c 2000 live.html)"
grep -q 'data-state="training"' live.html || fail "the live page does not show the run as training"
grep -q '<canvas' live.html || fail "the live page has no canvas"

kill -INT "$dash_pid"
for _ in $(seq 1 50); do kill -0 "$dash_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$dash_pid" 2>/dev/null && fail "the dashboard did not stop within 5 s of Ctrl+C"
set +e; wait "$dash_pid"; rc=$?; set -e
[ $rc -eq 0 ] && grep -q "dashboard: stopped" dash.log || fail "Ctrl+C did not stop the dashboard cleanly ($rc): $(cat dash.log)"

kill -INT "$train_pid"
wait "$train_pid" || true
"$G" report run --html report.html > report.log || fail "report --html failed: $(cat report.log)"
grep -q "^html: " report.log || fail "report --html did not name its file: $(cat report.log)"
dump_dom "file://$tmp/report.html" > frozen.html || fail "chromium could not open report.html: $(tail -5 chromium.log)"
drawn=$(charts_drawn frozen.html)
[ -n "$drawn" ] && [ "$drawn" -ge 5 ] || fail "report --html drew ${drawn:-no} charts, not 5: $(head -c 2000 frozen.html)"

# Two runs on one page: each metric is one chart with a curve per run (data-run-series, which
# the page sets on each comparing chart), and the picker (here #hide=NAME) hides a run's curves.
cp -r run run2
"$G" report run run2 --html compare.html > report.log || fail "report --html of two runs failed: $(cat report.log)"
run_series() { sed -nE "s/.*data-chart=\"$2\" data-run-series=\"([0-9]+)\" data-runs-shown=\"([0-9]+)\".*/\1 \2/p" "$1" | head -1; }
dump_dom "file://$tmp/compare.html" > compare_dom.html || fail "chromium could not open compare.html: $(tail -5 chromium.log)"
for chart in train val consensus; do
  [ "$(run_series compare_dom.html $chart)" = "2 2" ] ||
    fail "the $chart chart of two runs does not hold both runs' curves: '$(run_series compare_dom.html $chart)'"
done
dump_dom "file://$tmp/compare.html#hide=run2" > hidden_dom.html || fail "chromium could not open compare.html#hide=run2"
[ "$(run_series hidden_dom.html val)" = "2 1" ] || fail "#hide=run2 did not hide run2's curve: '$(run_series hidden_dom.html val)'"
echo "dashboard_page: OK (live page drew $(charts_drawn live.html) charts, report --html $drawn; two runs on one chart each)"
