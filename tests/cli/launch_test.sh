#!/usr/bin/env bash
# mpi_launch/strata-mpirun: the flags it adds, its bad input, and a real 3-rank job through it.
source "$(dirname "$0")/lib.sh"
LAUNCH="$STRATA_SOURCE_DIR/mpi_launch/strata-mpirun"
cores=$(nproc)

case_begin "dry run adds oversubscribe and bind-to none only when needed"
run "$LAUNCH" --ps 1 --workers $((cores + 1)) --dry-run -- strata train
expect_rc 0
expect_stdout_has "--oversubscribe"
expect_stdout_has "--bind-to none"
expect_stdout_has "-np $((cores + 2))"
expect_stdout_has "STRATA_NUM_PS=1"
if [ "$(id -u)" = 0 ]; then expect_stdout_has "--allow-run-as-root"; fi

case_begin "dry run within the core count"
run "$LAUNCH" --ps 0 --workers 1 --dry-run -- strata train
expect_rc 0
grep -qF -- "--oversubscribe" "$OUT" && fail "should not oversubscribe 1 rank"
grep -qF -- "--bind-to" "$OUT" && fail "should keep Open MPI's binding for 1 single-threaded rank"

case_begin "cpu replicas unbind"
run "$LAUNCH" --ps 0 --workers 1 --cpu-replicas 2 --dry-run -- strata train
expect_rc 0
expect_stdout_has "--bind-to none"

case_begin "bad input"
run "$LAUNCH" --ps x --workers 2 -- true
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--ps: 'x'"
run "$LAUNCH" --ps 1 --workers 2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "no command"
run "$LAUNCH" --ps 1 --workers 2 --bogus -- true
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--bogus"

case_begin "a real job: 1 PS + 2 workers verify"
run "$LAUNCH" --ps 1 --workers 2 -- "$STRATA_BIN" cluster --verify --timeout 30
expect_rc 0
expect_stdout_has "# ok: 3 ranks agree; ps 1, worker 2"

case_begin "every STRATA_* variable is forwarded"
run env STRATA_TIMEOUT_S=33 STRATA_TRANSPORT=tcp "$LAUNCH" --ps 1 --workers 1 --dry-run -- strata train
expect_rc 0
expect_stdout_has "-x STRATA_TIMEOUT_S"
expect_stdout_has "-x STRATA_TRANSPORT"
run env STRATA_TIMEOUT_S=33 "$LAUNCH" --ps 1 --workers 1 -- bash -c 'echo "rank $OMPI_COMM_WORLD_RANK timeout $STRATA_TIMEOUT_S"'
expect_rc 0
expect_stdout_has "rank 1 timeout 33"

case_begin "a killed rank is named with its role; mpirun's status is kept"
run "$LAUNCH" --ps 1 --workers 2 -- bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 2 ]; then sleep 1; kill -9 $$; fi; sleep 20'
expect_rc 137
expect_stderr_has "strata-mpirun: rank 2 (worker:1 on $(hostname -s)) was killed by signal 9 (KILL)"
run "$LAUNCH" --ps 1 --workers 1 -- bash -c 'exit 3'
expect_rc 3

case_begin "SIGUSR1 to the launcher reaches the ranks (preemption)"
"$LAUNCH" --ps 1 --workers 1 -- bash -c 'trap "exit 75" USR1; sleep 20 & wait' >"$OUT" 2>"$ERR" &
pid=$!
sleep 2
kill -USR1 "$pid"
wait "$pid"
RC=$?
expect_rc 75

finish
