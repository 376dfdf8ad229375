#!/usr/bin/env bash
# sbatch_train_test.sh STRATA_BIN REPO_ROOT -- slurm/strata.sbatch training across 3 nodes of a
# real multi-node Slurm: 1 PS + 2 workers, one task per node.
#
# Run inside run_on_cluster.sh --slurm 3 (it provides SLURM_CONF and STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh --slurm 3 tests/cluster/sbatch_train_test.sh build/bin/strata .
#
# Submits
#   sbatch -N 3 -n 3 --ntasks-per-node=1 slurm/strata.sbatch train --epochs 2 --jobs ps=1,worker=2
# with the network settings in the submitting environment only (slurm_jobs_lib.sh:
# export_network_env, including OMPI_MCA_btl=self,vader,tcp, whose commas srun --export would
# split) and STRATA_LOG_LEVEL=debug (each rank logs "bootstrap done" tagged with its host).
# Checks: the job is COMPLETED with ExitCode 0:0 and launched its step at once; the script ran
# it on cn[1-3]; ps:0, worker:0 and worker:1 came up on three different nodes; the transport line
# says tcp over 3 nodes, chosen by auto; the summary has 2 workers, 1 PS, 2 epochs, global_step =
# 2 epochs x 2 workers x (60000 / 2 / 128) (every step of both workers counted once) and
# test_accuracy >= 0.8. Two epochs, not one: async training after a single epoch lands at
# 0.79-0.84 depending on how the workers interleave (0.7913 seen in CI), after two at 0.84-0.86.
# About 10 s (job) + the cluster. A rank lost to the known MPI_Init crash is retried once (NOTE).
#
# Environment: STRATA_SBATCH_TIMEOUT (default 120 s) bounds the job, pending included.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=tests/cluster/slurm_jobs_lib.sh
source "$here/slurm_jobs_lib.sh"
sbatch_test_setup sbatch_train_test strata.sbatch "$@"
LIMIT=${STRATA_SBATCH_TIMEOUT:-120}
export STRATA=$BIN STRATA_LOG_LEVEL=debug

BATCH=128
n_train=$(fashion_mnist_train_count) || { echo "FAIL: cannot read the dataset header"; exit 1; }
want_global=$((2 * 2 * (n_train / 2 / BATCH)))

if run_job train "$LIMIT" -N 3 -n 3 --ntasks-per-node=1 "$SCRIPT" \
     train --epochs 2 --jobs ps=1,worker=2 --global-batch "$BATCH"; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "train: COMPLETED, ExitCode=0:0" \
    || fail "train: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  if grep -q 'did not launch' <<<"$out"; then fail "train: a 'did not launch' line"; else pass "train: the step launched at once"; fi
  line=$(grep -m1 '^strata.sbatch: job ' <<<"$out")
  [[ $line == *" on cn[1-3]: 3 tasks: "* ]] && pass "train: $line" || fail "train: script line is '${line:-missing}'"

  # One task per node: the host tag of each rank's "bootstrap done" line.
  declare -A host_of=()
  while read -r task host; do host_of[$task]=$host; done < <(
    sed -nE 's/^\[D [0-9:.]+ r[0-9]+\/3 ([a-z]+:[0-9]+) ([^ ]+) runtime\.cc:[0-9]+\] bootstrap done: .*/\1 \2/p' <<<"$out")
  hosts="${host_of[ps:0]:-?} ${host_of[worker:0]:-?} ${host_of[worker:1]:-?}"
  distinct=$(tr ' ' '\n' <<<"$hosts" | grep -v '?' | sort -u | grep -c .)
  if [[ $distinct == 3 ]]; then pass "train: ps:0, worker:0, worker:1 on $hosts (one task per node)"
  else fail "train: ps:0, worker:0, worker:1 on '$hosts', expected 3 different nodes"; fi

  line=$(grep -m1 '^strata train: transport' <<<"$out")
  if [[ $line == *"transport tcp"*"3 node(s)"*"auto: 3 nodes"* ]]; then pass "train: transport line: tcp over 3 nodes, chosen by auto"
  else fail "train: transport line is '${line:-missing}'"; fi
  summary=$(grep -E '^\{.*"global_step"' <<<"$out" | tail -n1)
  check=$(json_check "$summary" 'j["workers"] == 2' 'j["ps"] == 1' 'j["epochs"] == 2' \
            "j['global_step'] == $want_global" 'j["test_accuracy"] >= 0.8')
  acc=$(sed -nE 's/.*"test_accuracy":([0-9.]+).*/\1/p' <<<"$summary")
  [[ $check == ok ]] && pass "train: summary: 2 workers + 1 PS, global_step $want_global, test_accuracy $acc >= 0.8" \
    || fail "train: summary (want global_step $want_global, test_accuracy >= 0.8): $check"
fi
show_job

echo
if [[ $failed -eq 0 ]]; then echo "sbatch_train_test: all assertions passed"; exit 0; fi
echo "sbatch_train_test: $failed assertion(s) failed"
exit 1
