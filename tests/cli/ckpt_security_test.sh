#!/usr/bin/env bash
# Checkpoints as untrusted input (checkpoint/FORMAT.md sections 6, 8 and 9). Every crafted file
# here passes its CRCs (tests/cli/ckpt_craft.py signs it again after the edit, as anyone who can
# write a file can), so only the reader's own checks stand between it and a crash, a hang, a
# read of terabytes or a file deleted outside the checkpoint directory. Each case asserts the exit
# status and the one line that names the file and the attribute, dataset or entry:
#   * attributes of the wrong shape or type (an int64[4096] format_version, a string-array
#     optimizer: a segfault and heap corruption before), a null dataspace, a 17 MiB string, JSON
#     nested 100,000 deep; a fixed-length string read with its own length (accepted);
#   * checkpoint.json entries naming ../victim/precious.txt (a save with --max-to-keep 1 must not
#     delete it), /etc/hostname, ../other/ckpt-100.h5, a symlink, a FIFO (verify must not hang),
#     and a checkpoint.json nested 100,000 deep;
#   * datasets declared (2^40 x 2^20) and 2^40 floats but never stored: refused at once;
#   * a format 1 file: refused by verify, show and --restore without --allow-unverified, accepted
#     with it.
source "$(dirname "$0")/lib.sh"

: "${STRATA_MAKE_CHECKPOINT:?STRATA_MAKE_CHECKPOINT must point at strata_test_make_checkpoint}"
PY_H5=/usr/bin/python3   # Debian's interpreter, which has h5py (python3 on PATH may not)
"$PY_H5" -c "import h5py" 2>/dev/null || { echo "SKIP: $PY_H5 lacks h5py (python3-h5py)"; exit 77; }
CRAFT="$(dirname "$0")/ckpt_craft.py"
FMNIST=/usr/share/datasets/fashion-mnist

make_ckpt() {
  local np=$1; shift
  mpi "$np" "$STRATA_MAKE_CHECKPOINT" "$@"
  if [ "$RC" != 0 ]; then
    CASE="fixture: make_checkpoint $*"; fail "the checkpoint writer failed"; finish
  fi
}
craft() {
  "$PY_H5" "$CRAFT" "$@" || { fail "ckpt_craft.py $* failed"; return 1; }
}
# verify_fails FILE LINE: `ckpt verify FILE` exits 1 within 20 s and prints exactly LINE.
verify_fails() {
  timeout 20 "$STRATA_BIN" ckpt verify "$1" >"$OUT" 2>"$ERR"
  RC=$?
  expect_rc 1
  [ "$(cat "$OUT")" = "$2" ] || fail "expected the line: $2"
  [ ! -s "$ERR" ] || fail "stderr should be empty"
}
# pointer DIR JSON-ENTRIES...: writes DIR/checkpoint.json listing the given entry objects.
pointer() {
  local dir=$1; shift
  local IFS=,
  printf '{"format_version": 2, "latest": null, "checkpoints": [%s]}\n' "$*" > "$dir/checkpoint.json"
}
entry() { printf '{"file": "%s", "global_step": %s, "created_unix": 1700000000}' "$1" "$2"; }

case_begin "fixture: a good checkpoint that verifies"
G="$TEST_TMP/good"
make_ckpt 1 --dir "$G" --step 300 --seed 5
GOOD="$G/ckpt-300.h5"
run "$STRATA_BIN" ckpt verify "$GOOD"
expect_rc 0

# ---------------------------------------------------------------------------------------------
case_begin "attributes of the wrong shape or type: one line naming the file and the attribute, exit 1"
while IFS='|' read -r kind line; do
  F="$TEST_TMP/$kind.h5"
  craft attr "$GOOD" "$F" "$kind" || continue
  CASE="attribute: $kind (verify)"
  verify_fails "$F" "$F: FAILED: $line"
  CASE="attribute: $kind (show)"
  run "$STRATA_BIN" ckpt show "$F"
  expect_rc 1; expect_one_stderr_line
  [ "$(cat "$ERR")" = "strata ckpt show: cannot read checkpoint '$F': $line" ] || fail "show: not the one line naming $F"
done <<'EOF'
format_version_array|root attribute 'format_version' must be a scalar integer, found an array of shape [4096]
optimizer_string_array|root attribute 'optimizer' must be a scalar string, found an array of shape [64]
global_step_string|root attribute 'global_step' must be a scalar integer, found a string
created_unix_float|root attribute 'created_unix' must be a scalar integer, found a float
global_step_compound|root attribute 'global_step' must be a scalar integer, found a compound
checksum_array|attribute 'checksum' of variables/ids must be a scalar integer, found an array of shape [3]
optimizer_empty|root attribute 'optimizer' must be a scalar string, found an empty (null) dataspace
training_position_long|root attribute 'training_position' is longer than the 16777216 bytes a checkpoint string may hold
training_position_deep|root attribute 'training_position' nests JSON deeper than 64 levels
EOF
CASE="attributes of the wrong shape or type"

case_begin "a fixed-length string attribute is read with its own length"
F="$TEST_TMP/optimizer_fixed.h5"
if craft attr "$GOOD" "$F" optimizer_fixed; then
  run "$STRATA_BIN" ckpt verify "$F"
  expect_rc 0
  expect_stdout_has "$F: OK (step 300, 7 dataset(s) verified"
  run "$STRATA_BIN" ckpt show --json "$F"
  expect_rc 0
  expect_json "j['optimizer']" "sgd"
fi

# ---------------------------------------------------------------------------------------------
case_begin "datasets declared but never stored: refused at once, never read"
# Before: (2^40 x 2^20) floats verified "OK (0 datasets verified)"; 2^40 floats made a format 1
# verify read 4 TiB of fill values. Format 2, and format 1 with --allow-unverified.
for shape in 1099511627776,1048576 1099511627776; do
  F="$TEST_TMP/ghost-$shape.h5"
  craft unstored "$GOOD" "$F" "$shape" || continue
  bytes=$(python3 -c "import math,sys; print(math.prod(int(x) for x in sys.argv[1].split(',')) * 4)" "$shape")
  # The table claims the offset HDF5 reports for unallocated data (its "undefined" address
  # shifted by the user block) and the declared size; before, a reader that compared the table
  # with HDF5 found them equal and said OK.
  offset=$("$PY_H5" -c 'import h5py, sys; print(h5py.File(sys.argv[1], "r")["variables/ghost"].id.get_offset())' "$F")
  CASE="format 2, variables/ghost [$shape]"
  verify_fails "$F" "$F: FAILED: damaged integrity block: the table places the data of variables/ghost (offset $offset, $bytes bytes) over other data or outside the file"
  F1="$TEST_TMP/ghost1-$shape.h5"
  craft v1 "$GOOD" "$F1" "$shape" || continue
  CASE="format 1, variables/ghost [$shape]"
  size=$(stat -c %s "$F1")
  timeout 20 "$STRATA_BIN" ckpt verify --allow-unverified "$F1" >"$OUT" 2>"$ERR"
  RC=$?
  expect_rc 1
  [ "$(cat "$OUT")" = "$F1: FAILED: variables/ghost [${shape}] f32 declares $bytes bytes, more than the whole file ($size bytes)" ] \
    || fail "not the line naming variables/ghost and the file's size"
done
CASE="format 1, a small dataset declared but not stored"
F1="$TEST_TMP/ghost1-small.h5"
if craft v1 "$GOOD" "$F1" 1000; then
  run "$STRATA_BIN" ckpt verify --allow-unverified "$F1"
  expect_rc 1
  [ "$(cat "$OUT")" = "$F1: FAILED: variables/ghost [1000] f32 declares 4000 bytes of data, the file stores none of them" ] \
    || fail "not the line naming variables/ghost"
fi

# ---------------------------------------------------------------------------------------------
case_begin "a format 1 file: refused without --allow-unverified, accepted with it"
V1="$TEST_TMP/v1.h5"
if craft v1 "$GOOD" "$V1"; then
  REFUSED="format 1 file (no integrity block: its metadata and HDF5 structure cannot be verified); refused unless unverified files are allowed (--allow-unverified)"
  verify_fails "$V1" "$V1: FAILED: $REFUSED"
  run "$STRATA_BIN" ckpt show "$V1"
  expect_rc 1; expect_one_stderr_line
  [ "$(cat "$ERR")" = "strata ckpt show: cannot read checkpoint '$V1': $REFUSED" ] || fail "show: not the refusal line"
  run "$STRATA_BIN" ckpt verify --allow-unverified "$V1"
  expect_rc 0
  [ "$(cat "$OUT")" = "$V1: OK (step 300, 7 dataset(s) verified, format 1: no file checksum)" ] || fail "not accepted with the flag"
  run "$STRATA_BIN" ckpt show --allow-unverified "$V1"
  expect_rc 0
  grep -qE '^format_version +1$' "$OUT" || fail "show --allow-unverified does not say format_version 1"
  run "$STRATA_BIN" ckpt diff --allow-unverified "$V1" "$GOOD"
  expect_rc 0
  [ "$(tail -1 "$OUT")" = identical ] || fail "the format 1 copy differs from its original"
  for cmd in "ckpt verify" "ckpt show" "ckpt ls" "ckpt diff" "train"; do
    # shellcheck disable=SC2086
    run "$STRATA_BIN" $cmd --help
    expect_stdout_has "--allow-unverified"
  done
fi

# ---------------------------------------------------------------------------------------------
case_begin "checkpoint.json: ../victim/precious.txt is never deleted by a save with --max-to-keep 1"
R="$TEST_TMP/retain"
mkdir -p "$TEST_TMP/victim"
echo "precious" > "$TEST_TMP/victim/precious.txt"
make_ckpt 1 --dir "$R" --step 100 --seed 5
pointer "$R" "$(entry ../victim/precious.txt 1)" "$(entry ckpt-100.h5 100)"
run "$STRATA_BIN" ckpt verify "$R"
expect_rc 1
[ "$(head -1 "$OUT")" = "$R/checkpoint.json: entry '../victim/precious.txt' REFUSED: not a checkpoint file name (ckpt-<step>.h5 inside the directory)" ] \
  || fail "verify: no REFUSED line naming the entry"
expect_stdout_has "2 checkpoint(s): 1 OK, 1 FAILED"
mpi 1 "$STRATA_MAKE_CHECKPOINT" --dir "$R" --step 200 --seed 5 --max-to-keep 1
expect_rc 0
[ "$(cat "$TEST_TMP/victim/precious.txt" 2>&1)" = precious ] || fail "the victim file was deleted or changed"
[ "$(grep -c "dropping entry" "$ERR")" = 1 ] || fail "expected one line about the dropped entry"
expect_stderr_has "checkpoint: dropping entry '../victim/precious.txt' of $R/checkpoint.json: not a checkpoint file name (ckpt-<step>.h5 inside the directory)"
[ ! -e "$R/ckpt-100.h5" ] || fail "max_to_keep 1 did not delete the older valid checkpoint"
[ "$(python3 -c 'import json,sys; print([c["file"] for c in json.load(open(sys.argv[1]))["checkpoints"]])' "$R/checkpoint.json")" = "['ckpt-200.h5']" ] \
  || fail "checkpoint.json should list only ckpt-200.h5: $(cat "$R/checkpoint.json")"

case_begin "checkpoint.json: /etc/hostname, ../other/ckpt-100.h5 and a step that disagrees are refused, never opened"
O="$TEST_TMP/other"
make_ckpt 1 --dir "$O" --step 100 --seed 5
T="$TEST_TMP/traverse"
mkdir -p "$T"
cp "$O/ckpt-100.h5" "$T/ckpt-7.h5"
pointer "$T" "$(entry /etc/hostname 1)" "$(entry ../other/ckpt-100.h5 100)" "$(entry ckpt-7.h5 8)"
run "$STRATA_BIN" ckpt verify "$T"
expect_rc 1
cat > "$TEST_TMP/want" <<EOF
$T/checkpoint.json: entry '/etc/hostname' REFUSED: not a checkpoint file name (ckpt-<step>.h5 inside the directory)
$T/checkpoint.json: entry '../other/ckpt-100.h5' REFUSED: not a checkpoint file name (ckpt-<step>.h5 inside the directory)
$T/checkpoint.json: entry 'ckpt-7.h5' REFUSED: the file name says another step than the entry's global_step 8 (expected ckpt-8.h5)
3 checkpoint(s): 0 OK, 3 FAILED
EOF
diff "$TEST_TMP/want" "$OUT" >/dev/null || fail "verify output differs: $(diff "$TEST_TMP/want" "$OUT")"
run "$STRATA_BIN" ckpt show "$T"
expect_rc 1
expect_stderr_has "strata ckpt show: no committed checkpoints in '$T'"
run "$STRATA_BIN" ckpt ls --json "$T"
expect_rc 0
expect_json "[r['file'] for r in j['refused']], j['checkpoints']" "['/etc/hostname', '../other/ckpt-100.h5', 'ckpt-7.h5'] []"

case_begin "checkpoint.json: a FIFO entry fails verify promptly; a symlink entry is refused; retention keeps both"
P="$TEST_TMP/special"
make_ckpt 1 --dir "$P" --step 300 --seed 5
mkfifo "$P/ckpt-100.h5"
ln -s "$O/ckpt-100.h5" "$P/ckpt-200.h5"
pointer "$P" "$(entry ckpt-100.h5 100)" "$(entry ckpt-200.h5 200)" "$(entry ckpt-300.h5 300)"
t0=$SECONDS
timeout 20 "$STRATA_BIN" ckpt verify "$P" >"$OUT" 2>"$ERR"
RC=$?
expect_rc 1
[ $((SECONDS - t0)) -lt 10 ] || fail "verify took $((SECONDS - t0)) s"
expect_stdout_has "$P/ckpt-100.h5: FAILED: is a FIFO, not a regular file"
expect_stdout_has "$P/ckpt-200.h5: FAILED: is a symbolic link, not a regular file"
expect_stdout_has "$P/ckpt-300.h5: OK (step 300"
expect_stdout_has "3 checkpoint(s): 1 OK, 2 FAILED"
# A FIFO named as a file on the command line: a usage error at once, never opened.
timeout 20 "$STRATA_BIN" ckpt verify "$P/ckpt-100.h5" >"$OUT" 2>"$ERR"
RC=$?
expect_rc 2; expect_one_stderr_line
expect_stderr_has "'$P/ckpt-100.h5' is neither a checkpoint file nor a directory"
run "$STRATA_BIN" ckpt ls "$P"
expect_rc 0
grep -qE '^100 +ckpt-100\.h5 +- +NOT-A-REGULAR-FILE ' "$OUT" || fail "ls does not mark the FIFO"
mpi 1 "$STRATA_MAKE_CHECKPOINT" --dir "$P" --step 400 --seed 5 --max-to-keep 1
expect_rc 0
[ -p "$P/ckpt-100.h5" ] && [ -L "$P/ckpt-200.h5" ] && [ -f "$O/ckpt-100.h5" ] || fail "retention removed the FIFO, the link or its target"
expect_stderr_has "checkpoint: max_to_keep: not deleting $P/ckpt-100.h5: it is a FIFO, not a regular file"
expect_stderr_has "checkpoint: max_to_keep: not deleting $P/ckpt-200.h5: it is a symbolic link, not a regular file"
[ ! -e "$P/ckpt-300.h5" ] || fail "retention did not delete the regular ckpt-300.h5"

case_begin "checkpoint.json nested 100,000 deep: one line naming it"
N="$TEST_TMP/deep"
mkdir -p "$N"
python3 -c 'import sys; open(sys.argv[1], "w").write("{\"checkpoints\": " + "[" * 100000 + "]" * 100000 + "}")' "$N/checkpoint.json"
for cmd in verify ls show; do
  run "$STRATA_BIN" ckpt $cmd "$N"
  expect_rc 1; expect_one_stderr_line
  [ "$(cat "$ERR")" = "strata ckpt $cmd: checkpoint: malformed $N/checkpoint.json: JSON nested deeper than 64 levels" ] \
    || fail "$cmd: not the one line naming $N/checkpoint.json"
done

# ---------------------------------------------------------------------------------------------
case_begin "strata train --restore: crafted files and entries are refused with one line"
if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  echo "  ($FMNIST missing: train cases not applicable)"
else
  TRAIN=(train --model softmax --global-batch 256 --log-every 0 --log-every-secs 0)
  F="$TEST_TMP/format_version_array.h5"
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$F"
  expect_rc 2
  [ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "array format_version: expected one error line"
  expect_stderr_has "strata train: error: restore: '$F' fails verification: root attribute 'format_version' must be a scalar integer, found an array of shape [4096]"
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$V1"
  expect_rc 2
  expect_stderr_has "strata train: error: restore: '$V1' fails verification: format 1 file (no integrity block"
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$V1" --allow-unverified --expect-partial
  expect_rc 0
  expect_stdout_has "checkpoint: restored 0 variable(s) from $V1 (global step 300)"
  # A directory whose only entries point outside it: nothing is opened, the job starts fresh.
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$T"
  expect_rc 0
  expect_stderr_has "checkpoint: ignoring entry '/etc/hostname' of $T/checkpoint.json: not a checkpoint file name"
  expect_stderr_has "checkpoint: ignoring entry '../other/ckpt-100.h5' of $T/checkpoint.json: not a checkpoint file name"
  expect_stdout_has "checkpoint: no valid checkpoint in $T: starting from the initializers"
  grep -q '^checkpoint: restored' "$OUT" && fail "restored from an entry outside the directory"
  # A checkpoint.json nested too deep: a configuration error naming it, on one line.
  mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$N"
  expect_rc 2
  [ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "deep checkpoint.json: expected one error line"
  expect_stderr_has "strata train: error: restore: checkpoint: malformed $N/checkpoint.json: JSON nested deeper than 64 levels"
fi

finish
