#!/usr/bin/env bash
# strata train and checkpoints that cannot be silently wrong (checkpoint/FORMAT.md sections 3-4,
# 7), end to end under mpirun on Fashion-MNIST with the small softmax model: 16 bytes flipped in
# the root attributes' region and a training_position edited with h5py both fail verification,
# and --restore latest skips the file with a WARNING naming it and the reason and falls back to
# the previous checkpoint, while --restore of that one file is an error naming it; the final save
# is skipped when the last periodic save was at the final step; a full disk (a 1 MiB tmpfs) fails
# the save with the path and "No space left on device", keeps the previous checkpoint committed
# and intact, leaves no .tmp, and stops the job with status 1 (default) or, with
# --on-save-error continue, warns once per failed save and trains on, also when the writes
# themselves fail on 2 PS ranks; a --restore FILE that is not HDF5 or empty is an error naming it;
# --on-save-error / STRATA_ON_SAVE_ERROR are validated and documented.
source "$(dirname "$0")/lib.sh"
FMNIST=/usr/share/datasets/fashion-mnist
PY_H5=/usr/bin/python3   # Debian's interpreter, which has h5py (python3 on PATH may not)

if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: $FMNIST missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi
command -v h5dump >/dev/null || { echo "SKIP: h5dump not installed (hdf5-tools)"; exit 77; }
"$PY_H5" -c "import h5py" 2>/dev/null || { echo "SKIP: $PY_H5 lacks h5py (python3-h5py)"; exit 77; }

# Failures show the end of the logs (where a training run says what went wrong), not the start.
fail() {
  echo "FAIL [$CASE]: $*"
  echo "  exit status: $RC"
  echo "  --- stdout (tail) ---"; tail -25 "$OUT" | sed 's/^/  /'
  echo "  --- stderr (tail, without auto-shard notes) ---"; grep -v 'auto-shard' "$ERR" | tail -25 | sed 's/^/  /'
  FAILURES=$((FAILURES + 1))
}

summary_get() { tail -1 "$OUT" | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>&1; }
# pointer_get DIR EXPR: EXPR over DIR/checkpoint.json as `j`.
pointer_get() { python3 -c "import json,sys; j=json.load(open(sys.argv[1] + '/checkpoint.json')); print($2)" "$1" 2>&1; }
QUIET=(--log-every 0 --log-every-secs 0)
TRAIN=(train --model softmax --global-batch 256)

# ---------------------------------------------------------------------------------------------
case_begin "fixture: 1 PS + 2 workers, two committed checkpoints"
A="$TEST_TMP/a"
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 30 --checkpoint-dir "$A" --save-every-steps 20 "${QUIET[@]}"
expect_rc 0
GSTEP=$(pointer_get "$A" 'j["checkpoints"][-1]["global_step"]')
PREV=$(pointer_get "$A" 'j["checkpoints"][-2]["global_step"]')
if ! [[ "$GSTEP" =~ ^[0-9]+$ && "$PREV" =~ ^[0-9]+$ ]] || [ "$PREV" -ge "$GSTEP" ]; then
  fail "expected two checkpoints, checkpoint.json: $(cat "$A/checkpoint.json" 2>&1)"
  finish
fi

# ---------------------------------------------------------------------------------------------
case_begin "damaged root attributes (16 bytes at offset 1200) and an edited training_position: skipped with a warning"
# The issue's reproduction: both used to verify OK and restore without a word.
for damage in flip16 position; do
  E="$TEST_TMP/attrs-$damage"
  cp -r "$A" "$E"
  first_data=$(h5dump -p -H "$E/ckpt-$GSTEP.h5" | awk '$1 == "OFFSET" {print $2}' | sort -n | head -1)
  if [ "$damage" = flip16 ]; then
    [[ "$first_data" =~ ^[0-9]+$ ]] && [ "$first_data" -ge 1216 ] || fail "offset 1200 is not in the metadata (first data at $first_data)"
    python3 - "$E/ckpt-$GSTEP.h5" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1200)
    b = bytes(x ^ 0xA5 for x in f.read(16))
    f.seek(1200)
    f.write(b)
PY
  else
    "$PY_H5" - "$E/ckpt-$GSTEP.h5" <<'PY' || fail "h5py could not edit training_position"
import h5py, json, sys
f = h5py.File(sys.argv[1], "r+")
pos = json.loads(f.attrs["training_position"])
pos["workers"][0]["offset"] += 256
f.attrs["training_position"] = json.dumps(pos)
PY
  fi
  run "$STRATA_BIN" ckpt verify "$E/ckpt-$GSTEP.h5"
  expect_rc 1
  expect_stdout_has "$E/ckpt-$GSTEP.h5: FAILED: "
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --checkpoint-dir "$E" --restore latest "${QUIET[@]}"
  expect_rc 0
  grep -qE "^checkpoint: WARNING: skipped a newer checkpoint that failed verification: $E/ckpt-$GSTEP\.h5: (file checksum mismatch|the file has)" "$OUT" \
    || fail "$damage: no WARNING naming $E/ckpt-$GSTEP.h5 and the reason"
  expect_stdout_has "checkpoint: restored 2 variable(s) from $E/ckpt-$PREV.h5 (global step $PREV)"
  # One file given explicitly: an error line naming it, nothing restored.
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$E/ckpt-$GSTEP.h5" "${QUIET[@]}"
  expect_rc 2
  [ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "$damage: expected one error line"
  expect_stderr_has "strata train: error: restore: '$E/ckpt-$GSTEP.h5' fails verification: "
  grep -q '^checkpoint: restored' "$OUT" && fail "$damage: restored from a file that fails verification"
done

# ---------------------------------------------------------------------------------------------
case_begin "the last periodic save is at the final step: the final save is skipped"
# 1 PS + 1 worker, 20 steps, a save requested every 2: the save requested after step 18 runs at
# step 20, the last step, and the final save would write the same state again.
S="$TEST_TMP/skip"
mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --steps 20 --checkpoint-dir "$S" --save-every-steps 2 "${QUIET[@]}"
expect_rc 0
expect_stdout_has "checkpoint: saved $S/ckpt-20.h5 (global step 20,"
expect_stdout_has "checkpoint: final save skipped: global step 20 is already saved in $S/ckpt-20.h5"
grep -q ', final)' "$OUT" && fail "the final save wrote the file again"
[ "$(summary_get 'j["final_checkpoint"], j["checkpoints_saved"]')" = "$S/ckpt-20.h5 $(grep -c '^checkpoint: saved ' "$OUT")" ] \
  || fail "summary final_checkpoint/checkpoints_saved: $(summary_get 'j.get("final_checkpoint"), j["checkpoints_saved"]')"

# ---------------------------------------------------------------------------------------------
case_begin "a full disk (1 MiB tmpfs): the save names the file and the reason; stop (exit 1) or continue"
TFS="$TEST_TMP/tmpfs"
mkdir -p "$TFS"
if ! mount -t tmpfs -o size=1m strata-test "$TFS" 2>/dev/null; then
  echo "  (cannot mount a tmpfs here (needs root): case not applicable)"
else
  trap 'umount "$TFS" 2>/dev/null; rm -rf "$TEST_TMP"' EXIT
  # softmax checkpoints are ~110 KB: about nine fit, then the disk is full.
  FULL=(--steps 30 --save-every-steps 2 --max-to-keep 0 --checkpoint-dir "$TFS/c")
  # Default (stop): one error line naming the file and the reason, exit 1, the previous
  # checkpoint committed and intact, no .tmp left.
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" "${FULL[@]}" "${QUIET[@]}"
  expect_rc 1
  [ "$(grep -c 'checkpoint: ERROR' "$ERR")" = 1 ] || fail "stop: expected one checkpoint error line"
  grep -qE "^checkpoint: ERROR: cannot save $TFS/c/ckpt-[0-9]+\.h5: No space left on device \(the file needs at least [0-9]+ bytes, [0-9]+ are available in $TFS/c\); stopping \(on-save-error stop\); latest checkpoint: $TFS/c/ckpt-[0-9]+\.h5$" "$ERR" \
    || fail "stop: the error line does not name the file, the reason and the latest checkpoint"
  last=$(grep -oE "^checkpoint: saved $TFS/c/ckpt-[0-9]+\.h5" "$OUT" | tail -1 | sed 's/^checkpoint: saved //')
  expect_stdout_has "checkpoint save failed at step"
  [ "$(summary_get 'j["stopped_on_save_error"], j["checkpoint_save_failures"]')" = "True 1" ] \
    || fail "stop: summary stopped_on_save_error/checkpoint_save_failures: $(summary_get 'j.get("stopped_on_save_error"), j.get("checkpoint_save_failures")')"
  [ -n "$last" ] && [ "$(pointer_get "$TFS/c" 'j["latest"]')" = "$(basename "$last")" ] || fail "stop: latest is not $last"
  ls "$TFS/c" | grep -q '\.tmp$' && fail "stop: a .tmp was left behind: $(ls "$TFS/c" | tr '\n' ' ')"
  run "$STRATA_BIN" ckpt verify "$TFS/c"
  expect_rc 0
  # continue: one WARNING line per failed save, training runs to the end, exit 0.
  rm -rf "${TFS:?}/c"
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" "${FULL[@]}" --on-save-error continue "${QUIET[@]}"
  expect_rc 0
  failures=$(summary_get 'j["checkpoint_save_failures"], j["global_step"]')
  warnings=$(grep -cE "^checkpoint: WARNING: cannot save $TFS/c/ckpt-[0-9]+\.h5: No space left on device .*; training continues \(on-save-error continue\); latest checkpoint: $TFS/c/ckpt-[0-9]+\.h5$" "$OUT")
  [[ "$failures" =~ ^[0-9]+\ 30$ ]] && [ "${failures% *}" -ge 1 ] && [ "$warnings" = "${failures% *}" ] \
    || fail "continue: $warnings warning line(s), summary failures/global_step: $failures"
  ls "$TFS/c" | grep -q '\.tmp$' && fail "continue: a .tmp was left behind"
  run "$STRATA_BIN" ckpt verify "$TFS/c"
  expect_rc 0
  # The writes themselves running out of space (the free-space check skipped), 2 PS: every PS
  # rank agrees on the failure, nobody hangs or crashes, nothing is left behind.
  rm -rf "${TFS:?}/c"
  STRATA_TEST_SKIP_SPACE_CHECK=1 mpi 4 -x STRATA_TEST_SKIP_SPACE_CHECK "$STRATA_BIN" "${TRAIN[@]}" "${FULL[@]}" \
    --num-ps 2 --on-save-error continue "${QUIET[@]}"
  expect_rc 0
  grep -qE "^checkpoint: WARNING: cannot save $TFS/c/ckpt-[0-9]+\.h5: writing [a-z_/0-9]+ into $TFS/c/ckpt-[0-9]+\.h5\.tmp failed: No space left on device" "$OUT" \
    || fail "HDF5 path: no warning naming the file and 'No space left on device'"
  ls "$TFS/c" | grep -q '\.tmp$' && fail "HDF5 path: a .tmp was left behind"
  run "$STRATA_BIN" ckpt verify "$TFS/c"
  expect_rc 0
  umount "$TFS" || fail "could not unmount $TFS"
  trap 'rm -rf "$TEST_TMP"' EXIT
fi


# ---------------------------------------------------------------------------------------------
case_begin "--restore of a file that is not a checkpoint, and --on-save-error: one line naming it, exit 2"
# Not HDF5 at all, and empty: the error names the path (it used to be HDF5's bare "file signature
# not found").
echo "not a checkpoint" > "$TEST_TMP/text.h5"
: > "$TEST_TMP/empty.h5"
for bad in text empty; do
  mpi 3 "$STRATA_BIN" train --restore "$TEST_TMP/$bad.h5" --steps 1 "${QUIET[@]}"
  expect_rc 2
  [ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "$bad: expected one error line"
  expect_stderr_has "strata train: error: restore: '$TEST_TMP/$bad.h5' fails verification: not a strata checkpoint"
done
run "$STRATA_BIN" train --checkpoint-dir "$TEST_TMP/x" --on-save-error sometimes --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--on-save-error: 'sometimes' is not stop or continue"
STRATA_ON_SAVE_ERROR=ignore run "$STRATA_BIN" train --checkpoint-dir "$TEST_TMP/x" --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_ON_SAVE_ERROR: 'ignore' is not stop or continue"
run "$STRATA_BIN" train --on-save-error continue --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--checkpoint-dir"
run "$STRATA_BIN" train --help
expect_stdout_has "--on-save-error"
run "$STRATA_BIN" --help-env
expect_stdout_has "STRATA_ON_SAVE_ERROR"

# --dynamic-full-every K (the full/delta cadence of dynamic tables' saves): a positive integer,
# only with --checkpoint-dir.
for bad in 0 -3 abc 2x; do
  run "$STRATA_BIN" train --checkpoint-dir "$TEST_TMP/x" --dynamic-full-every "$bad" --steps 1
  expect_rc 2; expect_one_stderr_line; expect_stderr_has "--dynamic-full-every: '$bad'"
done
run "$STRATA_BIN" train --dynamic-full-every 4 --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--dynamic-full-every need --checkpoint-dir"
run "$STRATA_BIN" train --help
expect_stdout_has "--dynamic-full-every"

finish
