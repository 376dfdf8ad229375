#!/usr/bin/env bash
# STRATA_MPIIO_HINTS end to end (strata/checkpoint/mpiio_hints.h): under mpirun, 2 PS + 2 workers
# (softmax on Fashion-MNIST) save with hints, the PS ranks' parallel open says which (info log),
# and the checkpoint verifies and restores; a malformed value is one line naming the variable and
# the pair (under mpirun: the same line from each rank that prints), exit 2, before anything is
# written: the committed checkpoint and checkpoint.json stay
# byte for byte as they were. Only the plumbing can be checked here: this machine has no cluster
# file system on which striping or collective buffering would change the file's layout.
source "$(dirname "$0")/lib.sh"
require_fashion_mnist_training

TRAIN=(train --model softmax --num-ps 2 --global-batch 64 --log-every 0 --log-every-secs 0)
HINTS="romio_cb_write=enable,cb_buffer_size=1048576,striping_factor=2,striping_unit=1048576"
A="$TEST_TMP/a"
# snapshot DIR: checksums of every file in DIR (names and contents).
snapshot() { (cd "$1" && ls -A | sort | xargs -r md5sum) 2>&1; }

# ---------------------------------------------------------------------------------------------
case_begin "valid hints: 2 PS save in parallel with them; the checkpoint verifies and restores"
STRATA_MPIIO_HINTS="$HINTS" STRATA_LOG_LEVEL=info mpi 4 "$STRATA_BIN" "${TRAIN[@]}" --steps 10 --checkpoint-dir "$A"
expect_rc 0
expect_stderr_has "created with MPI-IO hints $HINTS"
GSTEP=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['checkpoints'][-1]['global_step'])" \
  "$A/checkpoint.json" 2>&1)
[[ "$GSTEP" =~ ^[0-9]+$ ]] && [ "$GSTEP" -gt 0 ] || fail "no committed checkpoint: $GSTEP"
run "$STRATA_BIN" ckpt verify "$A"
expect_rc 0
STRATA_MPIIO_HINTS="$HINTS" mpi 4 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$A/ckpt-$GSTEP.h5"
expect_rc 0
grep -qE "^checkpoint: restored [0-9]+ variable\(s\) from $A/ckpt-$GSTEP.h5 \(global step $GSTEP\)" "$OUT" \
  || fail "no restore of ckpt-$GSTEP.h5 reported"

# ---------------------------------------------------------------------------------------------
case_begin "malformed hints: one line naming the variable and the pair, exit 2, nothing written"
BEFORE=$(snapshot "$A")
STRATA_MPIIO_HINTS="romio_cb_write=enable,cb_nodes" mpi 4 "$STRATA_BIN" "${TRAIN[@]}" --steps 10 \
  --checkpoint-dir "$A" --restore latest
expect_rc 2
# Read at start-up, before the ranks meet: every rank that prints, prints the same line.
[ "$(grep 'error' "$ERR" | sort -u | wc -l)" = 1 ] || fail "expected one distinct error line over the 4 ranks"
expect_stderr_has "STRATA_MPIIO_HINTS: pair 2 'cb_nodes' has no '='"
[ "$(snapshot "$A")" = "$BEFORE" ] || fail "the checkpoint directory changed"
for bad in "=enable" "cb_nodes=1,,a=b" "$(printf 'k%.0s' {1..36})=1"; do
  STRATA_MPIIO_HINTS="$bad" run "$STRATA_BIN" train --model softmax --steps 1 --checkpoint-dir "$A"
  expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_MPIIO_HINTS: pair"
done
[ "$(snapshot "$A")" = "$BEFORE" ] || fail "the checkpoint directory changed"
run "$STRATA_BIN" --help-env
expect_stdout_has "STRATA_MPIIO_HINTS"

finish
