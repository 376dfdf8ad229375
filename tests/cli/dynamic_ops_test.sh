#!/usr/bin/env bash
# Dynamic tables in a job's checkpoint directory over time (issue 22, FORMAT.md 10.8):
#  - retention: with --max-to-keep 2 and --dynamic-full-every 3, after many saves the directory
#    holds exactly the dynamic-<step>.h5 files the two kept steps need (each kept step's file and
#    every link of its chain down to its full base), `ckpt verify` passes, and the oldest kept
#    step restores bit-equal to the same sync job run keeping everything (`ckpt diff`);
#  - the evaluator task with dynamic tables: its metrics on the final checkpoint equal the chief's
#    summary for the same step, best/ holds the tables' chain, and a checkpoint whose tables are
#    damaged is one line and a skip, never a crash.
source "$(dirname "$0")/lib.sh"

QUIET=(--log-every 0 --log-every-secs 0)
D=$TEST_TMP
SPEC="$(dirname "$0")/../../examples/specs/criteo_dlrm_dynamic.json"

case_begin "synth-ctr data"
run "$STRATA_BIN" data synth-ctr --out "$D/all.tsv" --rows 5000 --vocab 50 --seed 5
expect_rc 0
head -n 4000 "$D/all.tsv" > "$D/train.tsv"
tail -n 1000 "$D/all.tsv" > "$D/eval.tsv"
# Admission on (ids become rows at their second sighting), so every delta also carries the
# admission sketch's changed counters (sketch_cells) and the restores below check them too.
python3 - "$SPEC" "$D/admit.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
for c in spec["feature_columns"]:
    if c.get("for_keys") == "C1..C26":
        c["categorical"]["admit_after"] = 2
json.dump(spec, open(sys.argv[2], "w"))
PY
TRAIN=(train --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" --consistency sync
       --global-batch 256 "${QUIET[@]}")

case_begin "--max-to-keep 2 --dynamic-full-every 3: exactly the files the kept steps need"
mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --model-spec "$D/admit.json" --epochs 3 --checkpoint-dir "$D/keep2" --save-every-steps 3 --max-to-keep 2 \
  --dynamic-full-every 3
expect_rc 0
cp "$OUT" "$D/keep2.out"
CHECK=$(python3 - "$D/keep2" "$D/keep2.out" <<'PY' 2>&1
import json, os, re, sys
d, out = sys.argv[1], sys.argv[2]
# Every save of the job, in order, with its kind, as PS 0 reported it.
saves = [(int(m.group(1)), m.group(2)) for m in
         re.finditer(r"saved dynamic tables \S*dynamic-(\d+)\.h5 \((full|delta),", open(out).read())]
assert len(saves) >= 7, ("too few saves to exercise retention", saves)
kinds = [k for _, k in saves]
assert kinds == ["full" if i % 3 == 0 else "delta" for i in range(len(kinds))], kinds
kept = [e["global_step"] for e in json.load(open(os.path.join(d, "checkpoint.json")))["checkpoints"]]
assert kept == [s for s, _ in saves[-2:]], (kept, saves)
need = set()
for k in kept:
    i = [s for s, _ in saves].index(k)
    while True:
        need.add(saves[i][0])
        if saves[i][1] == "full":
            break
        i -= 1
# The oldest kept step is a delta here, so its base (a step no longer kept) must stay too.
assert len(need) > len(kept), ("the kept steps' chains reach no further back than themselves", saves)
have = sorted(int(f[8:-3]) for f in os.listdir(d) if re.fullmatch(r"dynamic-\d+\.h5", f))
assert have == sorted(need), ("files", have, "needed", sorted(need), "saves", saves)
dense = sorted(int(f[5:-3]) for f in os.listdir(d) if re.fullmatch(r"ckpt-\d+\.h5", f))
assert dense == kept, (dense, kept)
# The deltas carry the admission sketch's changed counters, not the whole sketch (26 tables x
# 4 x 65536 counters of 2 bytes: 13 MiB in every full file).
mib = {(int(m.group(1)), m.group(2)): float(m.group(3)) for m in
       re.finditer(r"saved dynamic tables \S*dynamic-(\d+)\.h5 \((full|delta), \d+ of \d+ rows, ([0-9.]+) MiB", open(out).read())}
full_mib = min(v for (s, k), v in mib.items() if k == "full")
delta_mib = max(v for (s, k), v in mib.items() if k == "delta")
assert full_mib > 13 and delta_mib < full_mib / 10, (full_mib, delta_mib)
print("ok", min(kept), len(saves), have)
PY
)
[ "${CHECK%% *}" = ok ] || fail "retention: $CHECK"
OLDEST=$(echo "$CHECK" | cut -d' ' -f2)
echo "  $CHECK"
run "$STRATA_BIN" ckpt verify "$D/keep2"
expect_rc 0

case_begin "the oldest kept step restores bit-equal to the same job keeping every file"
mpi 2 "$STRATA_BIN" "${TRAIN[@]}" --model-spec "$D/admit.json" --epochs 3 --checkpoint-dir "$D/all" --save-every-steps 3 --max-to-keep 0 \
  --dynamic-full-every 3
expect_rc 0
[ "$(ls "$D/all"/dynamic-*.h5 | wc -l)" -gt "$(ls "$D/keep2"/dynamic-*.h5 | wc -l)" ] || fail "max-to-keep 0 kept no more files"
run "$STRATA_BIN" ckpt diff "$D/keep2/dynamic-$OLDEST.h5" "$D/all/dynamic-$OLDEST.h5"
expect_rc 0
run "$STRATA_BIN" ckpt diff "$D/keep2/ckpt-$OLDEST.h5" "$D/all/ckpt-$OLDEST.h5"
expect_rc 0

case_begin "strata ckpt prune: what a crash between the pointer and the deletions leaves, removed"
before=$(ls "$D/keep2" | grep -c '^dynamic-')
FIRST=$(ls "$D/all" | sed -n 's/^dynamic-\([0-9]*\)\.h5$/\1/p' | sort -n | head -n1)
cp "$D/all/dynamic-$FIRST.h5" "$D/keep2/"
run "$STRATA_BIN" ckpt prune "$D/keep2"
expect_rc 0
expect_stdout_has "removed $D/keep2/dynamic-$FIRST.h5"
[ "$(ls "$D/keep2" | grep -c '^dynamic-')" = "$before" ] || fail "prune left $(ls "$D/keep2")"
run "$STRATA_BIN" ckpt prune "$D/keep2"
expect_rc 0
expect_stdout_has "0 dynamic file(s) removed"
run "$STRATA_BIN" ckpt verify "$D/keep2"
expect_rc 0

case_begin "a preserved (keep_every_n_hours) delta is compacted once nothing newer links through it"
# The keep-everything run's directory, with a pointer that keeps the newest two steps and preserves
# the second save (a delta of the first).
cp -r "$D/all" "$D/pres"
python3 - "$D/pres" > "$D/pres.txt" <<'PY'
import json, os, sys
d = sys.argv[1]
p = json.load(open(os.path.join(d, "checkpoint.json")))
entries = p["checkpoints"]
keep = [dict(entries[1], preserved=True)] + entries[-2:]
for e in entries:
    if e not in entries[-2:] and e is not entries[1]:
        os.remove(os.path.join(d, e["file"]))
p["checkpoints"] = keep
json.dump(p, open(os.path.join(d, "checkpoint.json"), "w"))
print(entries[1]["global_step"])
PY
PRES=$(cat "$D/pres.txt")
run "$STRATA_BIN" ckpt prune "$D/pres"
expect_rc 0
expect_stdout_has "compacted $D/pres/dynamic-$PRES.h5 (preserved)"
CHECK=$(python3 - "$D/pres" "$D/keep2" "$PRES" <<'PY' 2>&1
import os, re, sys
pres, keep2, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
have = sorted(int(f[8:-3]) for f in os.listdir(pres) if re.fullmatch(r"dynamic-\d+\.h5", f))
newest = sorted(int(f[8:-3]) for f in os.listdir(keep2) if re.fullmatch(r"dynamic-\d+\.h5", f))
assert have == sorted([step] + newest), (have, step, newest)
print("ok")
PY
)
[ "$CHECK" = ok ] || fail "after the compaction: $CHECK"
run "$STRATA_BIN" ckpt diff "$D/pres/dynamic-$PRES.h5" "$D/all/dynamic-$PRES.h5"
expect_rc 0
run "$STRATA_BIN" ckpt verify "$D/pres"
expect_rc 0

case_begin "the evaluator task with dynamic tables: the final checkpoint's metrics equal the chief's"
E="$D/eval_run"
mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --model-spec "$SPEC" --epochs 2 --jobs ps=1,worker=1,evaluator=1 --checkpoint-dir "$E" --eval-best-metric auc
expect_rc 0
cp "$OUT" "$D/eval_run.out"
CHECK=$(python3 - "$E" "$D/eval_run.out" <<'PY' 2>&1
import json, os, re, sys
d, out = sys.argv[1], sys.argv[2]
summary = [json.loads(l) for l in open(out) if l.startswith("{") and '"global_step"' in l][-1]
rows = [json.loads(l) for l in open(os.path.join(d, "eval.jsonl"))]
last = rows[-1]
assert last["global_step"] == summary["global_step"], (last, summary["global_step"])
# The same weights, the same table rows (absent ones read as zeros on both sides), the same code.
assert last["auc"] == summary["auc"], (last["auc"], summary["auc"])
assert last["loss"] == summary["test_loss"], (last["loss"], summary["test_loss"])
best = json.load(open(os.path.join(d, "best", "best.json")))
files = sorted(os.listdir(os.path.join(d, "best")))
assert best["checkpoint"] in files and any(f.startswith("dynamic-") for f in files), files
print("ok", best["global_step"])
PY
)
[ "${CHECK%% *}" = ok ] || fail "evaluator: $CHECK"
BEST=$(echo "$CHECK" | cut -d' ' -f2)
echo "  final auc $(summary_get 'j["auc"]'), best step $BEST"
# best/ alone restores the tables of its step.
run "$STRATA_BIN" ckpt diff "$E/best/dynamic-$BEST.h5" "$E/dynamic-$BEST.h5"
expect_rc 0

case_begin "a checkpoint whose dynamic tables are damaged: the evaluator says so in one line and skips it"
# A second job restores from the first run's final checkpoint (intact) and writes into a copy of that
# directory in which the newest tables file is damaged; its evaluator finds that checkpoint first.
B="$D/damaged"
cp -r "$E" "$B"
rm -rf "$B/eval.jsonl" "$B/best"
FINAL=$(python3 -c "import json; print(json.load(open('$B/checkpoint.json'))['checkpoints'][-1]['global_step'])")
python3 - "$B/dynamic-$FINAL.h5" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(0, 2)
    n = f.tell()
    f.seek(n // 2)
    b = f.read(1)
    f.seek(n // 2)
    f.write(bytes([b[0] ^ 0x5A]))
PY
# Saves held open 2 s (test hook) so that the evaluator's first look sees the damaged step first.
run env STRATA_TEST_SAVE_DELAY_S=2 "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" -np 3 "$STRATA_BIN" "${TRAIN[@]}" \
  --model-spec "$SPEC" --epochs 3 --jobs ps=1,worker=1,evaluator=1 --checkpoint-dir "$B" --restore "$E/ckpt-$FINAL.h5"
expect_rc 0
expect_stdout_has "eval: WARNING: cannot evaluate ckpt-$FINAL.h5: dynamic variable"
[ "$(grep -c "cannot evaluate ckpt-$FINAL.h5" "$OUT")" = 1 ] || fail "expected one line for the damaged checkpoint"
echo "  $(grep "cannot evaluate ckpt-$FINAL.h5" "$OUT" | cut -c1-220)..."
LAST=$(tail -n1 "$B/eval.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['global_step'])")
[ "$LAST" = "$(summary_get 'j["global_step"]')" ] || fail "the final checkpoint was not evaluated: $LAST"
python3 -c "import json,sys; sys.exit(any(json.loads(l)['global_step'] == $FINAL for l in open('$B/eval.jsonl')))" ||
  fail "the damaged step was evaluated"

finish
