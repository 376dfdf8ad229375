#!/usr/bin/env bash
# The PS never trusts the words workers write into its arena (issue 18, docs/SECURITY.md),
# end to end: under mpirun, worker 0 writes a malformed message straight into the PS region
# (tests/tools/ps_inbox_probe.cc) and rings the doorbell. The job must end through the fail-stop
# path: exit status 1, one "strata:" line naming the PS rank it came from and the writer (task and
# rank), the shard and the bad value; never a signal (before the checks, row index 2^40 was a
# SIGSEGV of the PS). Over the default transport on one host (shared memory) and over tcp with
# every rank its own node (each word travels as a request the PS's transport thread serves).
source "$(dirname "$0")/lib.sh"
: "${STRATA_PS_PROBE:?STRATA_PS_PROBE must point at strata_test_ps_inbox_probe}"

# probe CASE TRANSPORT [ENV=VALUE]: the probe job with 1 PS and 2 workers.
probe() {
  local which=$1 transport=$2
  shift 2
  mpi 3 env "$@" "$STRATA_PS_PROBE" "$which" "$transport"
}

# refused LINE: the job ended with status 1 and stderr has LINE from the PS (rank 0), once, and no
# sign of a crash.
refused() {
  expect_rc 1
  [ "$(grep -cF -- "$1" "$ERR")" = 1 ] || fail "stderr should have the PS's line once: '$1'"
  grep -qE '^strata: \[rank 0/3 ps:0 ' "$ERR" || fail "the error line should carry the PS's rank context"
  if grep -qiE 'segmentation|signal [0-9]|core dumped|SIGSEGV|SIGFPE|bad_alloc' "$ERR"; then fail "the PS crashed"; fi
}

for transport in auto tcp; do
  extra=()
  [ "$transport" = tcp ] && extra=(STRATA_TCP_FORCE_REMOTE=1)
  extra+=(STRATA_LOG_LEVEL=warn)

  case_begin "$transport: a clean job ends with status 0"
  probe none "$transport" "${extra[@]}"
  expect_rc 0

  case_begin "$transport: row index 2^40"
  probe row-index "$transport" "${extra[@]}"
  refused "worker:0 (rank 1) put row index 1099511627776 (entry 0 of 1) into its inbox for variable 'dense/kernel' shard 0, which has 784 rows"

  case_begin "$transport: negative row index"
  probe negative-row "$transport" "${extra[@]}"
  refused "worker:0 (rank 1) put row index -3 (entry 1 of 2) into its inbox for variable 'dense/kernel' shard 0, which has 784 rows"

  case_begin "$transport: row count above the inbox's capacity"
  probe row-count "$transport" "${extra[@]}"
  refused "worker:0 (rank 1) put a row count of 785 into its inbox for variable 'dense/kernel' shard 0, which has 784 rows"

  case_begin "$transport: doorbell rung 3 ahead"
  probe doorbell "$transport" "${extra[@]}"
  refused "worker:0 (rank 1) rang its doorbell for variable 'dense/kernel' shard 0 to 3 after 0 of its pushes were applied"

  case_begin "$transport: chunk counter 3 ahead"
  probe chunks "$transport" "${extra[@]}"
  refused "worker:0 (rank 1) announced 3 chunks of its streamed pushes to variable 'big' shard 0 after 0 were applied"
done

finish
