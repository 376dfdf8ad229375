#!/usr/bin/env bash
# `strata cluster --verify` under mpirun at 1 to 5 ranks: every rank agrees, the chief prints the
# rank -> task -> node table, the job exits 0.
source "$(dirname "$0")/lib.sh"

# rows: the table's data lines (not comments, not the header).
rows() { grep -vE '^(#|rank )' "$OUT"; }

for np in 1 2 3 4 5; do
  case_begin "mpi resolver at np=$np"
  num_ps=$(( np > 1 ? 1 : 0 ))
  mpi "$np" "$STRATA_BIN" cluster --verify --num-ps "$num_ps" --timeout 30
  expect_rc 0
  expect_stdout_has "# ok: $np ranks agree"
  [ "$(rows | wc -l)" = "$np" ] || fail "expected $np table rows"
  # Exactly one table: only the chief prints.
  [ "$(grep -c '^# strata cluster --verify' "$OUT")" = 1 ] || fail "expected one table"
  if [ "$np" -gt 1 ]; then
    rows | awk 'NR==1 && $2 != "ps:0" {exit 1}' || fail "rank 0 should be ps:0"
    rows | awk -v n="$np" 'NR==n && $2 != "worker:"(n-2) {exit 1}' || fail "last rank should be worker:$((np-2))"
  fi
done

case_begin "TF_CONFIG per rank with a chief, np=4 (MPMD)"
cluster='{"chief": ["c:1"], "ps": ["p:1"], "worker": ["w0:1", "w1:1"]}'
tasks=('ps 0' 'worker 1' 'chief 0' 'worker 0')
contexts=()
for r in 0 1 2 3; do
  read -r type index <<< "${tasks[$r]}"
  [ "$r" -gt 0 ] && contexts+=(:)
  contexts+=(-np 1 env "TF_CONFIG={\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}"
             "$STRATA_BIN" cluster --verify)
done
run "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" "${contexts[@]}"
expect_rc 0
expect_stdout_has "resolver tfconfig"
expect_stdout_has "# ok: 4 ranks agree; chief 1, ps 1, worker 2"
rows | awk '$1 == 2 && $2 != "chief:0" {exit 1}' || fail "rank 2 should be chief:0"
rows | awk '$1 == 1 && $2 != "worker:1" {exit 1}' || fail "rank 1 should be worker:1"

case_begin "explicit cluster file, np=3"
echo '{"ps": ["h0:5000"], "worker": ["h1:5000", "h2:5000"]}' > "$TEST_TMP/c.json"
mpi 3 "$STRATA_BIN" cluster --verify --cluster "$TEST_TMP/c.json"
expect_rc 0
expect_stdout_has "resolver explicit"
rows | awk '$1 == 2 && ($2 != "worker:1" || $5 != "h2:5000") {exit 1}' || fail "rank 2 should be worker:1 at h2:5000"

case_begin "a rank late to MPI_Finalize: its peers' bounded finalize names itself and the job ends"
# Rank 1 sleeps 20 s before its final fence; the others give up on theirs after 2 s, each with one
# line, instead of waiting (a fence with no timeout of its own). mpirun then reports them as ending
# without finalize and tears rank 1 down: the job ends in seconds, not 20 s, and not with status 0.
export STRATA_FINALIZE_TIMEOUT_S=2 STRATA_TEST_FINALIZE_DELAY_RANK=1:20
start=$SECONDS
mpi 3 -x STRATA_FINALIZE_TIMEOUT_S -x STRATA_TEST_FINALIZE_DELAY_RANK "$STRATA_BIN" cluster --verify --num-ps 1
took=$((SECONDS - start))
unset STRATA_FINALIZE_TIMEOUT_S STRATA_TEST_FINALIZE_DELAY_RANK
expect_stdout_has "# ok: 3 ranks agree"
expect_stderr_has "[rank 0/3 ps:0 "
expect_stderr_has "MPI_Finalize did not return within 2 s (STRATA_FINALIZE_TIMEOUT_S)"
[ "$(grep -c 'MPI_Finalize did not return' "$ERR")" -ge 1 ] || fail "no finalize line"
grep 'MPI_Finalize did not return' "$ERR" | grep -q 'rank 1/3' && fail "rank 1 was late, not stuck: it must not report"
[ "$RC" != 0 ] || fail "mpirun must not report success for ranks that left without MPI_Finalize"
[ "$took" -lt 15 ] || fail "the job took $took s; the late rank's 20 s should not have been waited for"

finish
