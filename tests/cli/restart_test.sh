#!/usr/bin/env bash
# Restarts inside the allocation: mpi_launch/strata-mpirun --max-restarts N (STRATA_MAX_RESTARTS),
# with real mpirun, a real kill -9 of a worker rank and real HDF5 checkpoints.
#   - a healthy run through the launcher with restarts on: no restart, "restarts": 0 (and the
#     reference global step of an uninterrupted run)
#   - worker:1 killed (SIGKILL) after the first committed checkpoint: the job is launched again
#     with --restore latest, restores that checkpoint, ends with status 0 at the same global step
#     as the uninterrupted run, and its summary says "restarts": 1
#   - a usage error: status 2, one error line, never launched again
#   - a failure that repeats before any newer checkpoint: one restart, then a line saying that
#     restart made no progress, and the failure's status
#   - --max-restarts 0: a failure ends the job as before (no restart, mpirun's status)
#   - preemption (SIGUSR1 to the launcher): status 75 passed on, no restart
#   - bad values and commands that cannot restart: one line, status 2
# Each job is 1 PS + 2 workers, MLP on Fashion-MNIST, 1-2 epochs (a few seconds each).
source "$(dirname "$0")/lib.sh"
LAUNCH="$STRATA_SOURCE_DIR/mpi_launch/strata-mpirun"
HOST=$(hostname -s)
if [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: /usr/share/datasets/fashion-mnist missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi

# kill_rank.sh WHEN DIR CMD...: the command of every rank. World rank 2 (worker:1) is SIGKILLed
# (the exec'd strata process itself) when WHEN says: "after-ckpt" = once DIR holds a committed
# checkpoint, in the first run only (STRATA_RESTART_COUNT 0); "early" = 0.5 s after it starts,
# in every run (before the first save of a 2-epoch run without periodic saves).
KILLER="$TEST_TMP/kill_rank.sh"
cat >"$KILLER" <<'EOF'
#!/usr/bin/env bash
when=$1 dir=$2; shift 2
if [ "$OMPI_COMM_WORLD_RANK" = 2 ]; then
  me=$$
  case $when in
    after-ckpt)
      if [ "${STRATA_RESTART_COUNT:-0}" = 0 ]; then
        ( for _ in $(seq 1200); do compgen -G "$dir/ckpt-*.h5" >/dev/null && break; sleep 0.05; done
          kill -9 "$me" ) &
      fi ;;
    early) ( sleep 0.5; kill -9 "$me" ) & ;;
  esac
fi
exec "$@"
EOF
chmod +x "$KILLER"

TRAIN=(train --model mlp --data fashion-mnist --log-every 0)
summary_get() { grep -E '^\{.*"global_step"' "$OUT" | tail -n1 | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
count_stdout() { grep -cE -- "$1" "$OUT"; }

case_begin "a healthy run with restarts on: no restart, restarts 0"
run env STRATA_MAX_RESTARTS=3 "$LAUNCH" --ps 1 --workers 2 -- "$STRATA_BIN" "${TRAIN[@]}" --epochs 2 \
  --checkpoint-dir "$TEST_TMP/ck0" --save-every-steps 100
expect_rc 0
grep -q "restart" "$ERR" && fail "the launcher spoke of restarts in a healthy run: $(grep restart "$ERR")"
WANT_GLOBAL=$(summary_get 'j["global_step"]')
[ "$(summary_get 'j["restarts"]')" = 0 ] || fail "summary restarts: $(summary_get 'j.get("restarts")'), expected 0"
echo "  uninterrupted run: global_step $WANT_GLOBAL"

case_begin "worker:1 killed after a checkpoint: restarted, restored, same global step, restarts 1"
ck=$TEST_TMP/ck1
t0=$SECONDS
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 2 -- "$KILLER" after-ckpt "$ck" "$STRATA_BIN" "${TRAIN[@]}" --epochs 2 \
  --checkpoint-dir "$ck" --save-every-steps 100
echo "  took $((SECONDS - t0)) s"
expect_rc 0
expect_stderr_has "strata-mpirun: rank 2 (worker:1 on $HOST) was killed by signal 9 (KILL)"
[ "$(count_stderr "strata-mpirun: restart ")" = 1 ] || fail "expected exactly one restart line"
grep -qE "^strata-mpirun: restart 1 of 2: rank 2 \(worker:1 on $HOST\) was killed by signal 9 \(KILL\) \(status 137\); relaunching with --restore latest \(latest checkpoint: ckpt-[0-9]+\.h5\)$" "$ERR" \
  || fail "no one-line restart log naming the rank, role, host and status"
restored=$(grep -oE '^checkpoint: restored [0-9]+ variable\(s\) from .*/ckpt-[0-9]+\.h5 \(global step [0-9]+\)$' "$OUT" | head -n1)
[ -n "$restored" ] || fail "no 'checkpoint: restored ... from .../ckpt-N.h5' line"
[ "$(count_stdout '^resuming at epoch [0-9]+, step [0-9]+, global step [0-9]+$')" = 1 ] || fail "no 'resuming at' line"
[ "$(count_stdout '^\{.*"global_step"')" = 1 ] || fail "expected one summary (the killed run printed none)"
got=$(summary_get 'j["global_step"], j["restarts"], j["restored_from"].rsplit("/", 1)[-1]' 2>&1)
want_from=$(grep -oE 'ckpt-[0-9]+\.h5' <<<"$restored")
[ "$got" = "$WANT_GLOBAL 1 $want_from" ] || fail "summary global_step, restarts, restored_from: '$got', expected '$WANT_GLOBAL 1 $want_from'"
run "$STRATA_BIN" ckpt verify "$ck"
expect_rc 0

case_begin "a usage error is not restarted: status 2, one error line"
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 2 -- "$STRATA_BIN" "${TRAIN[@]}" --epochs 1 \
  --checkpoint-dir "$TEST_TMP/ck2" --restore "$TEST_TMP/missing.h5"
expect_rc 2
[ "$(count_stderr "strata train: error: restore: '$TEST_TMP/missing.h5' does not exist")" = 1 ] || fail "expected one 'strata train: error:' line"
grep -q "restart" "$ERR" && fail "a usage error was restarted: $(grep restart "$ERR")"

case_begin "a failure that repeats without a newer checkpoint: one restart, then stops"
ck=$TEST_TMP/ck3
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 3 -- "$KILLER" early "$ck" "$STRATA_BIN" "${TRAIN[@]}" --epochs 2 \
  --checkpoint-dir "$ck"
expect_rc 137
[ "$(count_stderr "strata-mpirun: restart ")" = 1 ] || fail "expected exactly one restart line"
expect_stderr_has "strata-mpirun: restart 1 of 3: rank 2 (worker:1 on $HOST) was killed by signal 9 (KILL) (status 137); relaunching with --restore latest (latest checkpoint: none)"
expect_stderr_has "strata-mpirun: not restarting: restart 1 made no progress (no checkpoint newer than none in $ck) and failed again: rank 2 (worker:1 on $HOST) was killed by signal 9 (KILL) (status 137)"
[ "$(tail -n1 "$ERR")" = "$(grep "not restarting" "$ERR")" ] || fail "the 'not restarting' line is not the last line"

case_begin "--max-restarts 0: a failure ends the job as before"
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 0 -- "$KILLER" early "$TEST_TMP/ck4" "$STRATA_BIN" "${TRAIN[@]}" --epochs 2 \
  --checkpoint-dir "$TEST_TMP/ck4"
expect_rc 137
expect_stderr_has "strata-mpirun: rank 2 (worker:1 on $HOST) was killed by signal 9 (KILL)"
grep -q "restart" "$ERR" && fail "restart lines with --max-restarts 0: $(grep restart "$ERR")"
run "$LAUNCH" --ps 1 --workers 2 --dry-run -- strata train --checkpoint-dir x
expect_rc 0
grep -q "STRATA_RESTART_COUNT" "$OUT" && fail "STRATA_RESTART_COUNT set without restarts: $(cat "$OUT")"
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 1 --dry-run -- strata train --checkpoint-dir x
expect_rc 0
expect_stdout_has "-x STRATA_RESTART_COUNT=0"

case_begin "preemption (SIGUSR1 to the launcher): status 75 passed on, not restarted"
ck=$TEST_TMP/ck5
"$LAUNCH" --ps 1 --workers 2 --max-restarts 2 -- "$STRATA_BIN" "${TRAIN[@]}" --epochs 20 --checkpoint-dir "$ck" \
  >"$OUT" 2>"$ERR" &
pid=$!
t=0
while ! grep -q '^strata train: transport' "$OUT" 2>/dev/null && [ $t -lt 300 ]; do sleep 0.1; t=$((t + 1)); done
sleep 0.5
kill -USR1 "$pid"
t=0
while kill -0 "$pid" 2>/dev/null && [ $t -lt 600 ]; do sleep 0.1; t=$((t + 1)); done
if kill -0 "$pid" 2>/dev/null; then fail "the preempted job still ran 60 s after SIGUSR1"; kill -KILL "$pid"; fi
wait "$pid"
RC=$?
expect_rc 75
expect_stdout_has "preemption: stopping"
expect_stderr_has "strata-mpirun: not restarting: status 75"
grep -q "strata-mpirun: restart " "$ERR" && fail "a preempted job was restarted"

case_begin "bad values, and commands that cannot restart"
run "$LAUNCH" --ps 1 --workers 2 --max-restarts x -- strata train --checkpoint-dir x
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--max-restarts: 'x' is not a non-negative integer"
run env STRATA_MAX_RESTARTS=-1 "$LAUNCH" --ps 1 --workers 2 -- strata train --checkpoint-dir x
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_MAX_RESTARTS: '-1'"
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 1 -- strata train --epochs 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "needs --checkpoint-dir"
run "$LAUNCH" --ps 1 --workers 2 --max-restarts 1 -- bash -c true
expect_rc 2; expect_one_stderr_line; expect_stderr_has "not 'strata train'"
# STRATA_MAX_RESTARTS set for a whole job script leaves other commands alone.
run env STRATA_MAX_RESTARTS=2 "$LAUNCH" --ps 1 --workers 1 -- bash -c 'exit 3'
expect_rc 3
grep -q "restart" "$ERR" && fail "a non-training command was restarted"
run env STRATA_RESTART_COUNT=x "$STRATA_BIN" train --epochs 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_RESTART_COUNT"

finish
