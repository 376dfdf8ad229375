#!/usr/bin/env bash
# strata ckpt ls|show|verify|diff over real checkpoints written by the real collective writer
# (tests/tools/make_checkpoint.cc under mpirun at 1-3 ranks): listings agree with the files and
# with h5ls/h5dump, a save on 1 rank equals the same values saved on 3 ranks, perturbations,
# corruption and truncation are reported with the right dataset and exit status, bad usage is one
# line and exit 2; damage anywhere in a file (metadata included, h5py edits included) fails verify
# and is never parsed, version 1 files are read only with --allow-unverified. The ckpt commands themselves run as plain
# processes, never under mpirun.
source "$(dirname "$0")/lib.sh"

: "${STRATA_MAKE_CHECKPOINT:?STRATA_MAKE_CHECKPOINT must point at strata_test_make_checkpoint}"
for tool in h5ls h5dump; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (hdf5-tools)"; exit 77; }
done
PY_H5=/usr/bin/python3   # Debian's interpreter, which has h5py (python3 on PATH may not)
"$PY_H5" -c "import h5py" 2>/dev/null || { echo "SKIP: $PY_H5 lacks h5py (python3-h5py)"; exit 77; }

# make NP ARGS...: writes one checkpoint with NP ranks; aborts the script if the writer fails,
# since every later case depends on the fixtures.
make_ckpt() {
  local np=$1; shift
  mpi "$np" "$STRATA_MAKE_CHECKPOINT" "$@"
  if [ "$RC" != 0 ]; then
    CASE="fixture: make_checkpoint $*"; fail "the checkpoint writer failed"; finish
  fi
}

D="$TEST_TMP/run"           # three committed checkpoints, written at 2, 3 and 1 ranks
make_ckpt 2 --dir "$D" --step 100 --seed 7
make_ckpt 3 --dir "$D" --step 200 --seed 7
make_ckpt 1 --dir "$D" --step 300 --seed 7 --optimizer-step 42
printf 'partial' > "$D/ckpt-400.h5.tmp"   # what a save killed mid-write leaves behind

case_begin "ls lists steps, sizes, latest and the stray .tmp"
run "$STRATA_BIN" ckpt ls "$D"
expect_rc 0
for step in 100 200 300; do
  size=$(stat -c %s "$D/ckpt-$step.h5")
  grep -qE "^$step +ckpt-$step\.h5 +$size +[0-9.]+ (B|KiB|MiB) +20[0-9-]+T[0-9:]+Z" "$OUT" \
    || fail "no row for step $step with size $size"
done
grep -qE '^300 .* latest$' "$OUT" || fail "ckpt-300.h5 is not marked latest"
grep -qE '^(100|200) .* latest$' "$OUT" && fail "an older checkpoint is marked latest"
expect_stdout_has "uncommitted (ignored): ckpt-400.h5.tmp (7 bytes)"
# Oldest first.
[ "$(grep -oE '^[0-9]+ ' "$OUT" | tr -d ' ' | tr '\n' ' ')" = "100 200 300 " ] || fail "rows not oldest first"

case_begin "ls --json"
run "$STRATA_BIN" ckpt ls --json "$D"
expect_rc 0
expect_json "[c['global_step'] for c in j['checkpoints']]" "[100, 200, 300]"
expect_json "j['checkpoints'][2]['bytes']" "$(stat -c %s "$D/ckpt-300.h5")"
expect_json "j['latest'], j['checkpoints'][2]['latest'], j['checkpoints'][0]['latest']" "ckpt-300.h5 True False"
expect_json "j['uncommitted']" "[{'bytes': 7, 'complete': False, 'file': 'ckpt-400.h5.tmp'}]"
created=$(json_get "j['checkpoints'][2]['created_unix']")
expect_json "j['checkpoints'][2]['created']" "$(date -u -d "@$created" +%Y-%m-%dT%H:%M:%SZ)"

case_begin "ls: a complete file checkpoint.json does not name is uncommitted, and never latest"
# What a save killed between its rename and checkpoint.json's update leaves: a complete, valid
# ckpt-500.h5 that no entry names. Beside it, names that are not strata's uncommitted files.
O="$TEST_TMP/orphan"
cp -r "$D" "$O"
make_ckpt 1 --dir "$TEST_TMP/step500" --step 500 --seed 7
cp "$TEST_TMP/step500/ckpt-500.h5" "$O/"
ln -s ckpt-300.h5 "$O/ckpt-600.h5"        # a link is not a file strata wrote
cp "$O/ckpt-300.h5" "$O/ckpt-0700.h5"     # not a name save() writes (leading zero)
printf 'x' > "$O/notes-800.h5"
size500=$(stat -c %s "$O/ckpt-500.h5")
run "$STRATA_BIN" ckpt ls "$O"
expect_rc 0
expect_stdout_has "uncommitted (ignored): ckpt-400.h5.tmp (7 bytes): an unfinished save"
expect_stdout_has "uncommitted (ignored): ckpt-500.h5 ($size500 bytes): complete, but checkpoint.json does not name it"
grep -qE '^300 .* latest$' "$OUT" || fail "ckpt-300.h5 is not marked latest beside the uncommitted ckpt-500.h5"
grep -qE '^500 ' "$OUT" && fail "the uncommitted ckpt-500.h5 is listed as a committed row"
grep -qE 'ckpt-600|ckpt-0700|notes-800' "$OUT" && fail "a name that is no uncommitted strata file is listed"
run "$STRATA_BIN" ckpt ls --json "$O"
expect_rc 0
expect_json "j['uncommitted']" "[{'bytes': 7, 'complete': False, 'file': 'ckpt-400.h5.tmp'}, {'bytes': $size500, 'complete': True, 'file': 'ckpt-500.h5'}]"
expect_json "j['latest']" "ckpt-300.h5"
run "$STRATA_BIN" ckpt ls --verify --json "$O"
expect_rc 0
expect_json "j['restore']" "ckpt-300.h5"
run "$STRATA_BIN" ckpt show "$O"
expect_rc 0
grep -qE "^checkpoint +$O/ckpt-300.h5$" "$OUT" || fail "show DIR (= what --restore latest uses) is not ckpt-300.h5"

case_begin "ls --verify, all good"
run "$STRATA_BIN" ckpt ls --verify "$D"
expect_rc 0
[ "$(grep -c ' verified' "$OUT")" = 3 ] || fail "expected 3 verified rows"

case_begin "show a directory = its latest, with shapes"
run "$STRATA_BIN" ckpt show "$D"
expect_rc 0
grep -qE "^checkpoint +$D/ckpt-300.h5$" "$OUT" || fail "does not show ckpt-300.h5"
grep -qE '^global_step +300$' "$OUT" || fail "global_step 300 missing"
grep -qE '^format_version +2$' "$OUT" || fail "format_version missing"
grep -qE '^optimizer +adam$' "$OUT" || fail "optimizer missing"
grep -qE '^variable_sequence_hash +0x5eed0000c0ffee01 ' "$OUT" || fail "hash missing"
expect_stdout_has '"offset": 9600'
grep -qE '^embedding/table +\[1000,16\] +f32 +64000 +accumulator +0$' "$OUT" || fail "embedding/table row"
grep -qE '^dense/kernel +\[6,4\] +f32 +96 +m,v +42$' "$OUT" || fail "dense/kernel row"
grep -qE '^dense/bias +\[5\] +f64 +40 +- +0$' "$OUT" || fail "dense/bias row"
grep -qE '^ids +\[7\] +i64 +56 +- +0$' "$OUT" || fail "ids row"
expect_stdout_has "4 variable(s): 64192 bytes of values"

case_begin "show --json agrees with h5ls and h5dump"
run "$STRATA_BIN" ckpt show --json "$D/ckpt-200.h5"
expect_rc 0
expect_json "j['global_step'], j['format_version'], j['training_position']['workers'][0]['offset']" "200 2 6400"
h5dump -a /global_step "$D/ckpt-200.h5" | grep -q '(0): 200' || fail "h5dump global_step is not 200"
json_get "'\n'.join(v['name'] + ' ' + ', '.join(map(str, v['shape'])) for v in j['variables'])" > "$TEST_TMP/shapes"
[ "$(wc -l < "$TEST_TMP/shapes")" = 4 ] || fail "expected 4 variables in show --json"
while read -r name dims; do
  h5ls "$D/ckpt-200.h5/variables/$name" | grep -qF "Dataset {$dims}" || fail "h5ls disagrees on $name {$dims}"
done < "$TEST_TMP/shapes"
expect_json "[v['slots'] for v in j['variables'] if v['name'] == 'dense/kernel'][0]" "['m', 'v']"

case_begin "verify a directory: all OK"
run "$STRATA_BIN" ckpt verify "$D"
expect_rc 0
for step in 100 200 300; do
  size=$(stat -c %s "$D/ckpt-$step.h5")
  grep -qE "^$D/ckpt-$step\.h5: OK \(step $step, 7 dataset\(s\) verified, file checksum 0x[0-9a-f]{8} over $size bytes\)$" "$OUT" \
    || fail "no OK line with the file checksum for step $step"
done
expect_stdout_has "3 checkpoint(s): 3 OK, 0 FAILED"

# Same seed and step at 1 and 3 ranks: identical values, different files and creation times.
make_ckpt 1 --dir "$TEST_TMP/np1" --step 500 --seed 3
make_ckpt 3 --dir "$TEST_TMP/np3" --step 500 --seed 3
make_ckpt 2 --dir "$TEST_TMP/pert" --step 500 --seed 3 --perturb variables/embedding/table:777
make_ckpt 2 --dir "$TEST_TMP/slot" --step 500 --seed 3 --perturb slots/dense/kernel/m:5 --perturb variables/ids:6
make_ckpt 1 --dir "$TEST_TMP/extra" --step 500 --seed 3 --extra

case_begin "diff: 1 rank vs 3 ranks is identical (NaN == NaN)"
run "$STRATA_BIN" ckpt diff "$TEST_TMP/np1" "$TEST_TMP/np3/ckpt-500.h5"
expect_rc 0
[ "$(tail -1 "$OUT")" = identical ] || fail "last line is not 'identical'"

case_begin "diff: one perturbed element"
run "$STRATA_BIN" ckpt diff "$TEST_TMP/np1" "$TEST_TMP/pert"
expect_rc 1
# 777 = 48 * 16 + 9; the writer adds 0.5.
expect_stdout_has "variables/embedding/table: 1 of 16000 element(s) differ, max abs diff 0.5, first at [48,9]"
[ "$(tail -1 "$OUT")" = "1 difference" ] || fail "last line is not '1 difference'"
grep -q accumulator "$OUT" && fail "the unperturbed slot is reported"

case_begin "diff in small blocks finds the same element"
run "$STRATA_BIN" ckpt diff --block-bytes 200 "$TEST_TMP/pert" "$TEST_TMP/np1"
expect_rc 1
expect_stdout_has "variables/embedding/table: 1 of 16000 element(s) differ, max abs diff 0.5, first at [48,9]"

case_begin "diff --atol tolerates the perturbation"
run "$STRATA_BIN" ckpt diff --atol 0.5 "$TEST_TMP/np1" "$TEST_TMP/pert"
expect_rc 0
[ "$(tail -1 "$OUT")" = identical ] || fail "not identical within atol 0.5"
run "$STRATA_BIN" ckpt diff --atol 0.25 "$TEST_TMP/np1" "$TEST_TMP/pert"
expect_rc 1

case_begin "diff: a slot and an i64 variable"
run "$STRATA_BIN" ckpt diff "$TEST_TMP/np1" "$TEST_TMP/slot"
expect_rc 1
expect_stdout_has "slots/dense/kernel/m: 1 of 24 element(s) differ, max abs diff 0.5, first at [1,1]"
expect_stdout_has "variables/ids: 1 of 7 element(s) differ, max abs diff 1, first at [6]"
[ "$(tail -1 "$OUT")" = "2 differences" ] || fail "last line is not '2 differences'"

case_begin "diff: variable only in B, and a different step"
run "$STRATA_BIN" ckpt diff "$D/ckpt-300.h5" "$TEST_TMP/extra"
expect_rc 1
expect_stdout_has "only in B: variables/extra/only [3] f32"
expect_stdout_has "global_step: A 300, B 500"
expect_stdout_has "training_position: A"
grep -qE '^[0-9]+ differences$' "$OUT" || fail "no final count"

case_begin "diff: the optimizer step (Adam's bias correction) counts as a difference"
make_ckpt 2 --dir "$TEST_TMP/optstep" --step 500 --seed 3 --optimizer-step 9
run "$STRATA_BIN" ckpt diff "$TEST_TMP/np1" "$TEST_TMP/optstep"
expect_rc 1
expect_stdout_has "variables/dense/kernel optimizer_step: A 0, B 9"
[ "$(tail -1 "$OUT")" = "1 difference" ] || fail "last line is not '1 difference'"
run "$STRATA_BIN" ckpt show --json "$TEST_TMP/optstep"
expect_json "[v['optimizer_step'] for v in j['variables'] if v['name'] == 'dense/kernel'][0]" "9"

case_begin "ls marks checkpoints kept by keep_every_n_hours as preserved"
K="$TEST_TMP/keep"
for step in 1 2 3; do make_ckpt 1 --dir "$K" --step "$step" --max-to-keep 1 --keep-every-n-hours 1000; done
# max_to_keep 1: the first evicted (step 1) is preserved, step 2 is evicted inside the 1000 h.
[ "$(cd "$K" && ls ckpt-*.h5 | tr '\n' ' ')" = "ckpt-1.h5 ckpt-3.h5 " ] || fail "files: $(ls "$K" | tr '\n' ' ')"
run "$STRATA_BIN" ckpt ls "$K"
expect_rc 0
grep -qE '^1 +ckpt-1\.h5 .* preserved$' "$OUT" || fail "ckpt-1.h5 not marked preserved"
grep -qE '^3 +ckpt-3\.h5 .* latest$' "$OUT" || fail "ckpt-3.h5 not marked latest (only)"
run "$STRATA_BIN" ckpt ls --json "$K"
expect_json "[(c['file'], c['preserved']) for c in j['checkpoints']]" "[('ckpt-1.h5', True), ('ckpt-3.h5', False)]"

# Corrupt one byte in the middle of the latest file's embedding table (its data offset from
# h5dump's storage layout), as bit rot would.
cp "$D/ckpt-300.h5" "$TEST_TMP/good-300.h5"
offset=$(h5dump -p -H -d /variables/embedding/table "$D/ckpt-300.h5" | awk '$1 == "OFFSET" {print $2}')
case_begin "fixture: dataset offset from h5dump"
[[ "$offset" =~ ^[0-9]+$ ]] || { fail "no OFFSET in h5dump -p output"; finish; }
python3 - "$D/ckpt-300.h5" "$((offset + 1001))" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0x5A]))
EOF

case_begin "verify names the corrupt dataset and the fallback"
run "$STRATA_BIN" ckpt verify "$D"
expect_rc 1
expect_stdout_has "$D/ckpt-300.h5: FAILED: file checksum mismatch: stored 0x"
expect_stdout_has "; the data of variables/embedding/table changed, everything else is intact"
expect_stdout_has "  variables/embedding/table: checksum mismatch"
expect_stdout_has "$D/ckpt-200.h5: OK"
expect_stdout_has "3 checkpoint(s): 2 OK, 1 FAILED"
expect_stdout_has "latest checkpoint ckpt-300.h5 failed verification; --restore latest would use $D/ckpt-200.h5 (step 200)"
[ ! -s "$ERR" ] || fail "stderr should be empty (findings go to stdout)"

case_begin "verify one corrupt file"
run "$STRATA_BIN" ckpt verify "$D/ckpt-300.h5"
expect_rc 1
expect_stdout_has "variables/embedding/table: checksum mismatch"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/good-300.h5"
expect_rc 0
expect_stdout_has "good-300.h5: OK (step 300"

case_begin "ls --verify marks CORRUPT and the fallback"
run "$STRATA_BIN" ckpt ls --verify "$D"
expect_rc 1
grep -qE '^300 .* CORRUPT +latest$' "$OUT" || fail "ckpt-300.h5 not CORRUPT latest"
expect_stdout_has "latest ckpt-300.h5 is CORRUPT; --restore latest would use ckpt-200.h5 (step 200)"

case_begin "verify several files at once: a verdict each, exit 1 when any fails"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/good-300.h5" "$D/ckpt-300.h5" "$D/ckpt-200.h5"
expect_rc 1
expect_stdout_has "good-300.h5: OK (step 300"
expect_stdout_has "$D/ckpt-300.h5: FAILED: file checksum mismatch"
expect_stdout_has "$D/ckpt-200.h5: OK (step 200"
expect_stdout_has "3 path(s): 2 OK, 1 FAILED"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/good-300.h5" "$D/ckpt-200.h5"
expect_rc 0
expect_stdout_has "2 path(s): 2 OK, 0 FAILED"

case_begin "16 bytes flipped at offset 1200 (HDF5 metadata): verify fails, show refuses to parse, restore falls back"
M="$TEST_TMP/meta"
make_ckpt 2 --dir "$M" --step 100 --seed 7
make_ckpt 3 --dir "$M" --step 200 --seed 7
first_data=$(h5dump -p -H "$M/ckpt-200.h5" | awk '$1 == "OFFSET" {print $2}' | sort -n | head -1)
if [[ ! "$first_data" =~ ^[0-9]+$ ]] || [ "$first_data" -lt 1216 ]; then
  fail "offset 1200 is not in the metadata (first data at '$first_data')"
else
  python3 - "$M/ckpt-200.h5" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1200)
    b = bytes(x ^ 0xFF for x in f.read(16))
    f.seek(1200)
    f.write(b)
EOF
  run "$STRATA_BIN" ckpt verify "$M"
  expect_rc 1
  expect_stdout_has "$M/ckpt-200.h5: FAILED: file checksum mismatch"
  expect_stdout_has "the damage is outside the datasets' data"
  expect_stdout_has "--restore latest would use $M/ckpt-100.h5 (step 100)"
  run "$STRATA_BIN" ckpt show "$M/ckpt-200.h5"
  expect_rc 1; expect_one_stderr_line; expect_stderr_has "cannot read checkpoint '$M/ckpt-200.h5': file checksum mismatch"
  run "$STRATA_BIN" ckpt show "$M"
  expect_rc 0
  grep -qE '^global_step +100$' "$OUT" || fail "show of the directory did not fall back to step 100"
  expect_stderr_has "skipping $M/ckpt-200.h5: file checksum mismatch"
fi

case_begin "an attribute edited with h5py (training_position): verify fails"
cp "$TEST_TMP/good-300.h5" "$TEST_TMP/edited.h5"
"$PY_H5" -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); f.attrs["training_position"] = "{\"epoch\": 7}"' \
  "$TEST_TMP/edited.h5" || fail "h5py could not edit the attribute"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/edited.h5"
expect_rc 1
# (h5py stores the new string at the end of the file: the size check notices first.)
grep -qE "edited\.h5: FAILED: (file checksum mismatch.*outside the datasets' data|the file has [0-9]+ bytes, its integrity block says [0-9]+ \(extended after it was written\))" "$OUT" \
  || fail "the edit is not reported as damage outside the data or as a grown file"

case_begin "a version 1 file (no integrity block): refused, then read and verified with --allow-unverified"
V1="$TEST_TMP/v1.h5"
"$PY_H5" - "$TEST_TMP/good-300.h5" "$V1" <<'EOF' || fail "could not write the version 1 file"
# Version 1 = version 2 without the user block and without metadata_checksum (FORMAT.md section 8).
import h5py, sys
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "w") as b:
    for k in a.attrs:
        if k != "metadata_checksum":
            b.attrs.create(k, a.attrs[k], dtype=a.attrs.get_id(k).dtype)
    b.attrs.create("format_version", 1, dtype="<i4")
    for group in ("variables", "slots"):
        a.copy(a[group], b, name=group)
EOF
head -c 8 "$V1" | od -An -c | grep -q 'H   D   F' || fail "the version 1 file does not start with the HDF5 signature"
run "$STRATA_BIN" ckpt verify "$V1"
expect_rc 1
expect_stdout_has "v1.h5: FAILED: format 1 file (no integrity block: its metadata and HDF5 structure cannot be verified); refused unless unverified files are allowed (--allow-unverified)"
run "$STRATA_BIN" ckpt verify --allow-unverified "$V1"
expect_rc 0
expect_stdout_has "v1.h5: OK (step 300, 7 dataset(s) verified, format 1: no file checksum)"
run "$STRATA_BIN" ckpt show --allow-unverified "$V1"
expect_rc 0
grep -qE '^format_version +1$' "$OUT" || fail "show does not say format_version 1"
run "$STRATA_BIN" ckpt diff --allow-unverified "$V1" "$TEST_TMP/good-300.h5"
expect_rc 0
[ "$(tail -1 "$OUT")" = identical ] || fail "the version 1 copy differs from its version 2 original"

case_begin "show/diff of the directory skip the corrupt latest"
run "$STRATA_BIN" ckpt show "$D"
expect_rc 0
grep -qE '^global_step +200$' "$OUT" || fail "show did not fall back to step 200"
run "$STRATA_BIN" ckpt diff "$D" "$D/ckpt-200.h5"
expect_rc 0
[ "$(tail -1 "$OUT")" = identical ] || fail "latest valid of D is not ckpt-200.h5"

case_begin "diff of a corrupt file against its good copy"
run "$STRATA_BIN" ckpt diff "$TEST_TMP/good-300.h5" "$D/ckpt-300.h5"
expect_rc 1
grep -qE '^variables/embedding/table: 1 of 16000 element\(s\) differ, .* first at \[15,10\]' "$OUT" \
  || fail "corrupt element not at [15,10] (byte 1001 = element 250)"

case_begin "truncated file"
head -c 20000 "$TEST_TMP/good-300.h5" > "$TEST_TMP/trunc.h5"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/trunc.h5"
expect_rc 1
expect_stdout_has "trunc.h5: FAILED"
run "$STRATA_BIN" ckpt show "$TEST_TMP/trunc.h5"
expect_rc 1; expect_one_stderr_line; expect_stderr_has "cannot read checkpoint"

case_begin "a committed file that went missing"
mv "$D/ckpt-100.h5" "$TEST_TMP/moved.h5"
run "$STRATA_BIN" ckpt verify "$D"
expect_rc 1
expect_stdout_has "$D/ckpt-100.h5: FAILED: file is missing"
run "$STRATA_BIN" ckpt ls "$D"
expect_rc 0
grep -qE '^100 +ckpt-100.h5 +- +MISSING' "$OUT" || fail "missing file not marked"

case_begin "not a checkpoint"
echo "hello" > "$TEST_TMP/text.h5"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/text.h5"
expect_rc 1
expect_stdout_has "text.h5: FAILED: not a strata checkpoint: it starts with neither a strata integrity block nor an HDF5 signature"
run "$STRATA_BIN" ckpt show "$TEST_TMP/text.h5"
expect_rc 1; expect_one_stderr_line; expect_stderr_has "cannot read checkpoint"
run "$STRATA_BIN" ckpt diff "$TEST_TMP/text.h5" "$TEST_TMP/np1"
expect_rc 1; expect_one_stderr_line
mkdir -p "$TEST_TMP/empty"
run "$STRATA_BIN" ckpt show "$TEST_TMP/empty"
expect_rc 1; expect_one_stderr_line; expect_stderr_has "no committed checkpoints"
run "$STRATA_BIN" ckpt ls "$TEST_TMP/empty"
expect_rc 0; expect_stdout_has "no committed checkpoints in"

case_begin "bad usage: one line, exit 2"
run "$STRATA_BIN" ckpt
expect_rc 2; expect_one_stderr_line
run "$STRATA_BIN" ckpt diff "$TEST_TMP/np1"
expect_rc 2; expect_one_stderr_line
run "$STRATA_BIN" ckpt diff --atol abc "$TEST_TMP/np1" "$TEST_TMP/np3"
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--atol: 'abc'"
run "$STRATA_BIN" ckpt diff --atol -1 "$TEST_TMP/np1" "$TEST_TMP/np3"
expect_rc 2; expect_one_stderr_line
run "$STRATA_BIN" ckpt ls "$TEST_TMP/nope"
expect_rc 2; expect_one_stderr_line; expect_stderr_has "nope' does not exist"
run "$STRATA_BIN" ckpt ls "$TEST_TMP/good-300.h5"
expect_rc 2; expect_one_stderr_line; expect_stderr_has "takes a checkpoint directory"
run "$STRATA_BIN" ckpt verify "$TEST_TMP/nope.h5"
expect_rc 2; expect_one_stderr_line
run "$STRATA_BIN" ckpt show --bogus "$D"
expect_rc 2; expect_one_stderr_line

finish
