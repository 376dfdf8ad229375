#!/usr/bin/env bash
# Configuration an attacker or a typo can hand strata (issue 18, item 5): JSON nested a million
# deep, numbers past double's range and durations past the clock's. Each is one line on stderr
# naming its source and exit status 2, or, for a huge duration, a job that runs as if the wait were
# unbounded; never a crash and never a job that ends at once (docs/SECURITY.md, "What is checked,
# whoever sent it"; docs/RELIABILITY.md, "Bounds on every wait").
source "$(dirname "$0")/lib.sh"

GOOD_CLUSTER='{"ps":["p:1"],"worker":["w0:1","w1:1"]}'
brackets() { head -c "$1" /dev/zero | tr '\0' '['; }

case_begin "--cluster file nested a million deep"
{ printf '{"worker": '; brackets 1000000; } > "$TEST_TMP/deep.json"
run "$STRATA_BIN" cluster --cluster "$TEST_TMP/deep.json"
expect_rc 2; expect_one_stderr_line; expect_stdout_empty
expect_stderr_has "strata: error: --cluster file '$TEST_TMP/deep.json': JSON nested deeper than 64 levels (at byte 74)"

case_begin "--cluster file nested a million deep, balanced (valid JSON)"
{ printf '{"worker": '; brackets 1000000; head -c 1000000 /dev/zero | tr '\0' ']'; printf '}'; } > "$TEST_TMP/deep2.json"
run "$STRATA_BIN" cluster --cluster "$TEST_TMP/deep2.json"
expect_rc 2; expect_one_stderr_line; expect_stderr_has "JSON nested deeper than 64 levels"

# One argument or variable holds at most 128 KiB (MAX_ARG_STRLEN): 100,000 brackets.
case_begin "--cluster text nested 100,000 deep"
run "$STRATA_BIN" cluster --cluster "{\"worker\": $(brackets 100000)"
expect_rc 2; expect_one_stderr_line
expect_stderr_has "strata: error: --cluster: JSON nested deeper than 64 levels (at byte 74)"

case_begin "STRATA_CLUSTER nested 100,000 deep"
run env STRATA_CLUSTER="{\"worker\": $(brackets 100000)" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line
expect_stderr_has "strata: error: STRATA_CLUSTER: JSON nested deeper than 64 levels (at byte 74)"

case_begin "TF_CONFIG nested 100,000 deep"
run env TF_CONFIG="{\"cluster\": $(brackets 100000)" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line
expect_stderr_has "strata: error: TF_CONFIG: JSON nested deeper than 64 levels (at byte 75)"

case_begin "TF_CONFIG nested deep under mpirun: status 2 on every rank, said once per rank"
mpi 2 env TF_CONFIG="{\"cluster\": $(brackets 100000)" "$STRATA_BIN" cluster --verify
expect_rc 2
[ "$(count_stderr "TF_CONFIG: JSON nested deeper than 64 levels")" -ge 1 ] || fail "no rank named TF_CONFIG's depth"

case_begin "TF_CONFIG number overflow (1e400) is a usage error naming TF_CONFIG"
run env TF_CONFIG="{\"cluster\": $GOOD_CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 1e400}}" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stdout_empty
expect_stderr_has "strata: error: TF_CONFIG has a number out of range: [json.exception.out_of_range.406] number overflow parsing '1e400'"

case_begin "TF_CONFIG integer of 400 digits"
run env TF_CONFIG="{\"cluster\": $GOOD_CLUSTER, \"environment\": $(head -c 400 /dev/zero | tr '\0' '7')}" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "strata: error: TF_CONFIG has a number out of range"

case_begin "TF_CONFIG task index past int64"
run env TF_CONFIG="{\"cluster\": $GOOD_CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 99999999999999999999}}" \
  "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "TF_CONFIG: task index"

case_begin "--cluster /dev/zero is read only up to the bound"
run "$STRATA_BIN" cluster --cluster /dev/zero
expect_rc 2; expect_one_stderr_line
expect_stderr_has "--cluster: file '/dev/zero' is larger than 64 MiB"

# Before the clamp, 1e10 s overflowed steady_clock's nanoseconds: every deadline lay in the past and
# the job ended at once naming a stall.
case_begin "--timeout 1e10 is taken as 1e6 s: the bootstrap completes"
mpi 3 "$STRATA_BIN" cluster --verify --cluster "$GOOD_CLUSTER" --timeout 1e10
expect_rc 0; expect_stdout_has "ps:0"; expect_stdout_has "worker:1"

case_begin "STRATA_TIMEOUT_S and STRATA_FINALIZE_TIMEOUT_S of 1e10"
mpi 3 env STRATA_TIMEOUT_S=1e10 STRATA_FINALIZE_TIMEOUT_S=1e10 "$STRATA_BIN" cluster --verify --cluster "$GOOD_CLUSTER"
expect_rc 0; expect_stdout_has "worker:1"
[ ! -s "$ERR" ] || fail "expected nothing on stderr"

case_begin "train with every duration huge runs to the end"
mpi 2 env STRATA_PROGRESS_TIMEOUT_S=1e300 "$STRATA_BIN" train --model softmax --steps 30 --log-every 0 \
  --timeout 1e10 --stall-timeout 9.3e9 --log-every-secs 1e12 --checkpoint-dir "$TEST_TMP/ckpt" \
  --save-every-secs 1e15 --keep-every-n-hours 1e300
expect_rc 0; expect_stdout_has '"global_step":'

case_begin "negative, zero and non-finite durations are usage errors naming the flag"
for args in "--timeout=-1|--timeout must be positive, got '-1'" \
            "--timeout 0|--timeout must be positive, got '0'" \
            "--timeout nan|--timeout: 'nan' is not a number" \
            "--timeout 1e400|--timeout: '1e400' is not a finite number" \
            "--stall-timeout inf|--stall-timeout: 'inf' is not a number" \
            "--log-every-secs=-1|--log-every-secs must not be negative, got '-1'" \
            "--eval-throttle-secs=-0.5|--eval-throttle-secs must not be negative, got '-0.5'" \
            "--keep-every-n-hours=-2 --checkpoint-dir $TEST_TMP/k|--keep-every-n-hours must not be negative, got '-2'" \
            "--save-every-secs=-5 --checkpoint-dir $TEST_TMP/k|--save-every-secs must not be negative, got '-5'"; do
  flags=${args%%|*}; message=${args#*|}
  # shellcheck disable=SC2086
  run "$STRATA_BIN" train $flags
  expect_rc 2; expect_one_stderr_line; expect_stderr_has "strata: error: $message"
done

case_begin "duration variables: non-finite or negative values are usage errors naming the variable"
run env STRATA_TIMEOUT_S=1e999 "$STRATA_BIN" cluster --verify --cluster "$GOOD_CLUSTER"
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_TIMEOUT_S: '1e999' is not a finite number"
run env STRATA_PROGRESS_TIMEOUT_S=-1 "$STRATA_BIN" train
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_PROGRESS_TIMEOUT_S must not be negative, got '-1'"
run env STRATA_STALL_TIMEOUT_S=0 "$STRATA_BIN" train
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_STALL_TIMEOUT_S must be positive, got '0'"

case_begin "--help says how durations are bounded"
run "$STRATA_BIN" train --help
expect_rc 0; expect_stdout_has "a value above 1e6 s (11.6 days) is taken as 1e6 s"

echo "$CASES cases, $FAILURES failures"
[ "$FAILURES" = 0 ]
