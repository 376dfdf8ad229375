#!/usr/bin/env bash
# One case of the fault matrix (tests/fault/README.md), against the real strata binary under
# mpi_launch/strata-mpirun with real signals, real HDF5 checkpoints and, for disk full, a real tmpfs.
#
#   fault_test.sh seed DIR                 make the committed checkpoint every case starts from
#   fault_test.sh ROLE.SIGNAL.PHASE        ROLE ps|chief|worker1, SIGNAL kill|stop,
#                                          PHASE bootstrap|train_async|train_sync|save|restore|final
#   fault_test.sh disk_full                a save into a full tmpfs (the free-space check refuses it)
#   fault_test.sh disk_full_write          the same with the check skipped: HDF5's writes fail
#   fault_test.sh corrupt_latest           random bytes of the latest checkpoint changed
#   fault_test.sh orphan_commit            the PS killed between a file's rename and checkpoint.json's update
#
# Every case asserts the bound on the time from the fault to the job's exit, the rank named in the
# message (role and host), and that the last committed checkpoint verifies and resumes.
# Environment: STRATA_BIN (the strata binary), STRATA_SOURCE_DIR, STRATA_FAULT_SEED (a seed
# directory made by `seed`; without it the case makes its own), STRATA_FAULT_RESULTS (a file the
# case appends "case<TAB>passed<TAB>time_to_end<TAB>retried launches" to, for repeat.sh). Exit status 0, 1, or 77 (skip).
source "$(dirname "$0")/lib.sh"

CASE_NAME=${1:?usage: fault_test.sh CASE (see the header)}
RETRIED=0  # launches of a signal case that never reached their phase (launched once more)

# make_seed ROOT: a short clean run whose final checkpoint (ROOT/ckpt, global step 40: 20 steps of
# each worker) every case resumes from.
make_seed() {
  local root=$1 dir=$1/ckpt
  rm -rf "$root"
  mkdir -p "$dir"
  start_job -- --checkpoint-dir "$dir" --steps 20 --epochs 3 --log-every 0 --log-every-secs 0
  T_FAULT=$(now)
  while running "$JOB" && le "$(elapsed_since "$T_FAULT")" 60; do sleep 0.05; done
  if running "$JOB"; then
    fail "the seed run did not end within 60 s"
    kill_job
    return 1
  fi
  wait "$JOB"
  local rc=$?
  JOB=""
  if [ "$rc" != 0 ] || [ -z "$(latest_step "$dir")" ]; then
    fail "the seed run failed (status $rc)"
    show_job_output
    return 1
  fi
}

# The case's checkpoint directory: a copy of the seed (made here when none was given).
prepare_checkpoints() {
  CK=${1:-$CASE_TMP/ckpt}
  local seed=${STRATA_FAULT_SEED:-}
  if [ -z "$seed" ] || [ ! -e "$seed/ckpt/checkpoint.json" ]; then
    seed=$CASE_TMP/seed
    make_seed "$seed" || return 1
  fi
  mkdir -p "$CK"
  cp -a "$seed"/ckpt/. "$CK"/
  SEED_STEP=$(latest_step "$CK")
}

record() {
  if [ -n "${STRATA_FAULT_RESULTS:-}" ]; then
    printf '%s\t%s\t%s\t%s\n' "$CASE_NAME" "$([ "$FAILURES" = 0 ] && echo 1 || echo 0)" "${TIME_TO_END:-}" "$RETRIED" \
      >>"$STRATA_FAULT_RESULTS"
  fi
  if [ "$FAILURES" -gt 0 ]; then
    echo "FAILED: $CASE_NAME ($FAILURES problem(s))"
    exit 1
  fi
  echo "PASSED: $CASE_NAME (time to end ${TIME_TO_END:-n/a} s)"
  exit 0
}

# ---- role x signal x phase -------------------------------------------------------------------------
signal_case() {
  local role=$1 sig=$2 phase=$3 rank name
  case $role in
    ps) rank=0; name=ps:0 ;;
    chief) rank=1; name=worker:0 ;;
    worker1) rank=2; name=worker:1 ;;
    *) echo "unknown role '$role'"; exit 2 ;;
  esac
  case $sig in kill) sig=KILL ;; stop) sig=STOP ;; *) echo "unknown signal '$sig'"; exit 2 ;; esac
  local marks=$CASE_TMP/marks
  prepare_checkpoints || record
  local envs=(STRATA_TEST_PHASE_DIR="$marks")
  local args=(--checkpoint-dir "$CK" --restore latest --stall-timeout "$STALL_S" --log-every 5 --log-every-secs 0)
  local bound
  if [ "$sig" = KILL ]; then bound=$KILL_BOUND_S; else bound=$((STALL_S + STOP_SLACK_S)); fi
  # A stopped rank must be found by its silent heartbeats (--stall-timeout), in the bootstrap too,
  # long before the bootstrap's own deadline (--timeout, left at its default of 120 s).
  # reach_phase: launches the job and waits until it is in the phase (status 1 when it never got there).
  reach_phase() {
    local e=("${envs[@]}")
    rm -rf "$marks"
    mkdir -p "$marks"
    case $phase in
      bootstrap)
        # Every rank holds 3 s inside Runtime::bootstrap (after its first collective): the fault lands
        # while the others wait in the bootstrap exchanges.
        e+=(STRATA_TEST_HOLD_PHASE=bootstrap:3)
        start_job "${e[@]}" -- "${args[@]}" --epochs 3
        wait_for "all ranks in the bootstrap" 30 have_all_files "$marks/0.bootstrap" "$marks/1.bootstrap" "$marks/2.bootstrap" ||
          return 1
        sleep 0.5
        ;;
      train_async | train_sync)
        local mode=async
        [ "$phase" = train_sync ] && mode=sync
        start_job "${e[@]}" -- "${args[@]}" --epochs 20 --consistency "$mode"
        wait_for "training progress" 30 training_started || return 1
        # The first step line can come within one heartbeat of entering the phase (a resumed job
        # prints it after 5 quick steps); the victim's last beat must carry the train phase.
        sleep 1
        ;;
      save)
        # Each save is held open 3 s (data written, file not yet closed or committed).
        e+=(STRATA_TEST_SAVE_DELAY_S=3)
        start_job "${e[@]}" -- "${args[@]}" --epochs 20 --save-every-steps 30
        wait_for "a checkpoint save" 30 have_file "$marks/0.checkpoint-save" || return 1
        sleep 0.5  # into the held part of the save
        ;;
      restore)
        # Every rank holds 3 s on entering the restore phase; then the restore waits for the victim.
        e+=(STRATA_TEST_HOLD_PHASE=restore:3)
        start_job "${e[@]}" -- "${args[@]}" --epochs 3
        wait_for "all ranks in the restore phase" 30 have_all_files "$marks/0.restore" "$marks/1.restore" "$marks/2.restore" ||
          return 1
        sleep 0.5
        ;;
      final)
        # A short training (10 more steps per worker); each worker holds 3 s on entering the final
        # barrier (before the final save and the workers' barrier).
        e+=(STRATA_TEST_HOLD_PHASE=final-barrier:3)
        start_job "${e[@]}" -- "${args[@]}" --epochs 3 --steps 30
        wait_for "both workers in the final barrier" 30 have_all_files "$marks/1.final-barrier" "$marks/2.final-barrier" ||
          return 1
        sleep 0.5
        ;;
      *) echo "unknown phase '$phase'"; exit 2 ;;
    esac
  }
  local attempt
  for attempt in 1 2; do
    reach_phase && break
    show_job_output
    [ "$attempt" = 2 ] && record
    # The job never reached the phase, before any fault: not what this case measures, and not
    # hidden either (the stacks above; repeat.sh counts these retries). One more launch, from the seed.
    echo "WARNING [$CASE_NAME]: the job did not reach the $phase phase before any fault was injected (see above); launching it once more"
    RETRIED=$((RETRIED + 1))
    FAILURES=$((FAILURES - 1))
    kill_job
    rm -rf "$CK"
    prepare_checkpoints || record
  done
  # The phase the victim's last heartbeat carries (heartbeats go out every 250 ms: the waits above
  # leave at least 0.5 s in the phase before the fault).
  local want_phase
  case $phase in
    bootstrap) want_phase=bootstrap ;;
    train_async | train_sync) want_phase=train ;;
    save) want_phase=train ;;
    restore) want_phase=restore ;;
    final) want_phase="final barrier" ;;
  esac
  if [ "$role" = ps ]; then
    case $phase in train_* | final) want_phase=serve ;; save) want_phase="checkpoint save" ;; esac
  fi
  inject "$sig" "$rank" || { show_job_output; record; }
  wait_end "$bound"
  [ "$RC" != 0 ] || fail "the job exited 0 after the fault"
  if [ "$sig" = KILL ]; then
    expect_err "strata-mpirun: rank $rank ($name on $HOST) was killed by signal 9"
  elif [ "$phase" = bootstrap ]; then
    # Roles are assigned by the bootstrap itself: until then a rank is named by its host.
    expect_err "strata: liveness: rank $rank (on $HOST) stopped"
    expect_err "phase bootstrap"
  else
    expect_err "strata: liveness: rank $rank ($name on $HOST) stopped"
    expect_err "phase $want_phase"
  fi
  [ "$FAILURES" = 0 ] || show_job_output
  check_checkpoint "$CK" "$SEED_STEP"
  record
}

# ---- disk full -----------------------------------------------------------------------------------
disk_full_case() {
  local skip_check=$1
  local mnt=$CASE_TMP/tmpfs
  mkdir -p "$mnt"
  # Room for the seed's checkpoint and one more (2.7 MiB each), not for a third.
  if ! mount -t tmpfs -o size=7m strata-fault "$mnt" 2>"$CASE_TMP/mount.err"; then
    echo "SKIP: cannot mount a tmpfs here ($(cat "$CASE_TMP/mount.err")); disk-full cases need root"
    exit 77
  fi
  MOUNTED=$mnt
  prepare_checkpoints "$mnt/ckpt" || record
  local envs=()
  [ "$skip_check" = 1 ] && envs+=(STRATA_TEST_SKIP_SPACE_CHECK=1)
  start_job ${envs[@]+"${envs[@]}"} -- --checkpoint-dir "$CK" --restore latest --stall-timeout "$STALL_S" \
    --log-every 5 --log-every-secs 0 --epochs 20 --save-every-steps 30
  # The fault is the save that finds the disk full: the time to end runs from its message.
  wait_for "a failed save" 60 grep -q '^checkpoint: ERROR' "$ERR" || { show_job_output; record; }
  T_FAULT=$(now)
  wait_end "$KILL_BOUND_S"
  [ "$RC" = 1 ] || fail "expected status 1 (--on-save-error stop), got $RC"
  expect_err "No space left on device"
  expect_err "$CK/ckpt-"
  local good
  good=$(latest_step "$CK")
  echo "  latest committed checkpoint: global step $good; files: $(ls "$CK" | tr '\n' ' ')"
  ls "$CK" | grep -q '\.tmp$' && fail "a .tmp file was left in $CK after the failed save"
  [ "$FAILURES" = 0 ] || show_job_output
  # The disk is still full: the resumed run's own final save fails too, which it may only report.
  check_checkpoint "$CK" "$SEED_STEP" --on-save-error continue
  record
}

# ---- corruption of the latest checkpoint -----------------------------------------------------------
corrupt_case() {
  prepare_checkpoints || record
  # A clean run adds checkpoints after the seed's.
  start_job -- --checkpoint-dir "$CK" --restore latest --stall-timeout "$STALL_S" --log-every 0 --log-every-secs 0 \
    --epochs 3 --steps 50 --save-every-steps 30
  T_FAULT=$(now)
  wait_end 60
  [ "$RC" = 0 ] || { fail "the clean run exited $RC"; show_job_output; record; }
  local files previous latest
  files=$(python3 -c 'import json,sys; print(" ".join(c["file"] for c in json.load(open(sys.argv[1]+"/checkpoint.json"))["checkpoints"]))' "$CK")
  latest=${files##* }
  previous=$(echo "$files" | awk '{ print $(NF-1) }')
  local previous_step seed=${STRATA_FAULT_RANDOM_SEED:-$RANDOM}
  previous_step=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]+"/checkpoint.json")); print(next(c["global_step"] for c in j["checkpoints"] if c["file"]==sys.argv[2]))' "$CK" "$previous")
  # 8 random offsets over the whole file (header, metadata and data alike), each byte XORed with a
  # non-zero value; the seed is printed so a failure can be replayed (STRATA_FAULT_RANDOM_SEED).
  python3 - "$CK/$latest" "$seed" <<'PY'
import os, random, sys
path, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
size = os.path.getsize(path)
offsets = sorted(rng.randrange(size) for _ in range(8))
with open(path, "r+b") as f:
    for off in offsets:
        f.seek(off); b = f.read(1)[0]
        f.seek(off); f.write(bytes([b ^ rng.randrange(1, 256)]))
print(f"  corrupted {os.path.basename(path)} ({size} bytes) at offsets {offsets} (seed {seed})")
PY
  T_FAULT=$(now)
  if timeout 60 "$STRATA_BIN" ckpt verify "$CK/$latest" >"$CASE_TMP/verify.out" 2>&1; then
    fail "strata ckpt verify passed a corrupted file: $(cat "$CASE_TMP/verify.out")"
  fi
  grep -q "$latest" "$CASE_TMP/verify.out" || fail "ckpt verify's message does not name $latest: $(cat "$CASE_TMP/verify.out")"
  timeout 60 "$STRATA_BIN" ckpt verify "$CK/$previous" >"$CASE_TMP/verify.out" 2>&1 ||
    fail "the previous checkpoint $previous does not verify: $(cat "$CASE_TMP/verify.out")"
  # --restore latest skips the damaged file with a warning naming it and resumes from the previous.
  resume "$CK" "$previous_step"
  TIME_TO_END=$(elapsed_since "$T_FAULT")
  grep -q "$latest" "$ERR" "$OUT" || fail "the resumed run did not name the damaged $latest"
  record
}

# ---- the PS killed between a file's rename and checkpoint.json's update ---------------------------
# orphan_in DIR: prints a ckpt-<step>.h5 of DIR that DIR's checkpoint.json does not name.
orphan_in() {
  python3 - "$1" <<'PY' 2>/dev/null
import json, os, re, sys
d = sys.argv[1]
named = {c["file"] for c in json.load(open(os.path.join(d, "checkpoint.json")))["checkpoints"]}
orphans = [f for f in os.listdir(d) if re.fullmatch(r"ckpt-[0-9]+\.h5", f) and f not in named]
if not orphans:
    sys.exit(1)
print(orphans[0])
PY
}
orphan_left() { orphan_in "$1" >/dev/null; }

orphan_case() {
  prepare_checkpoints || record
  # Every commit is held 3 s with ckpt-<step>.h5 renamed into place and checkpoint.json not yet
  # naming it (STRATA_TEST_COMMIT_DELAY_S); the PS is killed there.
  start_job STRATA_TEST_COMMIT_DELAY_S=3 -- --checkpoint-dir "$CK" --restore latest --stall-timeout "$STALL_S" \
    --log-every 5 --log-every-secs 0 --epochs 20 --save-every-steps 30
  wait_for "a renamed file that checkpoint.json does not name" 60 orphan_left "$CK" || { show_job_output; record; }
  local orphan committed latest f
  orphan=$(orphan_in "$CK")
  inject KILL 0 || { show_job_output; record; }
  wait_end "$KILL_BOUND_S"
  [ "$RC" != 0 ] || fail "the job exited 0 after the fault"
  expect_err "strata-mpirun: rank 0 (ps:0 on $HOST) was killed by signal 9"
  committed=$(python3 -c 'import json,sys; print(" ".join(c["file"] for c in json.load(open(sys.argv[1]+"/checkpoint.json"))["checkpoints"]))' "$CK")
  latest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/checkpoint.json"))["latest"])' "$CK")
  echo "  left uncommitted: $orphan; committed: $committed"
  [ "$(orphan_in "$CK")" = "$orphan" ] || fail "$orphan is not left uncommitted: $(ls "$CK" | tr '\n' ' ')"
  timeout 60 "$STRATA_BIN" ckpt verify "$CK/$orphan" >"$CASE_TMP/verify.out" 2>&1 ||
    fail "the uncommitted $orphan is not a complete file: $(cat "$CASE_TMP/verify.out")"
  # Listed as uncommitted, never as latest or as what a restore uses.
  timeout 60 "$STRATA_BIN" ckpt ls "$CK" >"$CASE_TMP/ls.out" 2>&1 || fail "ckpt ls failed: $(cat "$CASE_TMP/ls.out")"
  grep -qF "uncommitted (ignored): $orphan (" "$CASE_TMP/ls.out" || fail "ckpt ls does not list $orphan as uncommitted: $(cat "$CASE_TMP/ls.out")"
  grep -qE " $latest .* latest\$" "$CASE_TMP/ls.out" || fail "ckpt ls does not mark $latest latest"
  timeout 60 "$STRATA_BIN" ckpt ls --verify --json "$CK" >"$CASE_TMP/ls.json" 2>&1 || fail "ckpt ls --verify failed"
  [ "$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["restore"], [u["file"] for u in j["uncommitted"] if u["complete"]])' "$CASE_TMP/ls.json")" = "$latest ['$orphan']" ] ||
    fail "ckpt ls --json: restore/uncommitted are not $latest/$orphan: $(cat "$CASE_TMP/ls.json")"
  # --restore latest resumes from the previous committed checkpoint; its start removes the orphan.
  T_FAULT=$(now)
  check_checkpoint "$CK" "$SEED_STEP" --max-to-keep 0
  expect_out "checkpoint: removed $orphan from $CK (left by an interrupted save)"
  [ -e "$CK/$orphan" ] && fail "$orphan survived the next start in $CK"
  for f in $committed; do [ -f "$CK/$f" ] || fail "the committed $f is gone after the next start"; done
  record
}

case $CASE_NAME in
  seed)
    dir=${2:?usage: fault_test.sh seed DIR}
    make_seed "$dir" || exit 1
    echo "seed: $dir/ckpt (global step $(latest_step "$dir/ckpt"))"
    exit 0
    ;;
  disk_full) disk_full_case 0 ;;
  disk_full_write) disk_full_case 1 ;;
  corrupt_latest) corrupt_case ;;
  orphan_commit) orphan_case ;;
  *.*.*)
    IFS=. read -r role sig phase <<<"$CASE_NAME"
    signal_case "$role" "$sig" "$phase"
    ;;
  *) echo "unknown case '$CASE_NAME' (see the header)"; exit 2 ;;
esac
