#!/usr/bin/env bash
# sbatch_preempt_test.sh STRATA_BIN REPO_ROOT -- preemption and requeue of a 3-node job through a
# real multi-node Slurm: tests/slurm/preempt_test.sh (one node) across the emulated nodes.
#
# Run inside run_on_cluster.sh --slurm 3 (it provides SLURM_CONF and STRATA_CLUSTER_DIR); the
# controller must keep finished jobs for a while (STRATA_SLURM_MIN_JOB_AGE=60, as CTest sets it):
#   STRATA_SLURM_MIN_JOB_AGE=60 tests/cluster/run_on_cluster.sh --slurm 3 \
#     tests/cluster/sbatch_preempt_test.sh build/bin/strata .
#
# Submits `sbatch -N 3 -n 3 --ntasks-per-node=1 slurm/strata-preempt.sbatch train --num-ps 1
# --epochs 4` (1 PS on cn1, workers on cn2 and cn3) with its checkpoint directory on the shared
# file system (under the cluster directory, which every node sees; the PS writes the variables,
# the chief, worker 0 on another node, the checkpoint's metadata), and once it trains sends
# `scancel --signal=USR1 --batch` (what --signal=B:USR1@T does before a time limit). Checks:
#   1. the batch script forwards SIGUSR1 to the step on the 3 nodes; strata saves at the next step
#      boundary ("preemption: stopping") and exits 75; the script requeues the job: same job id,
#      PENDING, Restarts=1, BeginTime about 2 min ahead;
#   2. released with `scontrol update StartTime=now` (and `scontrol release` if held) as early
#      as Slurm allows (see preempt_test.sh for why not in the requeue's second), the job runs
#      again on the 3 nodes with --restore latest: it restores the preemption checkpoint (same
#      global step), resumes and finishes with status 0; the controller shows COMPLETED,
#      ExitCode=0:0, Restarts=1; both runs used the tcp transport over 3 nodes;
#   3. the final summary covers the whole training as an uninterrupted run would: global_step =
#      2 workers x epochs x (60000 / 2 / 128), steps = epochs x (60000 / 2 / 128), accuracy > 0.8;
#      the first run's summary says preempted at the checkpoint's step; `strata ckpt verify`
#      passes on the directory.
# About 35 s (job) + the cluster. Either run losing a rank to the known MPI_Init crash
# (slurm_jobs_lib.sh) makes the whole scenario run once more, with a NOTE line; nothing else does.
# Every wait is bounded (60 + 45 + 1 + 120 + 15 s per attempt).
# shellcheck disable=SC2015  # `check && pass || fail`: pass (an echo) never fails
set -uo pipefail   # no -e: every assertion runs and reports

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=tests/cluster/slurm_jobs_lib.sh
source "$here/slurm_jobs_lib.sh"
sbatch_test_setup sbatch_preempt_test strata-preempt.sbatch "$@"
export STRATA=$BIN

EPOCHS=4
BATCH=128
n_train=$(fashion_mnist_train_count) || { echo "FAIL: cannot read the dataset header"; exit 1; }
steps_per_epoch=$((n_train / 2 / BATCH))
want_steps=$((EPOCHS * steps_per_epoch))
want_global=$((2 * want_steps))
args=(train --model mlp --data fashion-mnist --num-ps 1 --epochs "$EPOCHS" --global-batch "$BATCH"
      --log-every 20 --log-every-secs 0)

has_line() { grep -qE "$1" "$file" 2>/dev/null; }
requeued() { [[ $(job_state "$jobid") == PENDING && $(job_field "$jobid" Restarts) == 1 ]]; }
finished() { is_final_state "$(job_state "$jobid")"; }
training_or_ended() { has_line '^step ' || finished; }
run1_done() { has_line "run 1: (strata finished with status|the strata step did not launch.*giving up)" || finished; }
# The part of the appended output that run N wrote (from its first log line on).
run_text() { awk -v m="run $1: " 'index($0, m) && /^strata-preempt.sbatch: job / {on = 1} on' "$file" 2>/dev/null; }
# crashed_in_mpi_init N: run N ended (or ends) because a rank died in MPI_Init.
crashed_in_mpi_init() { mpi_init_crash "$(run_text "$1")"; }
show_and_stop() {
  echo "---- scontrol show job $jobid ----"; scontrol show job "$jobid" 2>&1
  echo "---- job output ----"; cat "$file" 2>&1
}

# scenario: one submission through to the end. Returns 0 when it ran to the checks (pass or
# fail), 3 when a run lost a rank to the MPI_Init crash (the caller may try once more), 1 when
# it cannot go on.
scenario() {
  ckpt=$work/ckpt-$1
  echo "== sbatch -N 3 -n 3 --ntasks-per-node=1 $SCRIPT ${args[*]}  (uninterrupted: global_step $want_global)"
  export STRATA_CHECKPOINT_DIR=$ckpt
  submit preempt -N 3 -n 3 --ntasks-per-node=1 "$SCRIPT" "${args[@]}" || return 1

  # 1. Preempt once it trains.
  if ! until_true 60 training_or_ended || ! has_line '^step '; then
    if finished && crashed_in_mpi_init 0; then return 3; fi
    fail "job $jobid printed no progress line within 60 s"; show_and_stop; return 1
  fi
  pass "job $jobid is training"
  scancel --signal=USR1 --batch "$jobid" || fail "scancel --signal=USR1 --batch failed"
  if ! until_true 45 requeued; then
    fail "job $jobid was not requeued within 45 s (state $(job_state "$jobid"), restarts $(job_field "$jobid" Restarts))"
    show_and_stop; return 1
  fi
  pending_s=$(date +%s)
  pass "job $jobid requeued: PENDING, Restarts=1"
  local begin begin_s hold line save_re
  begin=$(job_field "$jobid" EligibleTime)
  begin_s=$(date -d "$begin" +%s 2>/dev/null || echo 0)
  hold=$((begin_s - pending_s))
  if ((hold > 60 && hold <= 200)); then pass "requeued job held until $begin (BeginTime ${hold} s ahead)"
  else fail "requeued job's EligibleTime '$begin' is ${hold} s ahead, expected about 2 min"; fi
  save_re="^checkpoint: saved $ckpt/ckpt-([0-9]+)\.h5 \(global step ([0-9]+), .*, preemption: stopping\)$"
  line=$(grep -E "$save_re" "$file" | head -n1)
  if [[ $line =~ $save_re && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]]; then
    stop_step=${BASH_REMATCH[1]}
    pass "preemption checkpoint on the shared file system: $line"
  else
    fail "no 'checkpoint: saved $ckpt/ckpt-N.h5 ... preemption: stopping' line"; show_and_stop; return 1
  fi
  has_line "run 0: got SIGUSR1, passing it to the strata step" && pass "the batch script forwarded SIGUSR1" \
    || fail "the batch script did not log forwarding SIGUSR1"
  has_line "run 0: strata stopped with status 75 \(checkpoint saved\): scontrol requeue $jobid" \
    && pass "strata exited 75 on the 3 nodes and the script requeued" || fail "no 'stopped with status 75 ... scontrol requeue' line"

  # 2. Release as early as is valid (a later second than the requeue's; preempt_test.sh).
  while (($(date +%s) <= pending_s)); do sleep 0.05; done
  if [[ $(job_field "$jobid" Reason) == *Held* || $(job_field "$jobid" Priority) == 0 ]]; then
    scontrol release "$jobid" || fail "scontrol release failed"
  fi
  scontrol update JobId="$jobid" StartTime=now || fail "scontrol update StartTime=now failed"
  if ! until_true 120 run1_done || ! has_line "run 1: strata finished with status"; then
    if finished && crashed_in_mpi_init 1; then return 3; fi
    fail "the requeued run did not finish (within 120 s; state $(job_state "$jobid") Reason=$(job_field "$jobid" Reason))"
    show_and_stop; return 1
  fi
  if ! has_line "run 1: strata finished with status 0$" && crashed_in_mpi_init 1; then return 3; fi
  return 0
}

result=1
for attempt in 1 2; do
  scenario "$attempt"
  result=$?
  [[ $result == 3 && $attempt == 1 ]] || break
  note "job $jobid lost a rank to SIGSEGV before strata printed anything in a run ($(grep -m1 -E 'Segmentation fault' "$file")):" \
    "the known Open MPI 4.1.4 crash in MPI_Init_thread (tests/cluster/README.md, Known issues); running the scenario again once"
  scancel "$jobid" 2>/dev/null
done
if [[ $result == 3 ]]; then fail "the MPI_Init crash again on the second attempt"; show_and_stop; fi
if [[ $result != 0 ]]; then echo "sbatch_preempt_test: $failed assertion(s) failed"; exit 1; fi

if has_line "run 1: the strata step did not launch"; then
  pass "run 1: the first launch failed ($(grep -m1 -E '^srun: .*launch failed' "$file")) and the script launched again"
fi
has_line "run 1: strata finished with status 0$" && pass "the requeued run finished with status 0" \
  || fail "the requeued run did not finish with status 0: $(grep 'run 1: strata finished' "$file")"
if until_true 15 finished; then
  st="$(job_state "$jobid") ExitCode=$(job_field "$jobid" ExitCode) Restarts=$(job_field "$jobid" Restarts)"
  [[ $st == "COMPLETED ExitCode=0:0 Restarts=1" ]] && pass "scontrol show job: $st" \
    || fail "scontrol show job: $st, expected COMPLETED ExitCode=0:0 Restarts=1"
else
  fail "job $jobid not finished in the controller 15 s after the script's last line (state $(job_state "$jobid"))"
fi
for run in 0 1; do
  line=$(run_text "$run" | grep -m1 '^strata train: transport')
  [[ $line == *"transport tcp"*"3 node(s)"* ]] && pass "run $run: transport tcp over 3 nodes" \
    || fail "run $run: transport line is '${line:-missing}'"
done
has_line "^checkpoint: restored 6 variable\(s\) from $ckpt/ckpt-$stop_step\.h5 \(global step $stop_step\)$" \
  && pass "$(grep -m1 '^checkpoint: restored' "$file")" || fail "no 'checkpoint: restored 6 variable(s) from .../ckpt-$stop_step.h5' line"
has_line "^resuming at epoch [0-9]+, step [0-9]+, global step $stop_step$" && pass "$(grep -m1 '^resuming at epoch' "$file")" \
  || fail "no 'resuming at ... global step $stop_step' line"

# 3. The summaries: the first run's stops at the preemption save, the last covers everything.
n_runs=$(grep -c '^{.*"global_step"' "$file")
[[ $n_runs -eq 2 ]] && pass "two runs' summaries in the appended output" || fail "expected 2 summaries, found $n_runs"
first=$(grep -E '^\{.*"global_step"' "$file" | head -n1)
summary=$(grep -E '^\{.*"global_step"' "$file" | tail -n1)
check=$(json_check "$first" 'j.get("preempted") is True' "j['global_step'] == $stop_step")
[[ $check == ok ]] && pass "first run's summary: preempted, global_step $stop_step" || fail "first run's summary: $check"
check=$(json_check "$summary" "j['epochs'] == $EPOCHS" 'j["workers"] == 2' "j['steps'] == $want_steps" \
          "j['global_step'] == $want_global" "j.get('restored_from', '').endswith('/ckpt-$stop_step.h5')" \
          'not j.get("preempted", False)' 'j["test_accuracy"] > 0.8')
acc=$(sed -nE 's/.*"test_accuracy":([0-9.]+).*/\1/p' <<<"$summary")
[[ $check == ok ]] && pass "final summary: global_step $want_global, steps $want_steps as uninterrupted (2 x $EPOCHS x $steps_per_epoch), test_accuracy $acc, restored_from ckpt-$stop_step.h5" \
  || fail "final summary (want global_step $want_global, steps $want_steps): $check"
if out=$("$BIN" ckpt verify "$ckpt" 2>&1); then pass "strata ckpt verify $ckpt: ok"
else fail "strata ckpt verify $ckpt: $(tail -n1 <<<"$out")"; fi

if [[ $failed -ne 0 ]]; then
  show_and_stop
  echo "sbatch_preempt_test: $failed assertion(s) failed"
  exit 1
fi
jobid=""
echo "sbatch_preempt_test: all assertions passed"
