#!/usr/bin/env bash
# dynamic_parallel_save_test.sh STRATA_BIN SPEC -- issue 22 item 4 between nodes: the PS ranks of a
# job write each dynamic-<step>.h5 together, each its own rows, with the two PS on different nodes
# (checkpoint/FORMAT.md 10.7, 10.9). SPEC: a spec with dynamic tables
# (examples/specs/criteo_dlrm_dynamic.json: 26).
#
# Run inside run_on_cluster.sh with 2 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 2 tests/cluster/dynamic_parallel_save_test.sh build/bin/strata \
#     examples/specs/criteo_dlrm_dynamic.json
#
# A sync job of 2 PS (rank 0 on cn1, rank 1 on cn2) and 2 workers saves every 4 steps (full, then
# deltas) into the cluster's shared directory. How many periodic saves a 16-step job makes depends
# on when the chief reads the global step (2 or 3 here), so the test asks for a full and a delta. Asserts: exit 0; the placement; every save says
# "2 PS"; every file is version 2 and every table has one non-empty run per PS (row_runs, 2 x 2)
# and the content checksum FORMAT.md 10.3's h5py recipe computes;
# `ckpt verify` of the directory passes; jobs of 1 PS (one node) and 3 PS (both nodes) restore the
# last save, save it again at once, and `ckpt diff` finds their tables equal to the parallel
# file's row for row, bit for bit (values, slots, stamps, update counts, sketch, clock: only the
# counters differ, which a restore onto several PS starts afresh and the final evaluation's lookups
# move); a byte flipped in the second PS's rows of a copy is found by `ckpt verify` (exit 1,
# naming the dataset). Every assertion prints PASS/FAIL; a failure dumps the job's output.
# Environment: STRATA_STEP_TIMEOUT (default 80 s) bounds each command; STRATA_KEEP_CLUSTER_DIR=1
# keeps the files (with run_on_cluster.sh's cluster directory).
set -uo pipefail

# shellcheck source=tests/cluster/dynamic_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/dynamic_test_lib.sh"
dynamic_test_init dynamic_parallel_save_test 2 dynpar "$@"

step data "$BIN" data synth-ctr --out "$work/all.tsv" --rows 3000 --vocab 50 --seed 5
if [[ $rc -eq 0 ]]; then pass "data: synth-ctr"; else fail "data: exit status $rc"; dump data; exit 1; fi
head -n 2500 "$work/all.tsv" > "$work/train.tsv"
tail -n 500 "$work/all.tsv" > "$work/eval.tsv"
# --stall-timeout 30: these jobs check saves and restores, not liveness (tests/fault and
# cluster.partition do), and share the 2 cores with the other cluster tests and the sanitizer
# builds; under that load a restore onto 3 PS has gone 10 s without a heartbeat reaching rank 0.
TRAIN=(train --model-spec "$SPEC" --data "csv:$work/train.tsv" --eval-data "csv:$work/eval.tsv" --consistency sync
       --global-batch 256 --epochs 2 --log-every 0 --log-every-secs 0 --stall-timeout 30)

# --map-by node: rank 0 (PS) on cn1, rank 1 (PS) on cn2, then the workers one per node.
STRATA_NUM_PS=2 STRATA_LOG_LEVEL=debug step save "$here/cluster_mpirun" "$D" --host cn1:2,cn2:2 --map-by node -np 4 \
  "$BIN" "${TRAIN[@]}" --checkpoint-dir "$work/a" --save-every-steps 4 --dynamic-full-every 2
if [[ $rc -eq 0 ]]; then pass "save: exit status 0"; else fail "save: exit status $rc"; dump save; exit 1; fi
cn1=$(awk '$2 == "cn1" {print $3}' "$D/nodes.txt") cn2=$(awk '$2 == "cn2" {print $3}' "$D/nodes.txt")
served=$(grep -o 'tcp transport: rank [0-9]* serves on [0-9.]*' "$work/save.err" | awk '{print $4 "@" $NF}' | sort -u | tr '\n' ' ')
if [[ -n $cn1 && -n $cn2 && $served == "0@$cn1 1@$cn2 2@$cn1 3@$cn2 " ]]; then
  pass "save: placement: PS rank 0 on cn1 ($cn1), PS rank 1 on cn2 ($cn2)"
else
  fail "save: placement: rank@address seen: '${served}' (cn1 $cn1, cn2 $cn2)"
fi
saves=$(grep -c 'saved dynamic tables .*, 2 PS)' "$work/save.out")
kinds=$(grep -o 'saved dynamic tables [^ ]* ([a-z]*' "$work/save.out" | awk -F'(' '{print $2}' | sort -u | tr '\n' ' ')
if [[ $saves -ge 2 && $kinds == "delta full " ]] && ! grep -q 'saved dynamic tables' <(grep -v ', 2 PS)' "$work/save.out"); then
  pass "save: $saves saves (full and delta), each written by 2 PS"
else
  fail "save: saves '$saves', kinds '$kinds'"; dump save
fi
LAST=$(grep -o 'saved dynamic tables [^ ]*dynamic-[0-9]*\.h5' "$work/save.out" | tail -n 1 | grep -o '[0-9]*\.h5$' | cut -d. -f1)

check=$(/usr/bin/python3 - "$work/a" "$here/../../checkpoint/FORMAT.md" <<'PY' 2>&1
import glob, h5py, re, sys, zlib
# FORMAT.md 10.3's recipe for the table text, run as written against version-2 files.
exec(re.search(r"# table text: begin\n(.*)# table text: end", open(sys.argv[2]).read(), re.S).group(1))
bad, files = [], sorted(glob.glob(sys.argv[1] + "/dynamic-*.h5"))
for path in files:
    with h5py.File(path, "r") as f:
        if int(f.attrs["dynamic_format_version"]) != 2:
            bad.append("%s: version %d" % (path, f.attrs["dynamic_format_version"]))
        for name, g in f["dynamic"].items():
            runs = g["row_runs"][:].tolist() if "row_runs" in g else None
            if runs is None or len(runs) != 2 or sum(r[0] for r in runs) != g["ids"].shape[0]:
                bad.append("%s %s: row_runs %s" % (path, name, runs))
            elif g.attrs["kind"] == "full" and min(r[0] for r in runs) == 0:
                bad.append("%s %s: a PS wrote no rows: %s" % (path, name, runs))
            if zlib.crc32(table_text(g)) != int(g.attrs["content_checksum"]):
                bad.append("%s %s: FORMAT.md's table text does not give the content checksum" % (path, name))
print("ok %d files" % len(files) if files and not bad else "bad: " + "; ".join(bad[:5]) + (" (no files)" if not files else ""))
PY
)
if [[ $check == ok* ]]; then pass "files: $check, version 2, one run per PS in every table, FORMAT.md's table text gives each content checksum"; else fail "files: $check"; fi

step verify "$BIN" ckpt verify "$work/a"
if [[ $rc -eq 0 ]]; then pass "ckpt verify: the directory verifies"; else fail "ckpt verify: exit status $rc"; dump verify; fi

# Restores onto 1 PS (one node) and 3 PS (both nodes), saved again at once (no step trained).
# The job onto 3 PS trains no step, so its ranks' first MPI messages between the nodes are those
# after the save, every pair connecting at once; under load Open MPI 4.1's TCP BTL has lost that
# race ("connect() ... failed: Operation now in progress (115)", then a peer "unexpectedly
# disconnected"). mpi_preconnect_mpi makes those connections in MPI_Init, one pair at a time.
for k in 1 3; do
  if [[ $k -eq 1 ]]; then hosts=(--host cn1:2 -np 2); else hosts=(--host cn1:2,cn2:2 -np 4 --mca mpi_preconnect_mpi 1); fi
  STRATA_NUM_PS=$k step "restore$k" "$here/cluster_mpirun" "$D" "${hosts[@]}" \
    "$BIN" "${TRAIN[@]}" --steps 0 --restore "$work/a" --checkpoint-dir "$work/b$k"
  if [[ $rc -eq 0 ]] && grep -q "saved dynamic tables .*dynamic-$LAST.h5 (full, .*, $k PS)" "$work/restore$k.out"; then
    pass "restore onto $k PS: saved step $LAST again"
  else
    fail "restore onto $k PS: exit status $rc"; dump "restore$k"; continue
  fi
  step "diff$k" "$BIN" ckpt diff "$work/a/dynamic-$LAST.h5" "$work/b$k/dynamic-$LAST.h5"
  other=$(grep -v -e '^A: ' -e '^B: ' -e ' counters differ$' -e '^[0-9]* differences$' -e '^identical' "$work/diff$k.out")
  if [[ -z $other ]] && grep -q ' counters differ$\|^identical' "$work/diff$k.out"; then
    pass "ckpt diff, parallel file vs $k PS's: every table's rows, sketch and clock equal (counters: $(grep -c 'counters differ' "$work/diff$k.out") tables)"
  else
    fail "ckpt diff, parallel file vs $k PS's: $(head -c 600 <<<"$other")"; dump "diff$k"
  fi
done

# A byte flipped in the second PS's run of one table's values, in a copy.
mkdir -p "$work/c"
cp "$work/a/dynamic-$LAST.h5" "$work/c/"
where=$(/usr/bin/python3 - "$work/c/dynamic-$LAST.h5" <<'PY' 2>&1
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    for name, g in f["dynamic"].items():
        runs = g["row_runs"][:]
        if runs[1][0] > 0:
            v = g["values"]
            print(v.id.get_offset() + int(runs[0][0]) * v.shape[1] * 4 + 1, "dynamic/%s/values" % name)
            break
PY
)
at=${where%% *} dataset=${where#* }
if [[ $at =~ ^[0-9]+$ ]]; then
  /usr/bin/python3 -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x20]))" "$work/c/dynamic-$LAST.h5" "$at"
  step flipped "$BIN" ckpt verify "$work/c/dynamic-$LAST.h5"
  if [[ $rc -eq 1 ]] && grep -q "$dataset" "$work/flipped.out" "$work/flipped.err"; then
    pass "ckpt verify: a byte flipped in PS 1's rows is found ($dataset)"
  else
    fail "ckpt verify of the flipped copy: exit status $rc"; dump flipped
  fi
else
  fail "flip: no offset: $where"
fi

dynamic_test_finish
