#!/usr/bin/env bash
# sbatch_partition_test.sh STRATA_BIN REPO_ROOT -- slurm/strata.sbatch when a node is cut off for
# good (issue 19, items 1-2, under the multi-node Slurm of tests/cluster/README.md).
#
# Run inside run_on_cluster.sh --slurm 3:
#   tests/cluster/run_on_cluster.sh --slurm 3 tests/cluster/sbatch_partition_test.sh build/bin/strata .
#
# sbatch -N 3 -n 3 --exclusive strata.sbatch train --jobs ps=1,worker=2 (task i on cn<i+1>; whole
# nodes, as HPC sites allocate them, so two nodes can hold the three tasks), a checkpoint
# every 100 steps, --stall-timeout 4. After the first committed checkpoint, cn3 (worker:1) loses
# its link for good (`ip link set eth0 down` in its namespace).
#   restart   STRATA_MAX_RESTARTS=1: the restart line says the step runs on 2 nodes without cn3;
#             the job completes (0:0) from the checkpoint with "restarts": 1, before Slurm has
#             even marked cn3 down (SlurmdTimeout 60 s): --no-kill keeps the allocation.
#   ps_restart the same with --jobs worker=2,ps=1, so cn3 holds ps:0 (rank 2): the restart line
#             names the PS, which comes back on a remaining node from the checkpoint; COMPLETED 0:0.
#   end       no restarts: the batch script ends within --stall-timeout + 15 s of the cut, with a
#             non-zero status and the liveness line naming rank 2 (worker:1 on cn3). (Slurm keeps
#             the job COMPLETING until it marks cn3 down, SlurmdTimeout later: a NOTE line.)
# cn3 comes back between and after the cases (and Slurm is told to resume it).
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
source "$here/slurm_jobs_lib.sh"
sbatch_test_setup sbatch_partition_test strata.sbatch "$@"
LIMIT=${STRATA_SBATCH_TIMEOUT:-150}
D=$STRATA_CLUSTER_DIR
failed=0
STALL=4

# cut_after_checkpoint DIR: in the background, cuts cn3's link once DIR has a committed
# checkpoint; the cut's time (SECONDS of this shell's clock, via a file) goes to DIR.cut.
cut_after_checkpoint() {
  local dir=$1
  ( for _ in $(seq 1500); do [[ -e $dir/checkpoint.json ]] && break; sleep 0.1; done
    "$here/node_exec" "$D" cn3 ip link set eth0 down
    date +%s.%N >"$dir.cut" ) &
}
heal() {
  "$here/node_exec" "$D" cn3 ip link set eth0 up
  scontrol update nodename=cn3 state=resume >/dev/null 2>&1 || true
}

# ---- restart without the lost node ---------------------------------------------------------------
ck=$work/ck-restart
cut_after_checkpoint "$ck"
export STRATA=$BIN STRATA_MAX_RESTARTS=1
if run_job restart "$LIMIT" -N 3 -n 3 --exclusive "$SCRIPT" train --epochs 3 --jobs ps=1,worker=2 --log-every 0 \
     --checkpoint-dir "$ck" --save-every-steps 100 --stall-timeout "$STALL" --timeout 30; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "restart: COMPLETED 0:0" \
    || fail "restart: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  line=$(grep -m1 -E '^strata.sbatch: restart 1 of 1: ' <<<"$out")
  [[ $line == *"rank 2 (worker:1 on cn3)"*"launching the step again on 2 node(s), without cn3,"* ]] \
    && pass "restart: $line" || fail "restart: restart line is '${line:-missing}'"
  summary=$(grep -E '^\{.*"global_step"' <<<"$out" | tail -n1)
  check=$(json_check "$summary" 'j["restarts"] == 1' 'j["test_accuracy"] >= 0.8')
  [[ $check == ok ]] && pass "restart: finished with restarts 1 and accuracy >= 0.8" || fail "restart: summary: $check"
fi
wait
show_job
heal

# ---- the PS's node lost: the PS comes back on a remaining node from the checkpoint ---------------
# --jobs worker=2,ps=1 puts ps:0 on cn3 (rank 2), away from the batch script's node (cn1: the batch
# host runs the template itself, so losing it is the allocation's end, not a restartable fault).
ck=$work/ck-ps-restart
cut_after_checkpoint "$ck"
if run_job ps_restart "$LIMIT" -N 3 -n 3 --exclusive "$SCRIPT" train --epochs 3 --jobs worker=2,ps=1 --log-every 0 \
     --checkpoint-dir "$ck" --save-every-steps 100 --stall-timeout "$STALL" --timeout 30; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "ps_restart: COMPLETED 0:0" \
    || fail "ps_restart: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  line=$(grep -m1 -E '^strata.sbatch: restart 1 of 1: ' <<<"$out")
  [[ $line == *"rank 2 (ps:0 on cn3)"*"without cn3,"* ]] \
    && pass "ps_restart: $line" || fail "ps_restart: restart line is '${line:-missing}'"
  summary=$(grep -E '^\{.*"global_step"' <<<"$out" | tail -n1)
  check=$(json_check "$summary" 'j["restarts"] == 1' 'j["test_accuracy"] >= 0.8')
  [[ $check == ok ]] && pass "ps_restart: finished with restarts 1 and accuracy >= 0.8" || fail "ps_restart: summary: $check"
  grep -q '^checkpoint: restored' <<<"$out" && pass "ps_restart: $(grep -m1 '^checkpoint: restored' <<<"$out")" \
    || fail "ps_restart: no 'checkpoint: restored' line"
fi
wait
show_job
heal

# ---- no restarts: the job ends within the bound ----------------------------------------------------
ck=$work/ck-end
cut_after_checkpoint "$ck"
export STRATA_MAX_RESTARTS=0
if run_job end "$LIMIT" -N 3 -n 3 --exclusive "$SCRIPT" train --epochs 3 --jobs ps=1,worker=2 --log-every 0 \
     --checkpoint-dir "$ck" --save-every-steps 100 --stall-timeout "$STALL" --timeout 30; then
  ended=$(stat -c %Y "$file")  # the batch script's last line: the step and the template are over
  final=$(date +%s.%N)
  [[ $state != COMPLETED ]] && pass "end: JobState=$state ExitCode=$exitcode (failed, as it should)" \
    || fail "end: the job COMPLETED after losing a worker's node"
  wait
  if [[ -s $ck.cut ]]; then
    took=$(/usr/bin/python3 -c "import sys; print(int(float(sys.argv[2]) - float(sys.argv[1])))" "$(cat "$ck.cut")" "$ended")
    bound=$((STALL + 15))
    [[ $took -le $bound ]] && pass "end: the batch script ended $took s after the cut (bound --stall-timeout + 15 = $bound s)" \
      || fail "end: the batch script ended $took s after the cut, over the bound of $bound s"
    # Slurm itself keeps the job COMPLETING until it hears from the lost node's slurmd or marks
    # the node down (SlurmdTimeout, 60 s here): the other nodes are released as they finish.
    note "end: Slurm recorded the job final $(/usr/bin/python3 -c "import sys; print(int(float(sys.argv[2]) - float(sys.argv[1])))" "$(cat "$ck.cut")" "$final") s after the cut (SlurmdTimeout)"
  else
    fail "end: the cut never happened"
  fi
  grep -qE '^strata: liveness: rank 2 \(worker:1 on cn3\) stopped' <<<"$out" \
    && pass "end: $(grep -m1 '^strata: liveness: ' <<<"$out")" || fail "end: no liveness line naming rank 2 (worker:1 on cn3)"
  # The template's own line names the verdict, not a healthy task that srun killed on the way out.
  grep -qE '^strata.sbatch: the step ended on strata.s verdict: rank 2 \(worker:1 on cn3\)' <<<"$out" \
    && pass "end: $(grep -m1 '^strata.sbatch: the step ended' <<<"$out")" || fail "end: no 'the step ended on strata's verdict' line"
  if grep -qE '^strata.sbatch: task [0-9]+ \([a-z]+:[0-9]+ on cn[12]\) died' <<<"$out"; then
    fail "end: a healthy task is reported as died: $(grep -m1 -E '^strata.sbatch: task .* died' <<<"$out")"
  fi
fi
wait
show_job
heal

echo "sbatch_partition_test: $failed failure(s)"
[[ $failed -eq 0 ]]
