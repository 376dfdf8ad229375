#!/usr/bin/env bash
# partition_test.sh STRATA_BIN REPO -- a node that is gone for good ends the job within a bound, or
# the job restarts without it (issue 19, items 1-2), through mpi_launch/strata-mpirun.
#
# Run inside run_on_cluster.sh with 4 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 4 tests/cluster/partition_test.sh build/bin/strata .
#
# The job: 1 PS + 2 workers from a hostfile of cn1..cn4 (one slot each: cn4 is a spare), MLP,
# a checkpoint every 100 steps, --stall-timeout 4. Once the first checkpoint is committed, a
# node's link goes down for good (`ip link set eth0 down` in its namespace).
#   worker_cut   cn3 (worker:1), no restarts: the launcher ends the job within --stall-timeout +
#                15 s, status 1, one line naming rank 2 (worker:1 on cn3) and the node.
#   ps_cut       cn1 (ps:0), no restarts: the same bound, naming the PS's rank and node from the
#                survivors' side.
#   heal_ps      cn1 (ps:0) cut for 15 s under plain mpirun (which waits for the cut node): every
#                verdict line, the PS's own included once its link is back, names rank 0 (ps:0 on
#                cn1), never a worker.
#   heal_worker  the same with cn2 (worker:0, rank 1, the PS's watcher): every line names rank 1.
#   heal_worker2 the same with cn3 (worker:1, rank 2, which watches only for its own isolation,
#                with rank 1 as its witness): every line names rank 2, none blames the PS.
#   restart      cn2 (worker:0), STRATA_MAX_RESTARTS=1: the restart leaves cn2 out (the line
#                names it), the job runs on cn1, cn3 and cn4 from the checkpoint and finishes
#                with status 0 and "restarts": 1.
# Every assertion prints PASS/FAIL.
set -uo pipefail

[[ $# -eq 2 ]] || { echo "usage: partition_test.sh STRATA_BIN REPO" >&2; exit 2; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
REPO=$(cd "$2" && pwd -P)
[[ -n ${STRATA_CLUSTER_DIR:-} ]] || { echo "partition_test: run under tests/cluster/run_on_cluster.sh 4" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
D=$STRATA_CLUSTER_DIR
subnet=$(sed -n 's/^STRATA_CLUSTER_SUBNET=//p' "$D/cluster.env")
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# strata-mpirun with the emulation's Open MPI settings (what cluster_mpirun passes as flags)
# given as the environment a site would set.
export OMPI_MCA_plm_rsh_agent=$here/rsh-agent OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_oob_tcp_if_include=$subnet OMPI_MCA_btl_tcp_if_include=$subnet
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_mpi_yield_when_idle=1
export STRATA_CLUSTER_DIR=$D TMPDIR=$D/tmp
hosts=$D/partition.hosts
printf 'cn%d slots=1\n' 1 2 3 4 >"$hosts"

STALL=4
# run_case NAME NODE RESTARTS: trains, cuts NODE's link after the first committed checkpoint.
run_case() {
  local name=$1 node=$2 restarts=$3 ck=$D/ck-$1
  rm -rf "$ck"
  STRATA_MAX_RESTARTS=$restarts timeout -k 10 170 "$REPO/mpi_launch/strata-mpirun" --ps 1 --workers 2 \
    --hostfile "$hosts" -- "$BIN" train --epochs 4 --log-every 0 --checkpoint-dir "$ck" \
    --save-every-steps 100 --stall-timeout "$STALL" --timeout 30 >"$D/$name.out" 2>"$D/$name.err" &
  local job=$!
  for _ in $(seq 600); do [[ -e $ck/checkpoint.json ]] && break; kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if [[ ! -e $ck/checkpoint.json ]]; then
    fail "$name: no checkpoint committed before the cut"
    wait "$job"
    tail -n 20 "$D/$name.err"
    return 1
  fi
  "$here/node_exec" "$D" "$node" ip link set eth0 down
  cut_at=$SECONDS
  wait "$job"
  rc=$?
  took=$((SECONDS - cut_at))
}

# ---- a worker's node and the PS's node, cut for good, no restarts -------------------------------
for c in "worker_cut cn3 2 worker:1" "ps_cut cn1 0 ps:0"; do
  read -r name node rank role <<<"$c"
  run_case "$name" "$node" 0 || continue
  bound=$((STALL + 15))
  [[ $rc -eq 1 ]] && pass "$name: status 1" || fail "$name: status $rc, expected 1"
  [[ $took -le $bound ]] && pass "$name: ended $took s after the cut (bound --stall-timeout + 15 = $bound s)" \
    || fail "$name: ended $took s after the cut, over the bound of $bound s"
  line=$(grep -m1 '^strata-mpirun: mpirun did not end' "$D/$name.err")
  if [[ $line == *"rank $rank ($role on $node)"*"node $node may be unreachable"* ]]; then pass "$name: $line"
  else fail "$name: launcher line is '${line:-missing}', expected it to name rank $rank ($role on $node)"; fi
  "$here/node_exec" "$D" "$node" ip link set eth0 up
  if [[ $failed -ne 0 ]]; then tail -n 30 "$D/$name.err"; fi
done

# ---- a node cut, then healed, under plain mpirun: every verdict names the cut-off rank --------
# mpirun waits for the cut node's daemon, so the lines of the isolated rank arrive once the link
# is back: they must name its own isolation, not a healthy peer. cn1 holds rank 0 (the PS, which
# watches every rank), cn2 rank 1 (worker:0, which watches rank 0 with rank 2 as its witness), cn3
# rank 2 (worker:1, whose witness is rank 1).
for c in "heal_ps cn1 0 ps:0" "heal_worker cn2 1 worker:0" "heal_worker2 cn3 2 worker:1"; do
  read -r name node rank role <<<"$c"
  ck=$D/ck-$name
  rm -rf "$ck"
  STRATA_NUM_PS=1 timeout -k 10 120 "$here/cluster_mpirun" "$D" --host cn1,cn2,cn3 -np 3 "$BIN" train --epochs 4 \
    --log-every 0 --checkpoint-dir "$ck" --save-every-steps 100 --stall-timeout "$STALL" --timeout 30 \
    >"$D/$name.out" 2>"$D/$name.err" &
  job=$!
  for _ in $(seq 600); do [[ -e $ck/checkpoint.json ]] && break; kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  "$here/node_exec" "$D" "$node" ip link set eth0 down
  sleep 15
  "$here/node_exec" "$D" "$node" ip link set eth0 up
  wait "$job"
  rc=$?
  mapfile -t verdicts < <(grep '^strata: liveness: rank' "$D/$name.err")
  if [[ ${#verdicts[@]} -ge 1 ]]; then pass "$name: ${#verdicts[@]} verdict line(s), status $rc"; else fail "$name: no verdict line (status $rc)"; fi
  for v in "${verdicts[@]}"; do
    if [[ $v == "strata: liveness: rank $rank ($role on $node) "* ]]; then pass "$name: $v"
    else fail "$name: a verdict blames another rank than the cut-off $role: $v"; fi
  done
  # A rank >= 2 accuses nobody: its own isolation verdict (rank 0 and its witness silent at once)
  # is how it avoids timing out on the PS and blaming it.
  if [[ $name == heal_worker2 ]]; then
    if grep -q "^strata: liveness: rank $rank ($role on $node) lost rank 0 .* at once" "$D/$name.err"; then
      pass "$name: the cut-off rank named its own isolation"
    else fail "$name: no isolation verdict from rank $rank itself"; fi
  fi
done

# ---- a restart that leaves the lost node out ----------------------------------------------------
if run_case restart cn2 1; then
  [[ $rc -eq 0 ]] && pass "restart: status 0" || fail "restart: status $rc, expected 0"
  line=$(grep -m1 '^strata-mpirun: restart 1 of 1' "$D/restart.err")
  [[ $line == *"without node cn2"* ]] && pass "restart: $line" || fail "restart: restart line is '${line:-missing}'"
  summary=$(grep -E '^\{.*"global_step"' "$D/restart.out" | tail -n1)
  if /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); sys.exit(0 if j["restarts"] == 1 and j["test_accuracy"] >= 0.8 else 1)' "$summary" 2>/dev/null; then
    pass "restart: finished with restarts 1: $summary"
  else
    fail "restart: summary '$summary'"
  fi
  grep -q '^checkpoint: restored' "$D/restart.out" && pass "restart: $(grep -m1 '^checkpoint: restored' "$D/restart.out")" \
    || fail "restart: no 'checkpoint: restored' line"
  if [[ $failed -ne 0 ]]; then tail -n 30 "$D/restart.err"; fi
fi

echo "partition_test: $failed failure(s)"
[[ $failed -eq 0 ]]
