#!/usr/bin/env bash
# Authenticated jobs end to end (docs/communication.md, "Authenticated jobs"):
#  1. gasloc secret --out FILE writes 64 hex characters with mode 0600 and refuses to overwrite;
#  2. a secret others may read is refused (exit 2) with the chmod that fixes it;
#  3. gasloc launch --secret-file runs a 2-rank Gloo training job to the end, and comm-check too;
#     an elastic GASLoC job with the secret (its transfers sealed) computes the open run's bits,
#     and so does a fixed-world one with overlapped rounds;
#  4. at a `gasloc store --secret-file`, a rank with another secret, or with none, exits 2 at once
#     naming cluster.secret_file, and the store goes on serving the job's real ranks;
#  5. a secret with a command that is not gasloc's (c10d's TCPStore) is refused.
#   tests/auth_launch.sh path/to/gasloc
source "$(dirname "$(readlink -f "$0")")/lib.sh"
G=$(readlink -f "$1")
# expect_exit CODE TEXT CMD...: CMD exits CODE and its output holds TEXT.
expect_exit() {
  local code=$1 text=$2; shift 2
  set +e
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq "$code" ] || fail "exit $rc, not $code: $*: $out"
  grep -qF -- "$text" <<<"$out" || fail "no '$text' in the output of $*: $out"
}

# 1. A new secret: mode 0600, 64 hex characters, never overwritten.
"$G" secret --out job.secret >/dev/null
[ "$(stat -c %a job.secret)" = 600 ] || fail "mode $(stat -c %a job.secret), not 600"
grep -qE '^[0-9a-f]{64}$' job.secret || fail "not 64 hex characters: $(cat job.secret)"
before=$(cat job.secret)
expect_exit 2 "never overwritten" "$G" secret --out job.secret
[ "$(cat job.secret)" = "$before" ] || fail "gasloc secret changed an existing secret"
"$G" secret --out other.secret >/dev/null
[ "$(cat other.secret)" != "$before" ] || fail "two secrets are equal"

# 2. Others may read it: refused before anything starts, with the fix.
chmod 644 job.secret
expect_exit 2 "chmod 600 job.secret" "$G" launch -n 2 --secret-file job.secret -- "$G" comm-check --numel 1000
chmod 600 job.secret

# 3. A small 2-rank Gloo job with a secret, to the end.
prepare_corpus
job=("${nano[@]}"
     --set data.val_batches=2 --set train.log_every=5 --set train.eval_every=10 --set train.threads=1
     --set train.blas_threads=1 --set algo.name=diloco --set algo.H=5 --set cluster.backend=gloo
     --set train.steps=10 --set cluster.timeout_s=60)
timeout 240 "$G" launch -n 2 --secret-file job.secret -- "$G" train "${job[@]}" --set train.run_dir=run > train.log 2>&1 ||
  fail "the job with a secret failed: $(tail -30 train.log)"
last=$(metric_rows run train step | tail -1)
[ "$last" = 10 ] || fail "the run's last train row is step '$last', not 10"
grep -q 'secret_file' run/run.json || fail "run.json does not record cluster.secret_file"
grep -qF "$before" run/run.json train.log && fail "the secret itself was written to run.json or the log"
timeout 120 "$G" launch -n 2 --secret-file job.secret -- "$G" comm-check --numel 1000 > check.log 2>&1 ||
  fail "comm-check with a secret failed: $(tail -20 check.log)"
# 3b. The job elastic on GASLoC-1peer, where every byte goes through pair transfers: sealed with the
# secret, it computes the bits of its run without one (the seal changes nothing it carries).
ejob=("${job[@]}" --set algo.name=gasloc --set algo.topology=1peer)
for run in erun-sealed erun-open; do
  secret=(); [ $run = erun-sealed ] && secret=(--secret-file job.secret)
  timeout 240 "$G" launch --elastic -n 2 "${secret[@]}" -- "$G" train "${ejob[@]}" --set train.run_dir=$run > $run.log 2>&1 ||
    fail "the elastic job $run failed: $(tail -30 $run.log)"
done
# Sorted: the two ranks append their evaluation rows in whichever order they finish.
sealed=$(metric_rows erun-sealed eval_worker step worker val_loss | sort) open=$(metric_rows erun-open eval_worker step worker val_loss | sort)
[ -n "$sealed" ] || fail "the sealed elastic run wrote no evaluation"
[ "$sealed" = "$open" ] || fail "the sealed elastic run's losses differ from the open run's: $sealed / $open"
# Sealed, every payload carries a 16-byte tag: more bytes left than in the open run.
sent_sealed=$(metric_rows erun-sealed train bytes_sent | tail -1) sent_open=$(metric_rows erun-open train bytes_sent | tail -1)
[ "$sent_sealed" -gt "$sent_open" ] || fail "the sealed run sent $sent_sealed bytes, the open one $sent_open: were its transfers sealed?"

# 3c. Overlapped rounds (algo.overlap_steps) in a fixed world: the stop check's and the
# evaluation's sealed collectives run while a sealed round is in flight, on the same pairs. It
# runs to the end with the open run's bits (it once failed at its first round).
ojob=("${job[@]}" --set algo.name=gasloc --set algo.topology=1peer --set algo.overlap_steps=2 --set train.steps=20)
for run in orun-sealed orun-open; do
  secret=(); [ $run = orun-sealed ] && secret=(--secret-file job.secret)
  timeout 240 "$G" launch -n 2 "${secret[@]}" -- "$G" train "${ojob[@]}" --set train.run_dir=$run > $run.log 2>&1 ||
    fail "the overlapped job $run failed: $(tail -30 $run.log)"
done
sealed=$(metric_rows orun-sealed eval step val_loss) open=$(metric_rows orun-open eval step val_loss)
[ "$(wc -l <<<"$sealed")" = 2 ] || fail "the sealed overlapped run wrote $(wc -l <<<"$sealed") evaluations, not 2: $sealed"
[ "$sealed" = "$open" ] || fail "the sealed overlapped run's losses differ from the open run's: $sealed / $open"

# 4. Ranks started by hand at a gasloc store with the secret.
"$G" store --port 0 --job-id auth --secret-file job.secret > store.log 2>&1 &
pids+=($!)
port=""
for _ in $(seq 1 200); do
  port=$(grep -o 'on 127.0.0.1:[0-9]*' store.log | head -1 | cut -d: -f2 || true)
  [ -n "$port" ] && break
  sleep 0.05
done
[ -n "$port" ] || fail "gasloc store did not start: $(cat store.log)"
at_store() {  # at_store ID: the environment of rank ID of a world of 2 at that store
  echo env TORCHELASTIC_USE_AGENT_STORE=True RANK=$1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
}
check=(comm-check --numel 1000 --timeout 60 --job-id auth)
start=$(date +%s)
expect_exit 2 "cluster.secret_file" $(at_store 1) "$G" "${check[@]}" --secret-file other.secret
expect_exit 2 "did not verify" $(at_store 1) "$G" "${check[@]}" --secret-file other.secret
expect_exit 2 "cluster.secret_file" $(at_store 1) "$G" "${check[@]}"
# gasloc train reads it from its configuration: exit 2 as well.
expect_exit 2 "cluster.secret_file" $(at_store 1) "$G" train "${job[@]}" --set train.run_dir=bad --job-id auth \
  --set cluster.secret_file=other.secret
[ $(( $(date +%s) - start )) -lt 30 ] || fail "refusals took $(( $(date +%s) - start )) s: they must come at once"
grep -q "refused 127.0.0.1:" store.log || fail "the store did not log the refused peer: $(cat store.log)"
# The job's own ranks still meet there.
$(at_store 0) "$G" "${check[@]}" --secret-file job.secret > r0.log 2>&1 &
r0=$!
pids+=($r0)
$(at_store 1) "$G" "${check[@]}" --secret-file "$tmp/job.secret" > r1.log 2>&1 ||
  fail "rank 1 with the secret failed: $(tail -20 r1.log)"
wait "$r0" || fail "rank 0 with the secret failed: $(tail -20 r0.log)"

# 5. c10d's TCPStore cannot be authenticated: with a secret, another command's ranks meet at
# gasloc's store (gasloc.Run's do; tests/python), each handed the job's token and the secret's
# path, never the secret, and the launcher says a torch.distributed script cannot join.
expect_exit 0 "c10d's store cannot check" "$G" launch -n 1 --secret-file job.secret -- \
  sh -c 'test -n "$GASLOC_JOB_ID" && test "$GASLOC_SECRET_FILE" = "'"$PWD"'/job.secret"'
expect_exit 1 "exit status 1" "$G" launch -n 1 --secret-file job.secret -- sh -c 'env | grep -q "$(cat job.secret)" && exit 0; exit 1'
echo "auth_launch: OK"
