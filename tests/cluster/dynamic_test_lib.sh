# shellcheck shell=bash
# shellcheck disable=SC2034  # BIN, SPEC, here, STEP_TIMEOUT, D are for the sourcing test
# Sourced by the dynamic-table cluster tests (dynamic_churn_test.sh, dynamic_big_test.sh,
# dynamic_parallel_save_test.sh, dynamic_data_plane_test.sh): their common start (arguments, the cluster directory, a work
# directory on the nodes' shared file system) and their PASS/FAIL helpers.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/dynamic_test_lib.sh"
#   dynamic_test_init NAME NODES PREFIX "$@"   # NAME.sh STRATA_BIN SPEC, under run_on_cluster.sh NODES
#   dynamic_test_setup NAME NODES PREFIX       # the same for a test with arguments of its own
#   step NAME CMD...                           # runs CMD into $work/NAME.out/.err, rc in $rc
#   pass MSG | fail MSG | dump NAME            # fail counts into $failed
#   dynamic_test_finish                        # the summary line; exit 0 or 1
#
# Sets BIN and SPEC (absolute), here (this directory), STEP_TIMEOUT (STRATA_STEP_TIMEOUT, default
# 80 s, bounds each step), D (STRATA_CLUSTER_DIR), work (removed at exit unless
# STRATA_KEEP_CLUSTER_DIR=1) and failed=0. Bad arguments: one line and exit status 2.

dynamic_test_abs() { echo "$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"; }

dynamic_test_init() {
  TEST_NAME=$1
  local nodes=$2 prefix=$3
  shift 3
  [[ $# -eq 2 ]] || { echo "usage: $TEST_NAME.sh STRATA_BIN SPEC" >&2; exit 2; }
  BIN=$(dynamic_test_abs "$1") SPEC=$(dynamic_test_abs "$2")
  [[ -x $BIN ]] || { echo "FAIL: not executable: $BIN" >&2; exit 1; }
  [[ -f $SPEC ]] || { echo "FAIL: no spec file: $SPEC" >&2; exit 1; }
  dynamic_test_setup "$TEST_NAME" "$nodes" "$prefix"
}

# The same without the two arguments (a test that takes others checks them itself).
dynamic_test_setup() {
  TEST_NAME=$1
  local nodes=$2 prefix=$3
  [[ -n ${STRATA_CLUSTER_DIR:-} ]] ||
    { echo "$TEST_NAME: STRATA_CLUSTER_DIR is not set; run under tests/cluster/run_on_cluster.sh $nodes" >&2; exit 2; }
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
  STEP_TIMEOUT=${STRATA_STEP_TIMEOUT:-80}
  D=$STRATA_CLUSTER_DIR
  # Every node sees the same file system (like a cluster's shared one): data and output live here.
  work=$(mktemp -d "$D/$prefix.XXXXXX")
  [[ ${STRATA_KEEP_CLUSTER_DIR:-0} == 1 ]] || trap 'rm -rf "$work"' EXIT
  failed=0
}

pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
dump() {
  echo "---- $1: stdout (last 30 lines) ----"; tail -n 30 "$work/$1.out" | cut -c1-400
  echo "---- $1: stderr (last 30 lines) ----"; tail -n 30 "$work/$1.err" | cut -c1-400
  echo "---- end $1 ----"
}
step() {
  local name=$1
  shift
  echo "== $name: $*"
  timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  [[ $rc -ne 124 && $rc -ne 137 ]] || fail "$name: timed out after $STEP_TIMEOUT s"
}

dynamic_test_finish() {
  echo
  if [[ $failed -eq 0 ]]; then echo "$TEST_NAME: all assertions passed"; exit 0; fi
  echo "$TEST_NAME: $failed assertion(s) failed"
  exit 1
}
