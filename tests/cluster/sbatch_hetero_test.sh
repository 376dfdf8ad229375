#!/usr/bin/env bash
# sbatch_hetero_test.sh STRATA_BIN REPO_ROOT -- slurm/strata-hetero.sbatch as a real heterogeneous
# job over 3 nodes: the parameter server (component 0) on one node, the workers (component 1) on
# the two others, one MPI world across both (srun --het-group=0,1).
#
# Run inside run_on_cluster.sh --slurm 3 (it provides SLURM_CONF and STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh --slurm 3 tests/cluster/sbatch_hetero_test.sh build/bin/strata .
#
# Every job is submitted as the script's header says, one option group per component,
# separated by ':', overriding its #SBATCH defaults (partitions cpu/gpu, 16 CPUs per task, GPUs)
# to fit the emulated nodes:
#   sbatch -p debug -N 1 -n 1 -w cn1 -c 1 : -p debug -N 2 -n 2 -w cn[2-3] --ntasks-per-node=1 -c 1 \
#     --gpus-per-node=0 slurm/strata-hetero.sbatch COMMAND...
#   verify: COMMAND = cluster --verify (the script adds --jobs ps=1,worker=2): COMPLETED 0:0;
#           3 ranks on 3 nodes, resolver slurm; rank 0 is ps:0 on cn1, ranks 1-2 workers 0-1 on
#           cn2 and cn3; every address is host:8888+local of the rank's own node; the PS node
#           runs no worker; "# ok:".
#   train:  COMMAND = train --epochs 2 with STRATA_LOG_LEVEL=debug: COMPLETED 0:0; the script
#           says ps 1 on cn1, workers 2 on cn[2-3]; each rank's "bootstrap done" line names its
#           host: ps:0 on cn1, worker:0 on cn2, worker:1 on cn3 (the PS on another node than
#           every worker); the transport is tcp over 3 nodes; 2 workers + 1 PS, global_step
#           2 epochs x 2 x (60000 / 2 / 128), test_accuracy >= 0.8 (two epochs: async after
#           one lands at 0.79-0.84, too close to the bound).
#   layout: the PS component on cn3, the LAST node of the step's sorted node list (cn[1-3]), the
#           workers on cn[1-2]: task 0 does not run on the first node, so a resolver laying tasks
#           out in block order over SLURM_STEP_NODELIST (strata before it read Slurm's task map)
#           gives every task another node's address. COMMAND = cluster (the JSON of each task,
#           no MPI), strata started through a wrapper (STRATA=) that prints where the task runs:
#           COMPLETED 0:0; 3 tasks; every task resolved the same cluster, ps cn3:8888 and
#           workers cn1:8888, cn2:8888; task i is ps:0 / worker:i-1 and its own address names
#           the node it runs on (SLURMD_NODENAME, SLURM_LOCALID); and the script warns that
#           Slurm 22.05's pmix plugin cannot start MPI in this component order. (Seen here:
#           MPI_Init then fails, slurmstepd logging "mpi/pmix_v4: ... Cannot establish direct
#           connection": the step daemon on cn2 calls itself cn3. So verify and train use the
#           order that works.)
# Slurm starts heterogeneous jobs only from its backfill scheduler, every bf_interval (30 s by
# default). The test sets bf_interval=1 in its own cluster's slurm.conf and reconfigures, which
# takes effect after the next backfill cycle: the first job may wait up to 30 s, the others not.
# About 45 s + the cluster. A rank lost to the known MPI_Init crash is retried once (NOTE), and so
# is a job whose srun outlives its step (Slurm 22.05 with a heterogeneous step, Known issues).
#
# Environment: STRATA_SBATCH_TIMEOUT (default 120 s) bounds each job, pending included.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=tests/cluster/slurm_jobs_lib.sh
source "$here/slurm_jobs_lib.sh"
sbatch_test_setup sbatch_hetero_test strata-hetero.sbatch "$@"
LIMIT=${STRATA_SBATCH_TIMEOUT:-120}
# The template ends an srun that outlives its step by this long (step_watchdog); run_job then
# submits the job once more (slurm_jobs_lib.sh): Slurm's srun, not strata, is what hung.
export STRATA_STEP_EXIT_GRACE=${STRATA_STEP_EXIT_GRACE:-10}
export STRATA=$BIN

# This cluster's own slurm.conf (cluster_up.sh writes one per run): a shorter backfill interval.
if ! grep -q '^SchedulerParameters=' "$SLURM_CONF" \
   && sed -i 's|^SchedulerType=sched/backfill$|&\nSchedulerParameters=bf_interval=1|' "$SLURM_CONF" \
   && grep -q '^SchedulerParameters=bf_interval=1$' "$SLURM_CONF" && scontrol reconfigure; then
  echo "   (bf_interval=1 set in this cluster's slurm.conf: hetjobs start within a second after the next backfill cycle)"
else
  note "could not shorten bf_interval; each hetjob may wait up to 30 s for the backfill scheduler"
fi

COMPONENTS=(-p debug -N 1 -n 1 -w cn1 --ntasks-per-node=1 --cpus-per-task=1
            : -p debug -N 2 -n 2 -w 'cn[2-3]' --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0)
PS_LAST=(-p debug -N 1 -n 1 -w cn3 --ntasks-per-node=1 --cpus-per-task=1
         : -p debug -N 2 -n 2 -w 'cn[1-2]' --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0)
BATCH=128
n_train=$(fashion_mnist_train_count) || { echo "FAIL: cannot read the dataset header"; exit 1; }
want_global=$((2 * 2 * (n_train / 2 / BATCH)))

# ---- verify: the table --------------------------------------------------------------------------
case_failed=0
if run_job verify "$LIMIT" "${COMPONENTS[@]}" "$SCRIPT" cluster --verify; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "verify: COMPLETED, ExitCode=0:0" \
    || fail "verify: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  line=$(grep -m1 '^strata-hetero.sbatch: job ' <<<"$out")
  [[ $line == *"ps 1 on cn1, workers 2 on cn[2-3]"*"--jobs ps=1,worker=2"* ]] && pass "verify: $line" \
    || fail "verify: script line is '${line:-missing}', expected ps 1 on cn1, workers 2 on cn[2-3], --jobs ps=1,worker=2"
  header=$(grep -m1 '^# strata cluster --verify:' <<<"$out")
  if [[ $header == *" 3 ranks on 3 node(s), resolver slurm"* ]]; then pass "verify: header says 3 ranks on 3 nodes, resolver slurm"
  else fail "verify: header is '${header:-missing}'"; fi
  rows=$(awk '!/^#/ && $1 ~ /^[0-9]+$/ && NF >= 5' <<<"$out")
  got=$(awk '{printf "%s=%s@%s ", $1, $2, $3}' <<<"$rows")
  if [[ $got == "0=ps:0@cn1 1=worker:0@cn2 2=worker:1@cn3 " ]]; then pass "verify: rank -> task@node: ${got% }"
  else fail "verify: rank -> task@node is '${got% }', expected '0=ps:0@cn1 1=worker:0@cn2 2=worker:1@cn3'"; fi
  got=$(awk '{split($5, a, ":"); if (a[1] != $3 || a[2] != 8888 + $4) printf "rank %s runs on %s (local %s) but its address is %s; ", $1, $3, $4, $5}' <<<"$rows")
  if [[ -z $got && -n $rows ]]; then pass "verify: every rank's address is its own node's (ps:0 at $(awk '$1 == 0 {print $5}' <<<"$rows"))"
  else fail "verify: ${got:-no rows}"; fi
  ps_node=$(awk '$2 ~ /^ps:/ {print $3}' <<<"$rows")
  shared=$(awk -v p="$ps_node" '$2 ~ /^worker:/ && $3 == p {printf "%s ", $2}' <<<"$rows")
  if [[ -n $ps_node && -z $shared ]]; then pass "verify: the PS node ($ps_node) runs no worker"
  else fail "verify: PS node '${ps_node:-none}' also runs ${shared:-?}"; fi
  grep -q '^# ok:' <<<"$out" && pass "verify: '# ok:' line present" || fail "verify: no '# ok:' line"
fi
show_job

# ---- train: PS on cn1, workers on cn2 and cn3 -----------------------------------------------------
case_failed=0
if STRATA_LOG_LEVEL=debug run_job train "$LIMIT" "${COMPONENTS[@]}" "$SCRIPT" \
     train --epochs 2 --global-batch "$BATCH"; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "train: COMPLETED, ExitCode=0:0" \
    || fail "train: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  line=$(grep -m1 '^strata-hetero.sbatch: job ' <<<"$out")
  [[ $line == *"ps 1 on cn1, workers 2 on cn[2-3]"* ]] && pass "train: $line" \
    || fail "train: script line is '${line:-missing}'"
  declare -A host_of=()
  while read -r task host; do host_of[$task]=$host; done < <(
    sed -nE 's/^\[D [0-9:.]+ r[0-9]+\/3 ([a-z]+:[0-9]+) ([^ ]+) runtime\.cc:[0-9]+\] bootstrap done: .*/\1 \2/p' <<<"$out")
  ps=${host_of[ps:0]:-?} w0=${host_of[worker:0]:-?} w1=${host_of[worker:1]:-?}
  if [[ $ps == cn1 && $w0 == cn2 && $w1 == cn3 ]]; then
    pass "train: ps:0 on $ps, worker:0 on $w0, worker:1 on $w1: the PS on another node than every worker"
  else
    fail "train: ps:0 on $ps, worker:0 on $w0, worker:1 on $w1 (bootstrap lines), expected cn1, cn2, cn3"
  fi
  line=$(grep -m1 '^strata train: transport' <<<"$out")
  if [[ $line == *"transport tcp"*"3 node(s)"* ]]; then pass "train: transport tcp over 3 nodes"
  else fail "train: transport line is '${line:-missing}'"; fi
  summary=$(grep -E '^\{.*"global_step"' <<<"$out" | tail -n1)
  check=$(json_check "$summary" 'j["workers"] == 2' 'j["ps"] == 1' "j['global_step'] == $want_global" \
            'j["test_accuracy"] >= 0.8')
  acc=$(sed -nE 's/.*"test_accuracy":([0-9.]+).*/\1/p' <<<"$summary")
  [[ $check == ok ]] && pass "train: summary: 2 workers + 1 PS, global_step $want_global, test_accuracy $acc >= 0.8" \
    || fail "train: summary: $check"
fi
show_job

# ---- layout: PS on the last node of the sorted node list ------------------------------------------
case_failed=0
wrapper=$work/strata-where
# Runs strata and prints, on one line, where this task runs and what strata resolved.
printf '%s\n' '#!/bin/sh' \
  "out=\$('$BIN' \"\$@\" 2>&1); rc=\$?" \
  'echo "TASK $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID rc=$rc $out"' \
  'exit $rc' >"$wrapper"
chmod +x "$wrapper"
if STRATA=$wrapper run_job layout "$LIMIT" "${PS_LAST[@]}" "$SCRIPT" cluster; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "layout: COMPLETED, ExitCode=0:0" \
    || fail "layout: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  line=$(grep -m1 '^strata-hetero.sbatch: job ' <<<"$out")
  [[ $line == *"ps 1 on cn3, workers 2 on cn[1-2]"* ]] && pass "layout: $line" || fail "layout: script line is '${line:-missing}'"
  check=$(grep '^TASK ' <<<"$out" | python3 -c '
import json, sys
tasks = {}
for line in sys.stdin:
    f = line.rstrip("\n").split(" ", 5)
    try:
        tasks[int(f[1])] = (f[2], int(f[3]), f[4], json.loads(f[5]))
    except Exception as e:  # noqa: BLE001
        print("unreadable task line %r (%s)" % (line.strip()[:300], e))
        sys.exit()
want = {"ps": ["cn3:8888"], "worker": ["cn1:8888", "cn2:8888"]}
bad = []
if sorted(tasks) != [0, 1, 2]:
    bad.append("tasks %s, expected 0-2" % sorted(tasks))
for p, (node, local, rc, j) in sorted(tasks.items()):
    task = "%s:%s" % (j["task"]["type"], j["task"]["index"]) if j.get("task") else None
    if j["cluster"] != want:
        bad.append("task %d resolved %s" % (p, json.dumps(j["cluster"])))
    if task != ("ps:0" if p == 0 else "worker:%d" % (p - 1)):
        bad.append("task %d is %s" % (p, task))
    if j["master"] != "grpc://%s:%d" % (node, 8888 + local):
        bad.append("task %d runs on %s (local %d) but its address is %s" % (p, node, local, j["master"]))
print("; ".join(bad) if bad else
      "ok " + ", ".join("%d at %s on %s" % (p, t[3]["master"], t[0]) for p, t in sorted(tasks.items())))
' 2>&1)
  if [[ $check == ok* ]]; then pass "layout: every task resolved ps cn3:8888, workers cn1:8888 cn2:8888, its own address on its node (${check#ok })"
  else fail "layout: $check"; fi
  grep -q "^strata-hetero.sbatch: warning: component 0's nodes (cn3) do not all sort before component 1's (cn\[1-2\]):.*pmix" <<<"$out" \
    && pass "layout: the script warns that Slurm's pmix plugin cannot start MPI in this component order" \
    || fail "layout: no 'strata-hetero.sbatch: warning: component 0's nodes (cn3) do not all sort before ...' line"
fi
show_job

echo
if [[ $failed -eq 0 ]]; then echo "sbatch_hetero_test: all assertions passed"; exit 0; fi
echo "sbatch_hetero_test: $failed assertion(s) failed"
exit 1
