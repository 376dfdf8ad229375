#!/usr/bin/env bash
# Liveness (strata/cluster/liveness.h): a stopped rank ends the job within the stall timeout,
# named with its role and host, its last step and phase, whatever its role and whatever the
# consistency mode; a healthy run is never ended by it.
#   - SIGSTOP of worker:1 in async training (the case that used to hang past 150 s)
#   - SIGSTOP of worker:1 under sync
#   - SIGSTOP of the PS (rank 0: rank 1 watches it)
#   - --stall-timeout 4: the job ends within that bound instead of the default 10 s
#   - a worker alive but frozen at one step while the other trains: named after
#     STRATA_PROGRESS_TIMEOUT_S; a long start-up before training is not taken for that
#   - bad --stall-timeout values: one line, exit 2
# The bounds asserted are the timeout plus 8 s of slack for the abort on a loaded 2-core machine.
source "$(dirname "$0")/lib.sh"

# stop_case NAME RANK TIMEOUT ARGS...: starts 1 PS + 2 workers training, waits for the job to
# run, SIGSTOPs world rank RANK, and records how long the job took to end (ELAPSED, RC).
stop_case() {
  local rank=$1 limit=$2
  shift 2
  # Each rank marks the phases it enters (STRATA_TEST_PHASE_DIR): the victim is stopped once it
  # is in its working phase (the PS serving, a worker training), not while it still restores,
  # which a fixed delay after the chief's first line does not guarantee on a loaded machine.
  local phases want=train
  phases=$(mktemp -d)
  [ "$rank" = 0 ] && want=serve
  "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" -x STRATA_NUM_PS=1 -np 3 env STRATA_NUM_PS=1 STRATA_TEST_PHASE_DIR="$phases" \
    "$STRATA_BIN" train --epochs 20 "$@" >"$OUT" 2>"$ERR" &
  local mp=$! t=0
  while [ ! -e "$phases/$rank.$want" ] && [ $t -lt 600 ]; do sleep 0.1; t=$((t + 1)); done
  rm -rf "$phases"
  sleep 0.5
  # The ranks are mpirun's children, in rank order of their start; pick the one with RANK in its
  # environment (OMPI_COMM_WORLD_RANK).
  local victim=""
  for p in $(pgrep -P "$mp"); do
    if grep -qxz "OMPI_COMM_WORLD_RANK=$rank" "/proc/$p/environ" 2>/dev/null; then victim=$p; fi
  done
  if [ -z "$victim" ]; then
    fail "could not find world rank $rank among mpirun's children"
    kill -KILL "$mp" 2>/dev/null
    wait "$mp" 2>/dev/null
    return
  fi
  local t0=$SECONDS
  kill -STOP "$victim"
  t=0
  while kill -0 "$mp" 2>/dev/null && [ $t -lt $(((limit + 8) * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  ELAPSED=$((SECONDS - t0))
  if kill -0 "$mp" 2>/dev/null; then
    fail "the job was still running $((limit + 8)) s after SIGSTOP of rank $rank"
    kill -KILL "$mp" 2>/dev/null
  fi
  kill -CONT "$victim" 2>/dev/null
  wait "$mp"
  RC=$?
  echo "  ended $ELAPSED s after SIGSTOP of rank $rank (status $RC)"
}

case_begin "SIGSTOP of worker:1, async: the job ends within 10 s + slack naming it"
stop_case 2 10
expect_rc_nonzero
expect_stderr_has "strata: liveness: rank 2 (worker:1 on $(hostname -s)) stopped: no heartbeat for"
expect_stderr_has "phase train"

case_begin "SIGSTOP of worker:1, sync"
stop_case 2 10 --consistency sync
expect_rc_nonzero
expect_stderr_has "strata: liveness: rank 2 (worker:1 on $(hostname -s)) stopped"

case_begin "SIGSTOP of the PS (rank 0), watched by rank 1"
stop_case 0 10
expect_rc_nonzero
expect_stderr_has "strata: liveness: rank 0 (ps:0 on $(hostname -s)) stopped"
expect_stderr_has "phase serve"

case_begin "--stall-timeout 4 bounds the detection"
stop_case 1 4 --stall-timeout 4
expect_rc_nonzero
expect_stderr_has "strata: liveness: rank 1 (worker:0 on $(hostname -s)) stopped"
expect_stderr_has "(--stall-timeout 4 s)"

case_begin "a healthy run is not ended by the monitor (1 epoch, a short stall timeout)"
mpi 3 env STRATA_NUM_PS=1 "$STRATA_BIN" train --epochs 1 --stall-timeout 3
expect_rc 0
grep -q "liveness" "$ERR" && fail "the monitor spoke in a healthy run: $(grep liveness "$ERR")"

case_begin "a worker alive but frozen in training while the other moves: named after STRATA_PROGRESS_TIMEOUT_S"
# Rank 2 (worker:1) enters the training phase and then sits at step 0 for 60 s (alive: its
# heartbeats go on), while worker:0 trains (async): the progress check names it about 3 s later.
start=$SECONDS
mpi 3 env STRATA_NUM_PS=1 STRATA_PROGRESS_TIMEOUT_S=3 STRATA_TEST_HOLD_PHASE=train@2:60 "$STRATA_BIN" train --epochs 20
expect_rc_nonzero
expect_stderr_has "strata: liveness: rank 2 (worker:1 on $(hostname -s)) makes no progress: its step has not moved for"
expect_stderr_has "(STRATA_PROGRESS_TIMEOUT_S 3 s); last step 0, phase train"
[ $((SECONDS - start)) -lt 40 ] || fail "the frozen worker was named only after $((SECONDS - start)) s"

case_begin "a start-up longer than STRATA_PROGRESS_TIMEOUT_S is not a stall: the clock starts in training"
# Every rank holds 4 s on entering the restore phase (a long start-up: a large input counted, a
# restore), then worker:1 begins training 1 s after worker:0. Counted from the start of the job,
# worker:1's step 0 would look frozen for 5 s against a timeout of 2.5 s while worker:0 moves.
mpi 3 env STRATA_NUM_PS=1 STRATA_PROGRESS_TIMEOUT_S=2.5 STRATA_TEST_HOLD_PHASE=restore:4,train@2:1 "$STRATA_BIN" \
  train --epochs 1
expect_rc 0
grep -q "liveness" "$ERR" && fail "the monitor spoke in a healthy run: $(grep liveness "$ERR")"

case_begin "a worker alive but late to the end-of-training barrier is named by worker 0 after --timeout"
# Rank 2 (worker:1) sleeps 60 s before the barrier; the global step no longer moves, so worker 0
# gives up after --timeout 4 (not 10 x 4) and names it. A live rank sends heartbeats: liveness
# stays silent.
start=$SECONDS
mpi 3 -x STRATA_TEST_FINAL_DELAY_RANK=2:60 env STRATA_NUM_PS=1 "$STRATA_BIN" train --epochs 1 --timeout 4
took=$((SECONDS - start))
expect_rc_nonzero
expect_stderr_has "[rank 1/3 worker:0 $(hostname -s)] the workers' end-of-training barrier: no worker arrived and the global step"
expect_stderr_has "did not move for 4 s (--timeout / STRATA_TIMEOUT_S); still waiting for rank 2 (worker:1 on $(hostname -s))"
[ "$took" -lt 45 ] || fail "the job took $took s; the barrier should have given up 4 s after the last progress"

case_begin "with checkpoints, a worker waiting for the chief's final save names a chief that is alive but stuck after --timeout"
# Rank 1 (the chief, worker:0) sleeps 60 s on entering its final phase, before it requests the
# final checkpoint; worker:1 finished and waits for that request. The global step no longer moves,
# so worker:1 gives up after --timeout 4 (it used to wait 10 x the timeout + the save timeout).
start=$SECONDS
mpi 3 -x STRATA_TEST_HOLD_PHASE=final-barrier@1:60 env STRATA_NUM_PS=1 "$STRATA_BIN" train --model softmax --steps 30 \
  --checkpoint-dir "$TEST_TMP/ck_chief" --timeout 4
took=$((SECONDS - start))
expect_rc_nonzero
expect_stderr_has "worker 1 finished training and waited 4 s for the chief (worker 0, rank 1) to request the final checkpoint, while the job's global step stayed at 60 (--timeout / STRATA_TIMEOUT_S)"
[ "$took" -lt 45 ] || fail "the job took $took s; worker:1 should have given up 4 s after the last progress"

case_begin "a rank whose output pipe is closed early keeps training and exits with its own status (SIGPIPE ignored)"
# The chief's stdout goes to 'head -n 1', which exits after the first line; every later progress
# line then meets a closed pipe. Seen in the cluster tier as a task dying of SIGPIPE (status 141)
# while the step was torn down after a preemption, which turned the job's 75 into 141.
mpi 2 bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then
    "$0" train --model softmax --steps 300 --log-every 1 --log-every-secs 0 2>/dev/null | head -n 1 >/dev/null
    echo "chief status ${PIPESTATUS[0]}" >&2
  else
    exec "$0" train --model softmax --steps 300 --log-every 1 --log-every-secs 0 >/dev/null 2>&1
  fi' "$STRATA_BIN"
expect_rc 0
expect_stderr_has "chief status 0"

case_begin "bad values"
run "$STRATA_BIN" train --stall-timeout 0
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--stall-timeout must be positive"
run env STRATA_STALL_TIMEOUT_S=soon "$STRATA_BIN" train
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_STALL_TIMEOUT_S"

finish
