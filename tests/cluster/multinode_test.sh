#!/usr/bin/env bash
# multinode_test.sh STRATA_BIN PS_TESTS TRANSPORT_TESTS -- strata across 3 emulated nodes with the
# default transport (auto: shared memory within a node, TCP served by each rank between nodes).
#
# Run inside run_on_cluster.sh with 3 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 3 tests/cluster/multinode_test.sh build/bin/strata \
#     build/tests/strata_mpi_ps_tests build/tests/strata_mpi_transport_tests
#
# Cases:
#   transport_np{3,4,5}  the transport tests (tcp and ucx; mpi has no window between these nodes,
#                        see forced_mpi) with the ranks spread over the 3 nodes.
#   ps_np{3,4,5}         the PS tests spread over the nodes: sync results are compared bit for bit
#                        with the single-process reference, i.e. equal to the single-node run.
#   train_async, train_sync  strata train, 1 PS + 2 workers, one per node, 2 epochs: exit 0, the
#                        transport line says tcp over 3 nodes and why (the MPI probe), accuracy in
#                        the single-node band (>= 0.82 after 2 epochs; 0.84-0.85 measured).
#   bench_{pull,push,update}  strata bench between cn1 (PS) and cn2 (worker): 0 wrong, and the rows
#                        carry link and vs_link (the raw TCP baseline of the same run).
#   ckpt_two_nodes       2 PS on cn1 and cn2 + 1 worker on cn3 save a checkpoint (parallel HDF5 from
#                        two nodes); `ckpt verify` passes; restored onto 1 PS (cn1) + the worker
#                        (cn3) with --steps 0 (saves it again), `ckpt diff` says identical.
#   spec_train, spec_resume  the shipped wide-and-deep JSON spec (hash buckets shrunk) on synth-ctr
#                        CSV: 1 PS + 2 workers + the evaluator over the 3 nodes, checkpoints, best/ by
#                        AUC; then resumed for a second epoch from the saved global step.
#   forced_mpi           --transport mpi between nodes: exit 2 and one line naming the cause
#                        (MPI_Win_allocate) and the fix (--transport auto or tcp).
# Every assertion prints PASS/FAIL; a failing case dumps its output.
# Environment: STRATA_STEP_TIMEOUT (default 120 s) bounds each command.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

[[ $# -eq 3 ]] || { echo "usage: multinode_test.sh STRATA_BIN PS_TESTS TRANSPORT_TESTS" >&2; exit 2; }
abs() { echo "$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"; }
BIN=$(abs "$1") PS_TESTS=$(abs "$2") TRANSPORT_TESTS=$(abs "$3")
for b in "$BIN" "$PS_TESTS" "$TRANSPORT_TESTS"; do
  [[ -x $b ]] || { echo "FAIL: not executable: $b" >&2; exit 1; }
done
[[ -n ${STRATA_CLUSTER_DIR:-} ]] || { echo "multinode_test: STRATA_CLUSTER_DIR is not set; run under tests/cluster/run_on_cluster.sh 3" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
STEP_TIMEOUT=${STRATA_STEP_TIMEOUT:-120}
D=$STRATA_CLUSTER_DIR
# Every node sees the same file system (like a cluster's shared one): checkpoints go here.
work=$(mktemp -d "$D/multinode.XXXXXX")
trap 'rm -rf "$work"' EXIT

failed=0
case_failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); case_failed=1; }
dump() {
  [[ $case_failed -eq 1 ]] || return 0
  echo "---- $1: stdout (last 40 lines) ----"; tail -n 40 "$work/$1.out"
  echo "---- $1: stderr (last 40 lines) ----"; tail -n 40 "$work/$1.err"
  echo "---- end $1 ----"
}
# step NAME CMD...: runs CMD bounded by STEP_TIMEOUT; status in $rc.
step() {
  local name=$1
  shift
  echo "== $name: $*"
  case_failed=0
  timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  [[ $rc -ne 124 && $rc -ne 137 ]] || fail "$name: timed out after $STEP_TIMEOUT s"
}
expect_rc() { if [[ $rc -eq $2 ]]; then pass "$1: exit status $2"; else fail "$1: exit status $rc, expected $2"; fi; }
json_field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
M=("$here/cluster_mpirun" "$D")   # timeout runs programs, not shell functions

# ---- the transport and PS tests spread over the nodes ------------------------------------------
declare -A hosts=([3]=cn1,cn2,cn3 [4]=cn1:2,cn2,cn3 [5]=cn1:2,cn2:2,cn3)
for np in 3 4 5; do
  # --transport mpi has no one-sided component between these nodes (forced_mpi below): its
  # parameterised cases are left out; every other test runs on the default transport.
  step "transport_np$np" "${M[@]}" --host "${hosts[$np]}" -np "$np" "$TRANSPORT_TESTS" --gtest_filter='-*/mpi:*_mpi' 
  expect_rc "transport_np$np" 0
  dump "transport_np$np"
  step "ps_np$np" "${M[@]}" --host "${hosts[$np]}" -np "$np" "$PS_TESTS" --gtest_filter='-*/mpi:*_mpi' 
  expect_rc "ps_np$np" 0
  if grep -q 'SyncOptimizer.MatchesSingleProcessReferenceBitForBit/adam_tcp' "$work/ps_np$np.out"; then
    pass "ps_np$np: the sync bit-for-bit tests ran over tcp"
  else
    fail "ps_np$np: the sync bit-for-bit tests over tcp did not run"
  fi
  dump "ps_np$np"
done

# ---- training, one rank per node ---------------------------------------------------------------
for mode in async sync; do
  name=train_$mode
  STRATA_NUM_PS=1 step "$name" "${M[@]}" --host cn1,cn2,cn3 -np 3 "$BIN" train --epochs 2 --consistency "$mode"
  expect_rc "$name" 0
  line=$(grep -m1 '^strata train: transport' "$work/$name.out")
  if [[ $line == *"transport tcp"*"3 node(s)"*"auto: 3 nodes"* ]]; then pass "$name: transport line: tcp over 3 nodes, chosen by auto"
  else fail "$name: transport line is '${line:-missing}'"; fi
  summary=$(tail -n 1 "$work/$name.out")
  acc=$(json_field "$summary" test_accuracy 2>/dev/null || echo 0)
  if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.82 else 1)"; then
    pass "$name: test accuracy $acc >= 0.82"
  else
    fail "$name: test accuracy $acc < 0.82"
  fi
  dump "$name"
done

# ---- benchmarks between two nodes --------------------------------------------------------------
for op in pull push update; do
  name=bench_$op
  args=(-b 1M -e 1M -n 5)
  [[ $op == update ]] && args=(-b 4M -e 4M -n 3)
  STRATA_NUM_PS=1 step "$name" "${M[@]}" --host cn1,cn2 -np 2 "$BIN" bench --op "$op" "${args[@]}"
  expect_rc "$name" 0
  if grep -Eq '^# (all results correct|every update applied exactly once)' "$work/$name.out"; then
    pass "$name: every result correct"
  else
    fail "$name: results not reported correct"
  fi
  if grep -q 'vs_link' "$work/$name.out"; then pass "$name: rows carry vs_link"; else fail "$name: no vs_link column"; fi
  grep -E '^ +[0-9]+ ' "$work/$name.out" | sed 's/^/    /'
  dump "$name"
done

# ---- checkpoints written from two nodes, restored onto another PS count ------------------------
ck=$work/ckpt
STRATA_NUM_PS=2 step ckpt_save "${M[@]}" --host cn1,cn2,cn3 -np 3 "$BIN" train --epochs 1 --checkpoint-dir "$ck"
expect_rc ckpt_save 0
if grep -q 'checkpoint: saved' "$work/ckpt_save.out"; then pass "ckpt_save: a checkpoint was saved"; else fail "ckpt_save: no 'checkpoint: saved' line"; fi
dump ckpt_save
step ckpt_verify "$BIN" ckpt verify "$ck"
expect_rc ckpt_verify 0
dump ckpt_verify
STRATA_NUM_PS=1 step ckpt_reshard "${M[@]}" --host cn1,cn3 -np 2 "$BIN" train --restore "$ck" --steps 0 \
  --checkpoint-dir "$work/ckpt1"
expect_rc ckpt_reshard 0
dump ckpt_reshard
step ckpt_diff "$BIN" ckpt diff "$ck" "$work/ckpt1"
expect_rc ckpt_diff 0
if grep -qi 'identical' "$work/ckpt_diff.out"; then pass "ckpt_diff: values identical after 2 PS on 2 nodes -> 1 PS"
else fail "ckpt_diff: not reported identical"; fi
dump ckpt_diff

# ---- a user's wide-and-deep JSON spec over CSV, across the nodes ---------------------------------
# The shipped Criteo spec (its hash buckets shrunk so that checkpoints stay small) on synth-ctr data
# in the shared file system: 1 PS, 2 workers and the evaluator over the 3 nodes, checkpoints kept
# by AUC, then a resume for a second epoch.
spec=$work/wd.json
sed 's/"hash_bucket_size": 100000/"hash_bucket_size": 1000/g' "$here/../../examples/specs/criteo_wide_deep.json" > "$spec"
step spec_data "$BIN" data synth-ctr --out "$work/ctr.tsv" --rows 24000 --vocab 50 --seed 3
expect_rc spec_data 0
head -n 20000 "$work/ctr.tsv" > "$work/ctr_train.tsv"
tail -n 4000 "$work/ctr.tsv" > "$work/ctr_eval.tsv"
spec_args=(train --jobs ps=1,worker=2,evaluator=1 --model-spec "$spec" --data "csv:$work/ctr_train.tsv"
  --eval-data "csv:$work/ctr_eval.tsv" --checkpoint-dir "$work/ckspec" --save-every-steps 40 --eval-best-metric auc
  --log-every 0 --log-every-secs 0)
step spec_train "${M[@]}" --host cn1:2,cn2,cn3 -np 4 "$BIN" "${spec_args[@]}" --epochs 1
expect_rc spec_train 0
summary=$(grep -E '^\{.*"global_step"' "$work/spec_train.out" | tail -n 1)
step1=$(json_field "$summary" global_step 2>/dev/null || echo 0)
auc=$(json_field "$summary" auc 2>/dev/null || echo 0)
if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$auc') > 0.6 else 1)"; then pass "spec_train: auc $auc > 0.6"
else fail "spec_train: auc $auc"; fi
if /usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$work/ckspec/eval.jsonl')]
best = json.load(open('$work/ckspec/best/best.json'))
sys.exit(0 if rows and all(r['auc'] > 0.5 for r in rows) and best['metric'] == 'auc' else 1)"; then
  pass "spec_train: the evaluator wrote eval.jsonl rows with auc and kept best/ by auc"
else
  fail "spec_train: eval.jsonl or best/best.json lacks the auc"
fi
dump spec_train
step spec_resume "${M[@]}" --host cn1:2,cn2,cn3 -np 4 "$BIN" "${spec_args[@]}" --epochs 2 --restore latest
expect_rc spec_resume 0
if grep -q "checkpoint: restored .*(global step $step1)" "$work/spec_resume.out"; then pass "spec_resume: restored global step $step1"
else fail "spec_resume: no 'restored ... (global step $step1)' line"; fi
step2=$(json_field "$(grep -E '^\{.*"global_step"' "$work/spec_resume.out" | tail -n 1)" global_step 2>/dev/null || echo 0)
if [[ $step2 -gt $step1 ]]; then pass "spec_resume: global step $step1 -> $step2"; else fail "spec_resume: global step $step2 after $step1"; fi
dump spec_resume

# ---- a forced transport that cannot work -------------------------------------------------------
STRATA_NUM_PS=1 step forced_mpi "${M[@]}" --host cn1,cn2 -np 2 "$BIN" train --epochs 1 --transport mpi
expect_rc forced_mpi 2
errs=$(grep -c 'error' "$work/forced_mpi.err" || true)
if grep -q 'MPI_Win_allocate' "$work/forced_mpi.err" && grep -q -- '--transport auto' "$work/forced_mpi.err"; then
  pass "forced_mpi: the line names MPI_Win_allocate and --transport auto"
else
  fail "forced_mpi: the error does not name the cause and the fix"
fi
if [[ $errs -eq 1 ]]; then pass "forced_mpi: one error line"; else fail "forced_mpi: $errs error lines, expected 1"; fi
dump forced_mpi

echo
if [[ $failed -eq 0 ]]; then echo "multinode_test: all assertions passed"; exit 0; fi
echo "multinode_test: $failed assertion(s) failed"
exit 1
