#!/usr/bin/env bash
# strata train with checkpoints, end to end under mpirun on real Fashion-MNIST, kept short:
# periodic saves are committed, listed and pruned, and readable by h5ls/h5dump/h5py (CRC-32 as in
# checkpoint/FORMAT.md section 3); a checkpoint restores into 3 PS and into 2 greedy-placed PS to
# bit-identical values and the same evaluation; kill -9 of the PS in the middle of a save leaves
# only committed files named, and between the rename and checkpoint.json's update an uncommitted
# file that `ckpt ls` lists and the next start removes; a corrupted latest falls back to the previous one with a warning; a
# different model is a shape error or a restored/initialized/unused report; SIGUSR1 to mpirun and
# SIGTERM to one rank save and exit 75, and resuming ends where an uninterrupted run ends; bad
# flags are one line and exit 2.
source "$(dirname "$0")/lib.sh"
FMNIST=/usr/share/datasets/fashion-mnist
PY_H5=/usr/bin/python3   # Debian's interpreter, which has h5py (python3 on PATH may not)

if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: $FMNIST missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi
for tool in h5ls h5dump; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (hdf5-tools)"; exit 77; }
done
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
TRAIN=(train --global-batch 256)

# Background jobs: LAUNCHER is `timeout`'s PID, mpirun its child, the ranks mpirun's children.
start_bg() {
  local np=$1; shift
  timeout -s KILL 120 "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" -np "$np" "$@" >"$OUT" 2>"$ERR" &
  LAUNCHER=$!
}
mpirun_pid() { pgrep -P "$LAUNCHER" 2>/dev/null | head -1; }
# rank_pid R: the PID of MPI rank R of the background job (empty if not found within 10 s).
rank_pid() {
  local r=$1 m p
  for _ in $(seq 1 100); do
    for m in $(pgrep -P "$LAUNCHER" 2>/dev/null); do
      for p in $(pgrep -P "$m" 2>/dev/null); do
        if grep -qxz "OMPI_COMM_WORLD_RANK=$r" "/proc/$p/environ" 2>/dev/null; then
          echo "$p"; return
        fi
      done
    done
    sleep 0.1
  done
}
# wait_bg SECS: waits for the background job at most SECS more seconds (then kills it); sets RC.
wait_bg() {
  local secs=$1 t=0
  while kill -0 "$LAUNCHER" 2>/dev/null && [ "$t" -lt $((secs * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$LAUNCHER" 2>/dev/null; then
    kill -KILL "$LAUNCHER" 2>/dev/null   # timeout dies; mpirun then loses its parent
    local m; m=$(mpirun_pid); [ -n "$m" ] && kill -KILL "$m" 2>/dev/null
    wait "$LAUNCHER"; RC=124
    return 1
  fi
  wait "$LAUNCHER"; RC=$?
}
# until_true SECS CMD...: polls CMD every 50 ms for at most SECS seconds.
# Runs in this shell (CMD may be a function defined here).
until_true() {
  local secs=$1; shift
  local deadline=$((SECONDS + secs))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}
progress_seen() { grep -q '^step ' "$OUT"; }
tmp_exists() { compgen -G "$1/*.h5.tmp" >/dev/null; }

# ---------------------------------------------------------------------------------------------
case_begin "1 PS + 2 workers: periodic saves committed, listed, pruned, readable without strata"
A="$TEST_TMP/a"
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$A" --save-every-steps 50 --max-to-keep 2 "${QUIET[@]}"
expect_rc 0
[ -f "$A/checkpoint.json" ] || { fail "no checkpoint.json"; finish; }
ORIG_ACC=$(summary_get 'j["test_accuracy"]')
ORIG_LOSS=$(summary_get 'j["test_loss"]')
GSTEP=$(summary_get 'j["global_step"]')
STEPS_PER_EPOCH=$(summary_get 'j["steps"]')
saved=$(summary_get 'j["checkpoints_saved"]')
[[ "$saved" =~ ^[0-9]+$ ]] && [ "$saved" -ge 4 ] || fail "checkpoints_saved should be >= 4 (every 50 of $GSTEP global steps + final), got $saved"
[ "$(summary_get 'j["checkpoint_dir"]')" = "$A" ] || fail "summary lacks checkpoint_dir $A"
[ "$(summary_get 'j["final_checkpoint"]')" = "$A/ckpt-$GSTEP.h5" ] || fail "summary final_checkpoint is not $A/ckpt-$GSTEP.h5"
[ "$(grep -c '^checkpoint: saved ' "$OUT")" = "$saved" ] || fail "expected $saved 'checkpoint: saved' lines"
grep -qE "^checkpoint: saved $A/ckpt-$GSTEP\.h5 \(global step $GSTEP, [0-9.]+ MiB in [0-9.]+ s, [0-9]+ MB/s, final\)$" "$OUT" \
  || fail "no final save line for global step $GSTEP"
[ "$(ls "$A" | grep -c '\.h5$')" = 2 ] || fail "--max-to-keep 2: expected 2 .h5 files, have: $(ls "$A" | tr '\n' ' ')"
ls "$A" | grep -q '\.tmp$' && fail "a .tmp file was left behind: $(ls "$A" | tr '\n' ' ')"
[ "$(pointer_get "$A" '" ".join(c["file"] for c in j["checkpoints"])')" = "$(cd "$A" && ls -1 ckpt-*.h5 | sort -t- -k2 -n | tr '\n' ' ' | sed 's/ $//')" ] \
  || fail "checkpoint.json lists $(pointer_get "$A" '[c["file"] for c in j["checkpoints"]]'), the directory has $(ls "$A" | tr '\n' ' ')"
[ "$(pointer_get "$A" 'j["latest"], j["checkpoints"][-1]["global_step"], j["format_version"]')" = "ckpt-$GSTEP.h5 $GSTEP 2" ] \
  || fail "checkpoint.json latest: $(pointer_get "$A" 'j["latest"], j["checkpoints"][-1]')"
PREV=$(pointer_get "$A" 'j["checkpoints"][0]["global_step"]')
[[ "$PREV" =~ ^[0-9]+$ ]] && [ "$PREV" -lt "$GSTEP" ] || fail "older kept checkpoint step: $PREV"
LATEST="$A/ckpt-$GSTEP.h5"
h5ls -r "$LATEST" > "$TEST_TMP/h5ls" 2>&1 || fail "h5ls -r failed: $(head -3 "$TEST_TMP/h5ls")"
for want in "/variables/dense_0/kernel Dataset {784, 256}" "/variables/logits/bias   Dataset {10}" \
            "/slots/dense_0/kernel/m  Dataset {784, 256}"; do
  grep -qF "$want" "$TEST_TMP/h5ls" || fail "h5ls -r lacks '$want': $(tr '\n' '|' < "$TEST_TMP/h5ls")"
done
[ "$(grep -c '^/variables/.* Dataset' "$TEST_TMP/h5ls")" = 6 ] || fail "expected 6 variables in h5ls -r"
h5dump -H "$LATEST" > "$TEST_TMP/h5dump" 2>&1 || fail "h5dump -H failed"
grep -q 'DATASET "kernel"' "$TEST_TMP/h5dump" && grep -q 'ATTRIBUTE "checksum"' "$TEST_TMP/h5dump" \
  || fail "h5dump -H lacks the kernel datasets or checksum attributes"
h5dump -a /global_step "$LATEST" | grep -q "(0): $GSTEP\$" || fail "h5dump: /global_step is not $GSTEP"
# FORMAT.md's own Python recipes (file checksum, manifest), extracted from the document.
sed -n '/# recipe: begin/,/# recipe: end/p' "$STRATA_SOURCE_DIR/checkpoint/FORMAT.md" > "$TEST_TMP/recipes.py"
"$PY_H5" - "$LATEST" "$GSTEP" "$TEST_TMP/recipes.py" > "$TEST_TMP/py" 2>&1 <<'PY' || fail "h5py check: $(tail -5 "$TEST_TMP/py")"
import h5py, json, sys, zlib
exec(open(sys.argv[3]).read())
assert file_checksum_ok(sys.argv[1])
f = h5py.File(sys.argv[1], "r")
assert zlib.crc32(manifest(f)) == int(f.attrs["metadata_checksum"])
assert f.userblock_size >= 512
assert int(f.attrs["format_version"]) == 2
assert int(f.attrs["global_step"]) == int(sys.argv[2]), f.attrs["global_step"]
assert f.attrs["checksum_algorithm"] in ("crc32", b"crc32")
names = []
f["variables"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert sorted(names) == ["dense_0/bias", "dense_0/kernel", "dense_1/bias", "dense_1/kernel",
                         "logits/bias", "logits/kernel"], names
d = f["variables/dense_0/kernel"]
assert d.shape == (784, 256) and d.dtype == "<f4", (d.shape, d.dtype)
for group in ("variables", "slots"):
    def check(name, obj):
        if isinstance(obj, h5py.Dataset):
            crc = zlib.crc32(obj[()].astype(obj.dtype.newbyteorder("<")).tobytes())
            assert crc == int(obj.attrs["checksum"]), (group, name, crc, int(obj.attrs["checksum"]))
    f[group].visititems(check)
pos = json.loads(f.attrs["training_position"])
assert [w["worker"] for w in pos["workers"]] == [0, 1], pos
PY
run "$STRATA_BIN" ckpt verify "$A"
expect_rc 0
expect_stdout_has "2 checkpoint(s): 2 OK, 0 FAILED"

# ---------------------------------------------------------------------------------------------
case_begin "resharding: restore into 3 PS and into 2 greedy-placed PS, save again: identical"
for layout in "3 5 round_robin" "2 4 greedy"; do
  read -r nps np placement <<< "$layout"
  R="$TEST_TMP/reshard-$nps"
  mpi "$np" "$STRATA_BIN" "${TRAIN[@]}" --num-ps "$nps" --placement "$placement" --steps 0 --restore "$A" \
    --checkpoint-dir "$R" "${QUIET[@]}"
  expect_rc 0
  expect_stdout_has "checkpoint: restored 6 variable(s) from $LATEST (global step $GSTEP)"
  expect_stdout_has "checkpoint: saved $R/ckpt-$GSTEP.h5 (global step $GSTEP,"
  [ "$(summary_get 'j["ps"], j["restored_from"], j["global_step"]')" = "$nps $LATEST $GSTEP" ] \
    || fail "summary ps/restored_from/global_step: $(summary_get 'j["ps"], j["restored_from"], j["global_step"]')"
  # Same parameters, same evaluation.
  [ "$(summary_get 'j["test_accuracy"], j["test_loss"]')" = "$ORIG_ACC $ORIG_LOSS" ] \
    || fail "$nps PS: test accuracy/loss $(summary_get 'j["test_accuracy"], j["test_loss"]') != original $ORIG_ACC $ORIG_LOSS"
  run "$STRATA_BIN" ckpt diff "$A" "$R"
  expect_rc 0
  [ "$(tail -1 "$OUT")" = identical ] || fail "$nps PS ($placement): the re-saved checkpoint differs from the original"
done

# ---------------------------------------------------------------------------------------------
case_begin "kill -9 of the PS in the middle of a save: only committed checkpoints are named"
K="$TEST_TMP/killed"
STRATA_TEST_SAVE_DELAY_S=5 start_bg 3 "$STRATA_BIN" "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$K" \
  --save-every-steps 30 "${QUIET[@]}"
ps_pid=$(rank_pid 0)
if [ -z "$ps_pid" ]; then
  fail "could not find the PS rank's process"
  wait_bg 1
elif ! until_true 40 test -f "$K/checkpoint.json" || ! until_true 20 tmp_exists "$K"; then
  fail "no committed checkpoint followed by a .tmp within 60 s: $(ls "$K" 2>&1 | tr '\n' ' ')"
  wait_bg 1
else
  tmp=$(cd "$K" && ls -1 *.h5.tmp | head -1)
  kill -9 "$ps_pid"
  t0=$SECONDS
  wait_bg 30 || fail "the job did not end within 30 s of the PS's SIGKILL"
  expect_rc_nonzero
  [ $((SECONDS - t0)) -lt 30 ] || fail "the job took $((SECONDS - t0)) s to end"
  grep -q 'checkpoint: saved' "$OUT" || fail "no checkpoint was reported saved before the kill"
  grep -q 'final)' "$OUT" && fail "the job finished before the kill (the save delay did not hold)"
  unfinished=${tmp%.tmp}
  [ ! -e "$K/$unfinished" ] || fail "$unfinished was committed although its save was killed"
  PRE=$(pointer_get "$K" 'j["checkpoints"][-1]["global_step"]')
  listed=$(pointer_get "$K" '" ".join(c["file"] for c in j["checkpoints"])')
  for f in $listed; do
    [[ "$f" == *.h5 ]] || fail "checkpoint.json names a non-committed file $f"
    [ -f "$K/$f" ] || fail "checkpoint.json names $f, which does not exist"
  done
  [[ " $listed " == *" $unfinished "* ]] && fail "checkpoint.json names the killed save $unfinished"
  [ "$(pointer_get "$K" 'j["latest"]')" = "ckpt-$PRE.h5" ] || fail "latest is not ckpt-$PRE.h5"
  run "$STRATA_BIN" ckpt verify "$K"
  expect_rc 0
  run "$STRATA_BIN" ckpt ls "$K"
  expect_rc 0
  expect_stdout_has "uncommitted (ignored): $tmp"
  F="$TEST_TMP/after-kill"
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$K" --checkpoint-dir "$F" "${QUIET[@]}"
  expect_rc 0
  expect_stdout_has "checkpoint: restored 6 variable(s) from $K/ckpt-$PRE.h5 (global step $PRE)"
  grep -q WARNING "$OUT" && fail "a warning although every committed checkpoint is intact"
  run "$STRATA_BIN" ckpt diff "$K/ckpt-$PRE.h5" "$F"
  expect_rc 0
  [ "$(tail -1 "$OUT")" = identical ] || fail "restored-and-saved differs from ckpt-$PRE.h5"
  # A job that saves into K again removes the killed save's .tmp at start-up.
  printf 'partial' > "$K/checkpoint.json.tmp"
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --checkpoint-dir "$K" --restore latest "${QUIET[@]}"
  expect_rc 0
  expect_stdout_has "checkpoint: removed checkpoint.json.tmp, $tmp from $K (left by an interrupted save)"
  ls "$K" | grep -q '\.tmp$' && fail "a .tmp file survived the resume: $(ls "$K" | tr '\n' ' ')"
fi

# ---------------------------------------------------------------------------------------------
case_begin "kill -9 of the PS between the file's rename and checkpoint.json's update: uncommitted, then removed"
# STRATA_TEST_COMMIT_DELAY_S holds every commit with ckpt-<step>.h5 renamed into place but not yet
# named by checkpoint.json; the PS is killed there during the second save (the first one's commit
# made checkpoint.json).
O="$TEST_TMP/orphan"
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
STRATA_TEST_COMMIT_DELAY_S=5 start_bg 3 "$STRATA_BIN" "${TRAIN[@]}" --epochs 1 --checkpoint-dir "$O" \
  --save-every-steps 30 "${QUIET[@]}"
ps_pid=$(rank_pid 0)
if [ -z "$ps_pid" ]; then
  fail "could not find the PS rank's process"
  wait_bg 1
elif ! until_true 60 orphan_in "$O" >/dev/null; then
  fail "no renamed file waiting for checkpoint.json within 60 s: $(ls "$O" 2>&1 | tr '\n' ' ')"
  wait_bg 1
else
  orphan=$(orphan_in "$O")
  kill -9 "$ps_pid"
  wait_bg 30 || fail "the job did not end within 30 s of the PS's SIGKILL"
  expect_rc_nonzero
  PRE=$(pointer_get "$O" 'j["latest"]')
  PRE_STEP=$(pointer_get "$O" 'j["checkpoints"][-1]["global_step"]')
  committed=$(pointer_get "$O" '" ".join(c["file"] for c in j["checkpoints"])')
  [ "$(orphan_in "$O")" = "$orphan" ] || fail "$orphan is not left uncommitted after the kill: $(ls "$O" | tr '\n' ' ')"
  [[ " $committed " == *" $orphan "* ]] && fail "checkpoint.json names $orphan, whose commit was killed"
  # Complete: the file itself verifies; only checkpoint.json never named it.
  run "$STRATA_BIN" ckpt verify "$O/$orphan"
  expect_rc 0
  run "$STRATA_BIN" ckpt ls "$O"
  expect_rc 0
  expect_stdout_has "uncommitted (ignored): $orphan ($(stat -c %s "$O/$orphan") bytes): complete, but checkpoint.json does not name it"
  grep -qE "^[0-9]+ +$PRE .* latest\$" "$OUT" || fail "ckpt ls does not mark $PRE latest"
  run "$STRATA_BIN" ckpt ls --verify --json "$O"
  expect_rc 0
  expect_json "j['latest'], j['restore'], [u['file'] for u in j['uncommitted'] if u['complete']]" "$PRE $PRE ['$orphan']"
  # The next start in the directory restores the previous committed checkpoint and removes the orphan.
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --checkpoint-dir "$O" --restore latest "${QUIET[@]}"
  expect_rc 0
  expect_stdout_has "checkpoint: restored 6 variable(s) from $O/$PRE (global step $PRE_STEP)"
  expect_stdout_has "checkpoint: removed $orphan from $O (left by an interrupted save)"
  [ -e "$O/$orphan" ] && fail "$orphan survived the next start in $O"
  for f in $committed; do
    [ -f "$O/$f" ] || fail "the committed $f is gone after the next start"
  done
  run "$STRATA_BIN" ckpt verify "$O"
  expect_rc 0
  run "$STRATA_BIN" ckpt ls --json "$O"
  expect_json "j['uncommitted']" "[]"
fi

# ---------------------------------------------------------------------------------------------
case_begin "a corrupted latest checkpoint: restore latest warns and uses the previous one"
C="$TEST_TMP/corrupt"
cp -r "$A" "$C"
offset=$(h5dump -p -H -d /variables/dense_0/kernel "$C/ckpt-$GSTEP.h5" | awk '$1 == "OFFSET" {print $2}')
if [[ ! "$offset" =~ ^[0-9]+$ ]]; then
  fail "no OFFSET for /variables/dense_0/kernel in h5dump -p output"
else
  "$PY_H5" - "$C/ckpt-$GSTEP.h5" "$((offset + 4001))" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0x5A]))
PY
  run "$STRATA_BIN" ckpt verify "$C"
  expect_rc 1
  expect_stdout_has "variables/dense_0/kernel: checksum mismatch"
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --checkpoint-dir "$C" --restore latest "${QUIET[@]}"
  expect_rc 0
  expect_stdout_has "checkpoint: WARNING: skipped a newer checkpoint that failed verification: $C/ckpt-$GSTEP.h5"
  grep -q 'WARNING: skipped .*variables/dense_0/kernel' "$OUT" || fail "the warning does not name the bad dataset"
  expect_stdout_has "checkpoint: restored 6 variable(s) from $C/ckpt-$PREV.h5 (global step $PREV)"
  expect_stdout_has "global step $PREV"
  [ "$(summary_get 'j["global_step"]')" = "$PREV" ] || fail "summary global_step is not $PREV"
  # The final save re-wrote step PREV from the restored values: identical to the original file.
  run "$STRATA_BIN" ckpt diff "$A/ckpt-$PREV.h5" "$C/ckpt-$PREV.h5"
  expect_rc 0
  run "$STRATA_BIN" ckpt verify "$C"
  expect_rc 1   # the corrupt file is still listed
  expect_stdout_has "$C/ckpt-$PREV.h5: OK"
fi

# ---------------------------------------------------------------------------------------------
case_begin "different model: a shape mismatch is one error line naming the variable, exit 2"
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --hidden 64 --steps 0 --restore "$A" "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line"
grep -qF "strata train: error: cannot restore: variable 'dense_0/kernel': checkpoint shape [784,256] != model shape [784,64]" "$ERR" \
  || fail "the error does not name dense_0/kernel and both shapes"
grep -q '^checkpoint: restored' "$OUT" && fail "reported a restore although it failed"
# softmax's logits/kernel is [784,10], the mlp's [128,10]: same name, other shape, also an error.
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --model softmax --steps 0 --restore "$A" "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line"
expect_stderr_has "variable 'logits/kernel': checkpoint shape [128,10] != model shape [784,10]"

case_begin "different model: restored / initialized / unused report, --expect-partial"
# Wider model: the checkpoint's 6 variables restore, dense_2 is initialized.
W="$TEST_TMP/wider"
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --hidden 256,128,128 --steps 0 --restore "$A" --checkpoint-dir "$W" "${QUIET[@]}"
expect_rc 0
expect_stdout_has "checkpoint: restored 6 variable(s) from $LATEST (global step $GSTEP)"
expect_stdout_has "checkpoint: not in the checkpoint, initialized: dense_2/kernel, dense_2/bias"
grep -q 'not in the model' "$OUT" && fail "nothing of the checkpoint is unused here"
# Back into the default mlp: dense_2 is in the checkpoint but not in the model.
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$W" "${QUIET[@]}"
expect_rc 0
expect_stdout_has "checkpoint: restored 6 variable(s) from $W/ckpt-$GSTEP.h5"
expect_stdout_has "checkpoint: in the checkpoint but not in the model (unused; expect_partial silences this): dense_2/bias, dense_2/kernel"
grep -q 'initialized' "$OUT" && fail "nothing of the model is missing from the checkpoint"
[ "$(summary_get 'j["test_accuracy"]')" = "$ORIG_ACC" ] || fail "the restored mlp evaluates differently: $(summary_get 'j["test_accuracy"]') != $ORIG_ACC"
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --steps 0 --restore "$W" --expect-partial "${QUIET[@]}"
expect_rc 0
expect_stdout_has "checkpoint: restored 6 variable(s)"
grep -q 'not in the model' "$OUT" && fail "--expect-partial did not silence the unused line"
# An unrelated model: nothing restored, everything initialized, every mlp variable unused.
mpi 3 "$STRATA_BIN" train --model wide_deep --data synthetic-sparse --steps 0 --restore "$A" "${QUIET[@]}"
expect_rc 0
expect_stdout_has "checkpoint: restored 0 variable(s) from $LATEST"
grep -qE '^checkpoint: not in the checkpoint, initialized: .*wide/weights.*deep/logits/bias' "$OUT" \
  || fail "wide_deep's variables not reported initialized"
expect_stdout_has "(unused; expect_partial silences this): dense_0/bias, dense_0/kernel, dense_1/bias, dense_1/kernel, logits/bias, logits/kernel"

# ---------------------------------------------------------------------------------------------
case_begin "SIGUSR1 to mpirun: save at the next step boundary, exit 75; resume ends like an uninterrupted run"
P="$TEST_TMP/preempt"
EPOCHS=8   # long enough (~10 s) that the signal lands mid-training
start_bg 3 "$STRATA_BIN" "${TRAIN[@]}" --epochs "$EPOCHS" --checkpoint-dir "$P" --log-every 20 --log-every-secs 0
if ! until_true 60 progress_seen; then
  fail "no progress line within 60 s"
  wait_bg 1
else
  kill -USR1 "$(mpirun_pid)"
  wait_bg 60 || fail "the job did not end within 60 s of SIGUSR1"
  expect_rc 75
  grep -qE "^checkpoint: saved $P/ckpt-[0-9]+\.h5 \(global step [0-9]+, .*, preemption: stopping\)$" "$OUT" \
    || fail "no preemption save line"
  [ "$(summary_get 'j["preempted"], j["checkpoints_saved"], j["checkpoint_dir"]')" = "True 1 $P" ] \
    || fail "summary preempted/checkpoints_saved/checkpoint_dir: $(summary_get 'j.get("preempted"), j.get("checkpoints_saved"), j.get("checkpoint_dir")')"
  STOP=$(summary_get 'j["global_step"]')
  [ "$STOP" -lt $((2 * EPOCHS * STEPS_PER_EPOCH)) ] 2>/dev/null || fail "the job was not stopped early (global step $STOP)"
  [ "$(pointer_get "$P" 'j["latest"]')" = "ckpt-$STOP.h5" ] || fail "latest is not the preemption save ckpt-$STOP.h5"
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --epochs "$EPOCHS" --checkpoint-dir "$P" --restore latest "${QUIET[@]}"
  expect_rc 0
  expect_stdout_has "checkpoint: restored 6 variable(s) from $P/ckpt-$STOP.h5 (global step $STOP)"
  grep -qE "^resuming at epoch [0-9]+, step [0-9]+, global step $STOP$" "$OUT" || fail "no resuming line"
  # An uninterrupted run: EPOCHS x the steps per epoch of case 1, on each of the 2 workers.
  want="$((2 * EPOCHS * STEPS_PER_EPOCH)) $((EPOCHS * STEPS_PER_EPOCH)) $P/ckpt-$STOP.h5"
  [ "$(summary_get 'j["global_step"], j["steps"], j["restored_from"]')" = "$want" ] \
    || fail "resumed summary global_step/steps/restored_from: $(summary_get 'j["global_step"], j["steps"], j.get("restored_from")') != $want"
  [ "$(summary_get 'int(j["test_accuracy"] > 0.78)')" = 1 ] || fail "accuracy after $EPOCHS epochs: $(summary_get 'j["test_accuracy"]')"
  [ "$(summary_get 'j.get("preempted", False)')" = False ] || fail "the resumed run says preempted"
fi

case_begin "SIGTERM to one worker rank (as srun delivers it): exit 75"
T="$TEST_TMP/sigterm"
start_bg 3 "$STRATA_BIN" "${TRAIN[@]}" --epochs "$EPOCHS" --checkpoint-dir "$T" --log-every 20 --log-every-secs 0
worker=$(rank_pid 2)
if [ -z "$worker" ] || ! until_true 60 progress_seen; then
  fail "no worker rank 2 or no progress line within 60 s"
  wait_bg 1
else
  kill -TERM "$worker"
  wait_bg 60 || fail "the job did not end within 60 s of SIGTERM"
  expect_rc 75
  grep -qE "^checkpoint: saved $T/ckpt-[0-9]+\.h5 .*preemption: stopping\)$" "$OUT" || fail "no preemption save line"
  [ "$(summary_get 'j["preempted"]')" = True ] || fail "summary lacks preempted: true"
  run "$STRATA_BIN" ckpt verify "$T"
  expect_rc 0
fi

# ---------------------------------------------------------------------------------------------
case_begin "2 PS over UCX on TCP (as between nodes): sync training with periodic saves"
# Over TCP every one-sided operation needs the target's progress: a PS inside the collective HDF5
# save must keep answering the other PS (still reading the save counters) and the workers.
U="$TEST_TMP/ucx-tcp"
UCX_TLS=self,tcp mpi 4 -x UCX_TLS "$STRATA_BIN" "${TRAIN[@]}" --transport ucx --num-ps 2 --consistency sync \
  --epochs 1 --checkpoint-dir "$U" --save-every-steps 100 "${QUIET[@]}"
if [ "$RC" = 2 ] && grep -q "unknown transport 'ucx'" "$ERR"; then
  echo "  (this build has no UCX transport: case not applicable)"
else
  expect_rc 0
  # Saves every 100 of GSTEP global steps, plus the final one.
  want="2 $((GSTEP / 100 + 1)) $GSTEP"
  [ "$(summary_get 'j["ps"], j["checkpoints_saved"], j["global_step"]')" = "$want" ] \
    || fail "summary ps/checkpoints_saved/global_step: $(summary_get 'j["ps"], j["checkpoints_saved"], j["global_step"]') != $want"
  [ -f "$U/ckpt-$GSTEP.h5" ] || fail "no final checkpoint ckpt-$GSTEP.h5"
  run "$STRATA_BIN" ckpt verify "$U"
  expect_rc 0
fi

# ---------------------------------------------------------------------------------------------
case_begin "bad input: one line, exit 2"
run "$STRATA_BIN" train --save-every-steps 5 --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--checkpoint-dir"
run "$STRATA_BIN" train --max-to-keep 3 --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--checkpoint-dir"
run "$STRATA_BIN" train --restore latest --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--restore latest needs --checkpoint-dir"
run "$STRATA_BIN" train --checkpoint-dir "$TEST_TMP/x" --save-every-steps abc
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--save-every-steps: 'abc'"
mpi 3 "$STRATA_BIN" train --restore /nonexistent --steps 1 "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line"
expect_stderr_has "strata train: error: restore: '/nonexistent' does not exist"
mpi 3 "$STRATA_BIN" train --restore "$TEST_TMP/corrupt/ckpt-$GSTEP.h5" --steps 1 "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line"
expect_stderr_has "restore: '$TEST_TMP/corrupt/ckpt-$GSTEP.h5' fails verification"

finish
