#!/usr/bin/env bash
# strata bench end to end under mpirun at small sizes: every op verifies its results, the table and
# JSON have the contract's columns, gating on STRATA_BENCH_MIN_BW works, bad flags exit 2.
# (Speed is measured by running the bench itself, never asserted here.)
source "$(dirname "$0")/lib.sh"

for op in pull push pushpull; do
  case_begin "$op, 1 PS + 2 workers"
  mpi 3 "$STRATA_BIN" bench --op "$op" -b 4K -e 256K -f 8 -w 2 -n 3 --json "$TEST_TMP/$op.json"
  expect_rc 0
  expect_stdout_has "# strata bench: op $op, transport mpi, 1 PS + 2 worker(s)"
  expect_stdout_has "# all results correct"
  head -4 "$OUT" | grep -qE 'size +count +dtype +time_us +algbw +#wrong' || fail "header lacks the contract columns"
  rows=$(python3 -c "import json; r=json.load(open('$TEST_TMP/$op.json'))['rows']; print(len(r), sum(x['wrong'] for x in r), r[0]['op'], r[0]['workers'], sorted(r[0].keys())[:3])")
  [ "$rows" = "3 0 $op 2 ['algbw_GBps', 'busbw_GBps', 'bytes']" ] || fail "json rows: $rows"
done

case_begin "sparse rows, 2 PS + 2 workers"
mpi 4 "$STRATA_BIN" bench --op sparse -b 512 --rows 64K --num-ps 2 -w 1 -n 2
expect_rc 0
expect_stdout_has "512 random rows of 64 floats from a 65536-row table"
expect_stdout_has "# all results correct"

case_begin "STRATA_BENCH_MIN_BW gates the exit status"
mpi 2 env STRATA_BENCH_MIN_BW=1000000 "$STRATA_BIN" bench -b 4K -e 4K -n 2
expect_rc_nonzero
expect_stdout_has "below STRATA_BENCH_MIN_BW"

case_begin "checkpoint save/restore against dd, 2 ranks"
CB="$TEST_TMP/ckpt-bench"
mkdir -p "$CB"   # an existing directory: kept, emptied of what the bench wrote
mpi 2 "$STRATA_BIN" bench --op checkpoint -b 2M -e 4M -f 2 -w 0 -n 2 --dir "$CB" --json "$TEST_TMP/ckpt.json"
expect_rc 0
expect_stdout_has "# all results correct"
grep -qE 'size +ranks +save_s +save_MB/s +dd_MB/s +ratio +restore_s +rest_MB/s +verify_s +#wrong' "$OUT" || fail "checkpoint table header lacks the contract columns"
grep -qE '^ +2097152 +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +0$' "$OUT" || fail "no 2 MiB row with #wrong 0"
python3 - "$TEST_TMP/ckpt.json" > "$TEST_TMP/ckpt.check" 2>&1 <<'PY' || fail "JSON: $(tail -3 "$TEST_TMP/ckpt.check")"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["bytes"] for r in rows] == [2 << 20, 4 << 20], rows
for r in rows:
    assert r["op"] == "checkpoint" and r["ranks"] == 2 and r["wrong"] == 0 and r["bad_checksums"] == 0, r
    assert r["save_MBps"] > 0 and r["dd_MBps"] > 0 and r["restore_MBps"] > 0, r
    assert abs(r["save_MBps"] - r["bytes"] / r["save_s"] / 1e6) < 1e-6 * r["save_MBps"], r
    assert len(r["save_s_each"]) == 2 and len(r["dd_MBps_each"]) == 2, r
    assert abs(r["ratio"] - r["save_MBps"] / r["dd_MBps"]) < 1e-6 * r["ratio"], r
    assert abs(r["restore_MBps"] - r["bytes"] / r["restore_s"] / 1e6) < 1e-6 * r["restore_MBps"], r
PY
# Its files are gone; a directory the bench creates itself is removed too (case below).
[ -d "$CB" ] && [ -z "$(ls -A "$CB")" ] || fail "left files behind: $(ls -A "$CB" 2>&1 | tr '\n' ' ')"

mpi 2 "$STRATA_BIN" bench --op checkpoint -b 1M -w 0 -n 1 --dir "$TEST_TMP/made-by-bench"
expect_rc 0
[ ! -e "$TEST_TMP/made-by-bench" ] || fail "the directory the bench created was left behind"

case_begin "checkpoint bench: bad input"
mpi 2 "$STRATA_BIN" bench --op checkpoint -b 2M --dir /proc/strata-no-such-dir
expect_rc 2
[ "$(grep -c 'strata bench: error' "$ERR")" = 1 ] || fail "expected one error line"
expect_stderr_has "cannot create the directory"
mkdir -p "$TEST_TMP/tmpdir"
mpi 2 env TMPDIR="$TEST_TMP/tmpdir" "$STRATA_BIN" bench --op checkpoint -b 2M -e 1000G
expect_rc 2
expect_stderr_has "MiB of memory"
[ -z "$(ls -A "$TEST_TMP/tmpdir")" ] || fail "bad input left a directory behind: $(ls -A "$TEST_TMP/tmpdir")"
run "$STRATA_BIN" bench --op checkpoint -b 2M --num-ps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "do not apply"

case_begin "apply: the PS optimizer rate, one thread against the team, bit-checked"
run "$STRATA_BIN" bench --op apply -b 512K -e 2M -f 4 -w 1 -n 2 --ps-threads 3 --json "$TEST_TMP/apply.json"
expect_rc 0
expect_stdout_has "# strata bench: op apply, optimizer adam, 1 thread vs 3 (--ps-threads)"
expect_stdout_has "# all results correct"
grep -qE 'size +count +1t_us +1t_Melem +Nt_us +Nt_Melem +state_GBps +speedup +#wrong' "$OUT" || fail "apply header"
python3 - "$TEST_TMP/apply.json" <<'PY' || fail "apply JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["bytes"] for r in rows] == [512 << 10, 2 << 20], rows
assert all(r["wrong"] == 0 and r["threads"] == 3 and r["melem_per_s"] > 0 for r in rows), rows
PY
run "$STRATA_BIN" bench --op apply --optimizer sgd
expect_rc 2; expect_one_stderr_line; expect_stderr_has "sgd pushes are MPI accumulates"
run "$STRATA_BIN" bench --op apply --num-ps 2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "runs in one process"
run "$STRATA_BIN" bench --op apply -e 1000G
expect_rc 2; expect_one_stderr_line; expect_stderr_has "MiB of memory for --op apply"
run "$STRATA_BIN" bench --op pull --ps-threads 2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "apply to --op apply, update and dynamic only"

case_begin "step: forward + backward of each built-in model against its products and a double reference"
for model in mlp softmax wide_deep; do
  run "$STRATA_BIN" bench --op step --model "$model" --batch 32 -w 1 -n 2 --json "$TEST_TMP/step_$model.json"
  expect_rc 0
  expect_stdout_has "# strata bench: op step, $model"
  expect_stdout_has "# all results correct"
  grep -qE 'backend +library +time_us +gflops +gemm_us +gemm_gflops +vs_gemm +vs_best +#wrong' "$OUT" || fail "step header"
  python3 - "$TEST_TMP/step_$model.json" "$model" <<'PY' || fail "step JSON ($model)"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert rows and rows[0]["backend"] == "eigen", rows
for r in rows:
    assert r["model"] == sys.argv[2] and r["batch"] == 32 and r["wrong"] == 0, r
    assert r["time_us"] > 0 and r["gflops"] > 0 and r["vs_gemm"] > 0 and r["flop_per_step"] > 0, r
# The MLP needs no input gradient for its first layer: 3 forward products, 3 weight gradients,
# 2 input gradients, 2 * 32 * (784*256 + 256*128 + 128*10) * 2 + 2 * 32 * (256*128 + 128*10) FLOPs.
if sys.argv[2] == "mlp":
    assert rows[0]["products"] == 8, rows[0]
    assert rows[0]["flop_per_step"] == 2 * 32 * (784*256 + 256*128 + 128*10) * 2 + 2 * 32 * (256*128 + 128*10), rows[0]
PY
done
run env STRATA_GEMM=eigen "$STRATA_BIN" bench --op step --model softmax -w 0 -n 1
expect_rc 0; expect_stdout_has "# training uses: eigen"
run env STRATA_GEMM=mkl "$STRATA_BIN" bench --op step -n 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_GEMM: 'mkl' is not one of"
# BLIS 0.9.0 aborts the process on its first call whenever BLIS_ARCH_TYPE is set: strata never
# calls it then (auto falls back to OpenBLAS's AVX-512 kernels where it chose them, else Eigen, with
# a warning; asking for BLIS is a one-line error).
if "$STRATA_BIN" bench --op step --model softmax -w 0 -n 1 | grep -q "^blis "; then
  run env BLIS_ARCH_TYPE=3 "$STRATA_BIN" bench --op step --model softmax -w 0 -n 1
  expect_rc 0; expect_stderr_has "BLIS_ARCH_TYPE is set ('3')"
  grep -qE "^# training uses: (eigen|openblas [^ ]+ \((SkylakeX|Cooperlake|SapphireRapids)\))" "$OUT" ||
    fail "BLIS_ARCH_TYPE set: training should use Eigen or OpenBLAS's AVX-512 kernels"
  # The machine's pin to OpenBLAS's AVX2 kernels (this repository's VMs set it) leaves Eigen.
  run env BLIS_ARCH_TYPE=3 OPENBLAS_CORETYPE=Haswell "$STRATA_BIN" bench --op step --model softmax -w 0 -n 1
  expect_rc 0; expect_stdout_has "# training uses: eigen"
  run env BLIS_ARCH_TYPE=zen3 STRATA_GEMM=blis "$STRATA_BIN" bench --op step --model softmax -w 0 -n 1
  expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_GEMM=blis: BLIS_ARCH_TYPE is set ('zen3')"
  run env STRATA_GEMM=blis "$STRATA_BIN" bench --op step --model softmax -w 0 -n 1
  expect_rc 0; expect_stdout_has "# training uses: blis"
fi
run "$STRATA_BIN" bench --op step --model resnet
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--model: 'resnet' is not one of mlp, softmax, wide_deep"
run "$STRATA_BIN" bench --op step --batch 0
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--batch"
run "$STRATA_BIN" bench --op step -b 4K
expect_rc 2; expect_one_stderr_line; expect_stderr_has "only --model, --batch, -w, -n and --json apply"
run "$STRATA_BIN" bench --op pull --model mlp
expect_rc 2; expect_one_stderr_line; expect_stderr_has "apply to --op step only"

case_begin "link: the raw TCP baseline between PS 0 and worker 0"
mpi 2 "$STRATA_BIN" bench --op link -b 4K -e 64K -f 16 -n 5 --json "$TEST_TMP/link.json"
expect_rc 0
expect_stdout_has "# strata bench: op link (raw TCP request/response, blocking sockets, TCP_NODELAY), rank 0 serves rank 1 on the same node"
grep -qE 'size +pull_us +pull_GBps +push_us +push_GBps' "$OUT" || fail "link header"
python3 - "$TEST_TMP/link.json" <<'PY' || fail "link JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["bytes"] for r in rows] == [4096, 65536], rows
assert all(r["pull_us"] > 0 and r["push_us"] > 0 and r["remote"] is False for r in rows), rows
PY
mpi 1 "$STRATA_BIN" bench --op link
expect_rc 2; expect_stderr_has "leaves no worker"

case_begin "update: optimizer updates through the PS, each applied exactly once, tcp network path"
mpi 3 env STRATA_TCP_FORCE_REMOTE=1 "$STRATA_BIN" bench --op update --transport tcp -b 1M -e 4M -f 4 -w 1 -n 3 --json "$TEST_TMP/update.json"
expect_rc 0
expect_stdout_has "# strata bench: op update (push + optimizer applied on the PS + ack), optimizer adam, 1 PS + 2 worker(s)"
expect_stdout_has "# transport: tcp (3 node(s)"
expect_stdout_has "# every update applied exactly once"
python3 - "$TEST_TMP/update.json" <<'PY' || fail "update JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["bytes"] for r in rows] == [1 << 20, 4 << 20], rows
assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["optimizer"] == "adam" for r in rows), rows
PY
mpi 2 "$STRATA_BIN" bench --op update --optimizer nesterov
expect_rc 2; expect_stderr_has "--optimizer: 'nesterov' is not one of"

case_begin "dynamic: the PS-side dynamic embedding table, every row checked"
run "$STRATA_BIN" bench --op dynamic --rows 16K -b 1K -w 1 -n 4 --optimizer adam --json "$TEST_TMP/dynamic.json"
expect_rc 0
expect_stdout_has "# strata bench: op dynamic (PS-side dynamic embedding table, one thread), 16-float rows, optimizer adam, 16384 ids"
expect_stdout_has "# all results correct"
grep -qE 'operation +ops +time_s +Mops_s +#wrong +bytes_per_row +vs_values' "$OUT" || fail "dynamic header"
python3 - "$TEST_TMP/dynamic.json" <<'PY' || fail "dynamic JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["operation"] for r in rows] == ["insert", "lookup", "update"], rows
assert [r["ops"] for r in rows] == [16384, 4096, 4096], rows
assert all(r["op"] == "dynamic" and r["wrong"] == 0 and r["ops_per_s"] > 0 for r in rows), rows
# Adam rows: 16 values + 2 slots = 192 bytes; the table's memory per row stays within 1.5x.
assert all(r["row_bytes"] == 192 and 192 < r["bytes_per_row"] <= 1.5 * 192 for r in rows), rows
PY

case_begin "dynamic on two threads (--ps-threads 2): batches split over the table's team, every row checked"
run "$STRATA_BIN" bench --op dynamic --rows 16K -b 8K -w 1 -n 4 --ps-threads 2 --json "$TEST_TMP/dynamic2.json"
expect_rc 0
expect_stdout_has "# strata bench: op dynamic (PS-side dynamic embedding table, 2 threads (--ps-threads)), 16-float rows"
expect_stdout_has "# all results correct"
python3 - "$TEST_TMP/dynamic2.json" <<'PY' || fail "dynamic --ps-threads JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["operation"] for r in rows] == ["insert", "lookup", "update"], rows
assert all(r["wrong"] == 0 and r["ps_threads"] == 2 and r["ops_per_s"] > 0 for r in rows), rows
PY

case_begin "dynamic under mpirun: the data plane by id (2 PS + 2 workers, tcp network path), every row checked"
mpi 4 env STRATA_TCP_FORCE_REMOTE=1 "$STRATA_BIN" bench --op dynamic --num-ps 2 --transport tcp --rows 16K -b 1K -w 1 -n 3 --json "$TEST_TMP/plane.json"
expect_rc 0
expect_stdout_has "# strata bench: op dynamic (data plane: lookups and updates by id), 2 PS + 2 worker(s), 16-float rows"
expect_stdout_has "# transport: tcp (4 node(s)"
expect_stdout_has "# all results correct"
python3 - "$TEST_TMP/plane.json" <<'PY' || fail "dynamic plane JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [r["operation"] for r in rows] == ["insert", "lookup", "update"], rows
assert all(r["plane"] is True and r["wrong"] == 0 and r["num_ps"] == 2 and r["workers"] == 2 for r in rows), rows
assert all(r["time_us"] > 0 and r["ops_per_s"] > 0 and 0 < r["distinct_per_call"] <= 1024 for r in rows), rows
# One host: no link was measured, so the rows carry none.
assert all(r["remote"] is False and "vs_link" not in r for r in rows), rows
assert all(r["ps_threads"] == 1 and r["ps_split_batches"] == 0 for r in rows), rows
PY
mpi 3 env STRATA_TCP_FORCE_REMOTE=1 "$STRATA_BIN" bench --op dynamic --num-ps 1 --transport tcp --rows 64K -b 16K -w 1 -n 3 --ps-threads 2 --json "$TEST_TMP/plane2.json"
expect_rc 0
expect_stdout_has "# all results correct"
python3 - "$TEST_TMP/plane2.json" <<'PY' || fail "dynamic plane --ps-threads JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
# One PS serving 16K-id batches of Zipf draws (over 4,096 distinct ids each) on two threads: it splits.
assert all(r["wrong"] == 0 and r["ps_threads"] == 2 and r["ps_split_batches"] > 0 for r in rows), rows
PY
run "$STRATA_BIN" bench --op dynamic --num-ps 2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--num-ps, --transport and --timeout apply under mpirun only"
run "$STRATA_BIN" bench --op dynamic --rows 0
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--rows: 0 is outside"
run "$STRATA_BIN" bench --op dynamic --rows 2G
expect_rc 2; expect_one_stderr_line; expect_stderr_has "outside [1, 2^31 - 1]"
run "$STRATA_BIN" bench --op dynamic --rows 1G --row-elems 4096
expect_rc 2; expect_one_stderr_line; expect_stderr_has "MiB of memory for --op dynamic"
run "$STRATA_BIN" bench --op dynamic --optimizer adam:beta1=2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "beta1"

case_begin "bad flags"
run "$STRATA_BIN" bench --op scatter
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--op: 'scatter'"
run "$STRATA_BIN" bench -b 3
expect_rc 2; expect_one_stderr_line; expect_stderr_has "multiples of 4 bytes"
run "$STRATA_BIN" bench -b 1M -e 4K
expect_rc 2; expect_one_stderr_line; expect_stderr_has "-e must not be smaller than -b"
run "$STRATA_BIN" bench -n zero
expect_rc 2; expect_one_stderr_line; expect_stderr_has "-n: 'zero' is not an integer"

finish
