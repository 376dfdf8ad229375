#!/usr/bin/env bash
# dynamic_data_plane_test.sh DYN_TESTS DYN_CKPT_TESTS -- issue 22's correctness targets between
# nodes: the dynamic-table MPI tests (tests/ranks/ps_dynamic_test.cc and
# ps_dynamic_checkpoint_test.cc) with the PS ranks on cn1 and the workers on cn2 (dyn_*), so that
# each lookup and update crosses the bridge.
#
# Run inside run_on_cluster.sh with 2 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 2 tests/cluster/dynamic_data_plane_test.sh \
#     build/tests/strata_mpi_ps_dynamic_tests build/tests/strata_mpi_ps_dynamic_checkpoint_tests
#
# Cases (the mpi transport has no window between these nodes, so its cases are left out; tcp and,
# where compiled, ucx run):
#   dyn_np3   1 PS (cn1) + 2 workers (cn2).
#   dyn_np4   2 PS (cn1) + 2 workers (cn2): sync rounds bit-equal to one table per PS fed the same
#             batches (with a capacity, steps crossing 2^32), async updates that lose none, a PS
#             that refuses requests of the wrong length (the tcp path between nodes takes requests
#             as messages), malformed words named by writer.
#   ckpt_np5  the dynamic checkpoint tests, ranks 0-1 on cn1 and 2-4 on cn2: the save by 2 PS (on
#             cn1) for 3 workers (on cn2), its incremental chain, and restores onto 1, 2 and 3 PS
#             (the restoring jobs' ranks span both nodes).
# Asserts exit 0 and that the named cases ran and passed (not skipped). Every assertion prints
# PASS/FAIL; a failing case dumps its output.
# Environment: STRATA_STEP_TIMEOUT (default 150 s) bounds each command.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

# shellcheck source=tests/cluster/dynamic_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/dynamic_test_lib.sh"
[[ $# -eq 2 ]] || { echo "usage: dynamic_data_plane_test.sh DYN_TESTS DYN_CKPT_TESTS" >&2; exit 2; }
DYN=$(dynamic_test_abs "$1") CKPT=$(dynamic_test_abs "$2")
for b in "$DYN" "$CKPT"; do
  [[ -x $b ]] || { echo "FAIL: not executable: $b" >&2; exit 1; }
done
STRATA_STEP_TIMEOUT=${STRATA_STEP_TIMEOUT:-150} dynamic_test_setup dynamic_data_plane_test 2 dynplane
M=("$here/cluster_mpirun" "$D")
# run NAME HOSTS NP BIN [FILTER]: the tests of BIN without their mpi cases (and FILTER's
# negative patterns); status in $rc.
run() {
  local name=$1 hosts=$2 np=$3 bin=$4 more=${5:-}
  echo "== $name: --host $hosts -np $np $(basename "$bin")"
  # Checkpoints go below $work, which every node sees (TMPDIR is node-local).
  (STRATA_TEST_SHARED_DIR=$work timeout --kill-after=10 "$STEP_TIMEOUT" "${M[@]}" -x STRATA_TEST_SHARED_DIR \
      --host "$hosts" -np "$np" "$bin" \
      --gtest_color=no --gtest_filter="-*/mpi:*_mpi$more") >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  if [[ $rc -eq 0 ]]; then pass "$name: exit status 0"; else fail "$name: exit status $rc"; fi
}
# ran NAME TEST: TEST printed OK (ran and passed, not skipped) in NAME's output.
ran() {
  if grep -qF "[       OK ] $2 " "$work/$1.out"; then pass "$1: $2 ran and passed"
  else fail "$1: $2 did not run and pass"; fi
}
ucx=0
"$DYN" --gtest_list_tests 2>/dev/null | grep -q '_ucx\b' && ucx=1

for c in "dyn_np3 cn1,cn2:2 3" "dyn_np4 cn1:2,cn2:2 4"; do
  read -r name hosts np <<<"$c"
  run "$name" "$hosts" "$np" "$DYN"
  case_failed=$failed
  for t in tcp $([[ $ucx -eq 1 ]] && echo ucx); do
    ran "$name" "Compiled/DynamicSync.MatchesOneTableBitForBit/admit2_cap200_$t"
    ran "$name" "Compiled/DynamicSync.MatchesOneTableBitForBit/admit0_cap0_$t"
    ran "$name" "Compiled/DynamicTransport.AsyncUpdatesAreNeverLost/$t"
    ran "$name" "Compiled/DynamicTransport.MalformedRequestsAreRefused/$t"
  done
  ran "$name" "Compiled/DynamicTransport.MessagesOfTheWrongLengthAreRefused/tcp"
  [[ $failed -eq $case_failed ]] || dump "$name"
done

# (DynamicCheckpointThreePs runs on the first compiled transport, mpi, which has no window here.)
run ckpt_np5 cn1:2,cn2:3 5 "$CKPT" ":DynamicCheckpointThreePs.*"
if [[ $rc -eq 0 ]] && grep -q '^\[  PASSED  \]' "$work/ckpt_np5.out" && ! grep -q '^\[  SKIPPED \]' "$work/ckpt_np5.out"; then
  pass "ckpt_np5: every test passed, none skipped"
else
  fail "ckpt_np5: not every test passed unskipped"
  dump ckpt_np5
fi

dynamic_test_finish
