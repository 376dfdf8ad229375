#!/usr/bin/env bash
# 1,000 random single-byte changes over whole checkpoint files (header and HDF5 metadata
# included) are ALL detected by `strata ckpt verify` (non-zero exit, every file FAILED) and none is
# restored silently (for each, --restore latest's decision falls back to the previous checkpoint).
# The fixtures are real checkpoints from the collective writer (tests/tools/make_checkpoint.cc):
# a small one that is mostly HDF5 metadata, written by 1 rank, and a larger one written by 3 ranks.
# The driver is tests/cli/ckpt_flip.py; verify runs over batches of directories per process.
source "$(dirname "$0")/lib.sh"

: "${STRATA_MAKE_CHECKPOINT:?STRATA_MAKE_CHECKPOINT must point at strata_test_make_checkpoint}"
PY_H5=/usr/bin/python3   # Debian's interpreter, which has h5py (python3 on PATH may not)
"$PY_H5" -c "import h5py" 2>/dev/null || { echo "SKIP: $PY_H5 lacks h5py (python3-h5py)"; exit 77; }
FLIPS=${STRATA_FLIP_COUNT:-1000}

make_fixture() {
  local dir=$1 np=$2 rows=$3
  for step in 100 200; do
    mpi "$np" "$STRATA_MAKE_CHECKPOINT" --dir "$dir" --step "$step" --seed 11 --rows "$rows"
    if [ "$RC" != 0 ]; then
      CASE="fixture: make_checkpoint --dir $dir --step $step"; fail "the checkpoint writer failed"; finish
    fi
  done
}

case_begin "fixtures: two committed checkpoints per directory, at 1 and 3 ranks"
make_fixture "$TEST_TMP/small" 1 4      # a few KiB of data in ~20 KiB: mostly metadata
make_fixture "$TEST_TMP/large" 3 1000   # ~128 KiB of data
run "$STRATA_BIN" ckpt verify "$TEST_TMP/small" "$TEST_TMP/large"
expect_rc 0

case_begin "$FLIPS random single-byte changes: all detected by ckpt verify, none restored"
mkdir -p "$TEST_TMP/flips"
t0=$SECONDS
run "$PY_H5" "$(dirname "$0")/ckpt_flip.py" "$STRATA_BIN" "$TEST_TMP/flips" "$FLIPS" 20241124 \
  "$TEST_TMP/small" "$TEST_TMP/large"
cat "$OUT"
expect_rc 0
expect_stdout_has "$FLIPS single-byte changes"
grep -qE "^$FLIPS single-byte changes .*: $FLIPS detected by ckpt verify, $FLIPS restore decisions fall back$" "$OUT" \
  || fail "not every change was detected and refused"
echo "  ($((SECONDS - t0)) s)"

finish
