#!/usr/bin/env bash
# mpirun_verify_test.sh STRATA_BIN -- `strata cluster --verify` across 3 emulated nodes under
# mpirun, plus the node properties every cluster test relies on.
#
# Run inside run_on_cluster.sh with 3 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 3 tests/cluster/mpirun_verify_test.sh build/bin/strata
#
# Cases:
#   1. nodes: `hostname` is cn1, cn2, cn3 (one per node, none the machine's own name); every node
#      resolves every other node's name to its cluster address (/etc/hosts of the cluster); a
#      file in one node's /dev/shm is seen by no other node and not by the host; the nodes'
#      boot ids differ (so UCX sees separate machines).
#   2. hostname_per_rank: cluster_mpirun --host cn1,cn2,cn3 -np 3 hostname prints the 3 names.
#   3. verify: cluster_mpirun --host cn1:2,cn2:1,cn3:2 -np 5 strata cluster --verify --num-ps 1:
#      exit 0; the header says 5 ranks on 3 nodes; exactly 5 rows; the node column holds cn1
#      twice, cn2 once, cn3 twice, in rank order (mpirun maps by slot: 0,1 | 2 | 3,4); rank 0 is
#      ps:0 and ranks 1-4 workers 0-3; a "# ok:" line follows.
# Every assertion prints PASS/FAIL with what it saw; a failing case also dumps its output.
#
# Environment: STRATA_STEP_TIMEOUT (default 60 s) bounds each command, so a hang is reported
# as such by the case that hung rather than by the outer timeout.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

[[ $# -eq 1 ]] || { echo "usage: mpirun_verify_test.sh STRATA_BIN" >&2; exit 2; }
BIN=$1
[[ -x $BIN ]] || { echo "FAIL: strata binary not found or not executable: $BIN" >&2; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd -P)/$(basename "$BIN")
[[ -n ${STRATA_CLUSTER_DIR:-} ]] || { echo "mpirun_verify_test: STRATA_CLUSTER_DIR is not set; run under tests/cluster/run_on_cluster.sh 3" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
STEP_TIMEOUT=${STRATA_STEP_TIMEOUT:-60}
D=$STRATA_CLUSTER_DIR
nodes=(cn1 cn2 cn3)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=0
case_failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); case_failed=1; }
dump() {
  [[ $case_failed -eq 1 ]] || return 0
  echo "---- $1: stdout ----"; cat "$work/$1.out"
  echo "---- $1: stderr ----"; cat "$work/$1.err"
  echo "---- end $1 ----"
}
# step NAME CMD...: run one command bounded by STEP_TIMEOUT; status in $rc.
step() {
  local name=$1; shift
  echo "== $name: $*"
  case_failed=0
  timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$name: did not finish within ${STEP_TIMEOUT} s (hang)"
  fi
}
on() { timeout 10 "$here/node_exec" "$D" "$@"; }

# ---- case 1: the nodes look like separate machines --------------------------------------------
echo "== nodes"
case_failed=0
root_name=$(hostname)
for n in "${nodes[@]}"; do
  got=$(on "$n" hostname 2>&1)
  if [[ $got == "$n" && $got != "$root_name" ]]; then pass "nodes: $n has host name $got"
  else fail "nodes: $n has host name '$got', expected '$n' (the machine is '$root_name')"; fi
done
bad=0
for n in "${nodes[@]}"; do
  for m in "${nodes[@]}"; do
    want=$(awk -v m="$m" '$2 == m {print $1}' "$D/hosts")
    got=$(on "$n" getent hosts "$m" 2>&1 | awk '{print $1}')
    [[ -n $want && $got == "$want" ]] || { fail "nodes: on $n, '$m' resolves to '$got', expected '$want'"; bad=1; }
  done
done
[[ $bad -eq 1 ]] || pass "nodes: every node resolves every node's name to its cluster address"
marker=strata-cluster-test-$$
if on cn1 sh -c "echo x > /dev/shm/$marker"; then
  seen=""
  for n in cn2 cn3; do on "$n" test -e "/dev/shm/$marker" && seen+="$n "; done
  [[ -e /dev/shm/$marker ]] && seen+="host "
  if [[ -z $seen ]]; then pass "nodes: /dev/shm of cn1 is private (not seen by cn2, cn3, the host)"
  else fail "nodes: /dev/shm/$marker written on cn1 is visible on: $seen"; fi
  on cn1 rm -f "/dev/shm/$marker"
else
  fail "nodes: cannot write /dev/shm on cn1"
fi
ids=$(for n in "${nodes[@]}"; do on "$n" cat /proc/sys/kernel/random/boot_id; done; cat /proc/sys/kernel/random/boot_id)
if [[ $(sort -u <<<"$ids" | grep -c .) -eq 4 ]]; then pass "nodes: boot ids of cn1, cn2, cn3 and the host all differ"
else fail "nodes: boot ids are not all different: $(tr '\n' ' ' <<<"$ids")"; fi

# ---- case 2: ranks run on their nodes -------------------------------------------------------------
step hostname_per_rank "$here/cluster_mpirun" "$D" --host cn1,cn2,cn3 -np 3 hostname
if [[ $rc -eq 0 ]]; then pass "hostname_per_rank: exit status 0"; else fail "hostname_per_rank: exit status $rc, expected 0"; fi
got=$(sort "$work/hostname_per_rank.out" | tr '\n' ' ')
if [[ $got == "cn1 cn2 cn3 " ]]; then pass "hostname_per_rank: ranks print cn1 cn2 cn3"
else fail "hostname_per_rank: ranks print '${got% }', expected 'cn1 cn2 cn3'"; fi
dump hostname_per_rank

# ---- case 3: strata cluster --verify with uneven ranks per node -------------------------------
step verify "$here/cluster_mpirun" "$D" --host cn1:2,cn2:1,cn3:2 -np 5 "$BIN" cluster --verify --num-ps 1
out=$work/verify.out
if [[ $rc -eq 0 ]]; then pass "verify: exit status 0"; else fail "verify: exit status $rc, expected 0"; fi
header=$(grep -m1 '^# strata cluster --verify:' "$out")
if [[ $header =~ (^|[^0-9])5[[:space:]]+ranks[[:space:]]+on[[:space:]]+3[[:space:]]+node ]]; then
  pass "verify: header says 5 ranks on 3 nodes"
else
  fail "verify: header does not say '5 ranks on 3 node(s)': ${header:-no header line}"
fi
rows=$(awk '!/^#/ && $1 ~ /^[0-9]+$/' "$out")
nrows=$(printf '%s' "$rows" | grep -c . || true)
if [[ $nrows -eq 5 ]]; then pass "verify: exactly 5 data rows"; else fail "verify: $nrows data rows, expected 5"; fi
got=$(printf '%s\n' "$rows" | awk 'NF {printf "%s=%s ", $1, $3}')
want="0=cn1 1=cn1 2=cn2 3=cn3 4=cn3 "
if [[ $got == "$want" ]]; then pass "verify: rank -> node is ${want% } (cn1:2 cn2:1 cn3:2)"
else fail "verify: rank -> node is '${got% }', expected '${want% }'"; fi
counts=$(printf '%s\n' "$rows" | awk 'NF {c[$3]++} END {for (n in c) printf "%s:%d\n", n, c[n]}' | sort | tr '\n' ' ')
if [[ $counts == "cn1:2 cn2:1 cn3:2 " ]]; then pass "verify: 3 distinct nodes with 2, 1, 2 ranks"
else fail "verify: ranks per node are '${counts% }', expected 'cn1:2 cn2:1 cn3:2'"; fi
got=$(printf '%s\n' "$rows" | awk 'NF {printf "%s=%s ", $1, $2}')
want="0=ps:0 1=worker:0 2=worker:1 3=worker:2 4=worker:3 "
if [[ $got == "$want" ]]; then pass "verify: rank -> task is ${want% }"
else fail "verify: rank -> task is '${got% }', expected '${want% }'"; fi
if grep -q '^# ok:' "$out"; then pass "verify: '# ok:' line present"; else fail "verify: no '# ok:' line"; fi
dump verify

echo
if [[ $failed -eq 0 ]]; then echo "mpirun_verify_test: all assertions passed"; exit 0; fi
echo "mpirun_verify_test: $failed assertion(s) failed"
exit 1
