#!/usr/bin/env bash
# preempt_test.sh STRATA_BIN REPO_ROOT -- preemption and requeue through a real Slurm.
#
# Run inside run_with_slurm.sh (private cluster):
#   tests/slurm/run_with_slurm.sh tests/slurm/preempt_test.sh build/bin/strata .
#
# Submits REPO_ROOT/slurm/strata-preempt.sbatch training the MLP on Fashion-MNIST (1 PS + 2
# workers, 8 epochs: ~15 s here, so it is still training when signalled), and once it prints a
# progress line sends `scancel --signal=USR1 --batch` (what --signal=B:USR1@T does before a time
# limit). Checks, in order:
#   1. strata saves at the next step boundary ("preemption: stopping") and exits 75, and the
#      script requeues the job: same job id, PENDING, Restarts=1, BeginTime about 2 min ahead;
#   2. after `scontrol update StartTime=now` (and `scontrol release` if held), released as early
#      as Slurm allows, the job runs again with --restore latest (launching its step again if the
#      old run's step daemon still blocked it): it restores the preemption checkpoint (same global
#      step), resumes, and finishes with status 0; the controller shows COMPLETED, ExitCode=0:0;
#   3. the final summary covers the whole training as an uninterrupted run would:
#      global_step = 2 workers x epochs x (60000 / 2 / 128) steps per epoch (a partial last batch
#      is dropped), and steps (per worker) = epochs x steps per epoch.
# Takes about 30 s. Every wait is bounded (60 + 45 + 1 + 120 + 15 s < SLURM_TEST_TIMEOUT=270).
# shellcheck disable=SC2015  # `check && pass || fail`: pass (an echo) never fails
set -uo pipefail   # no -e: every assertion runs and reports

[[ $# -eq 2 ]] || { echo "usage: preempt_test.sh STRATA_BIN REPO_ROOT" >&2; exit 2; }
[[ -x $1 ]] || { echo "FAIL: strata binary not found or not executable: $1" >&2; exit 1; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
ROOT=$(cd "$2" && pwd -P) || exit 1
SCRIPT=$ROOT/slurm/strata-preempt.sbatch
[[ -f $SCRIPT ]] || { echo "FAIL: $SCRIPT not found" >&2; exit 1; }
[[ -n ${SLURM_CONF:-} ]] || { echo "preempt_test: SLURM_CONF is not set; run under tests/slurm/run_with_slurm.sh" >&2; exit 2; }
if [[ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  echo "SKIP: /usr/share/datasets/fashion-mnist missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi

work=$(mktemp -d)
jobid=""
cleanup() {
  [[ -n $jobid ]] && scancel "$jobid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
show_and_exit() {
  echo "---- scontrol show job $jobid ----"; scontrol show job "$jobid" 2>&1
  echo "---- job output ----"; cat "$file" 2>&1
  echo "preempt_test: $failed assertion(s) failed"
  exit 1
}
# until_true SECS CMD...: polls CMD (in this shell) every 0.2 s for at most SECS seconds.
until_true() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [[ $SECONDS -lt $deadline ]] || return 1
    sleep 0.2
  done
}
job_field() { scontrol show job "$jobid" 2>/dev/null | grep -o "\b$1=[^ ]*" | head -n1 | cut -d= -f2; }
has_line() { grep -qE "$1" "$file" 2>/dev/null; }
requeued() { [[ $(job_field JobState) == PENDING && $(job_field Restarts) == 1 ]]; }
finished() { [[ $(job_field JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
run1_done() { has_line "run 1: (strata finished with status|the strata step did not launch.*giving up)" || finished; }

EPOCHS=8
BATCH=128
# Training examples, from the idx header (magic, count), so the expected step count is derived.
n_train=$(python3 -c 'import gzip, struct, sys; print(struct.unpack(">II", gzip.open(sys.argv[1]).read(8))[1])' \
  /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz) || { echo "FAIL: cannot read the dataset header"; exit 1; }
steps_per_epoch=$((n_train / 2 / BATCH))               # per worker: its half of the data, full batches
want_steps=$((EPOCHS * steps_per_epoch))
want_global=$((2 * want_steps))
ckpt=$work/ckpt
args=(train --model mlp --data fashion-mnist --num-ps 1 --epochs "$EPOCHS" --global-batch "$BATCH"
      --log-every 20 --log-every-secs 0)
echo "== sbatch --ntasks=3 $SCRIPT ${args[*]}  (uninterrupted: global_step $want_global)"
sbatch --parsable --ntasks=3 --job-name=strata-preempt-test --chdir="$work" --output="$work/job-%j.out" \
  --export=ALL,STRATA="$BIN",STRATA_CHECKPOINT_DIR="$ckpt" \
  "$SCRIPT" "${args[@]}" >"$work/sbatch.out" 2>&1
jobid=$(grep -Eo '^[0-9]+' "$work/sbatch.out" | head -n1)
[[ -n $jobid ]] || { echo "FAIL: sbatch: $(cat "$work/sbatch.out")"; exit 1; }
file=$work/job-$jobid.out

# 1. Preempt once it trains.
if ! until_true 60 has_line '^step '; then fail "job $jobid printed no progress line within 60 s"; show_and_exit; fi
pass "job $jobid is training"
scancel --signal=USR1 --batch "$jobid" || fail "scancel --signal=USR1 --batch failed"
if ! until_true 45 requeued; then
  fail "job $jobid was not requeued within 45 s (state $(job_field JobState), restarts $(job_field Restarts))"
  show_and_exit
fi
pending_s=$(date +%s)
pass "job $jobid requeued: PENDING, Restarts=1"
# Slurm holds a requeued job back (BeginTime = requeue + ~2 min), shown as EligibleTime.
begin=$(job_field EligibleTime)
begin_s=$(date -d "$begin" +%s 2>/dev/null || echo 0)
hold=$((begin_s - pending_s))
if (( hold > 60 && hold <= 200 )); then pass "requeued job held until $begin (BeginTime ${hold} s ahead)"
else fail "requeued job's EligibleTime '$begin' is ${hold} s ahead, expected about 2 min"; fi
save_re="^checkpoint: saved $ckpt/ckpt-([0-9]+)\.h5 \(global step ([0-9]+), .*, preemption: stopping\)$"
line=$(grep -E "$save_re" "$file" | head -n1)
if [[ $line =~ $save_re && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]]; then
  stop_step=${BASH_REMATCH[1]}
  pass "preemption checkpoint: $line"
else
  fail "no 'checkpoint: saved ... preemption: stopping' line"
  show_and_exit
fi
has_line "run 0: got SIGUSR1, passing it to the strata step" && pass "the batch script forwarded SIGUSR1" \
  || fail "the batch script did not log forwarding SIGUSR1"
has_line "run 0: strata stopped with status 75 \(checkpoint saved\): scontrol requeue $jobid" \
  && pass "strata exited 75 and the script requeued" || fail "no 'stopped with status 75 ... scontrol requeue' line"

# 2. Release it now instead of after Slurm's ~2 min hold, as early as is valid: the requeue
# revokes the job's credential stamped with the requeue's second, and slurmd refuses a new one
# issued in that same second ("Job credential revoked", the job ends FAILED; released 0.3 s after
# PENDING showed, it failed 2 runs out of 2 here). The requeue happened before PENDING showed,
# so releasing in a later second than that is enough. That early, the old run's step daemon
# (PMIx) often still lingers on the node and the new run's first srun cannot launch its step 0;
# the script sees srun's "launch failed" and launches again, which this test then covers too
# (noted below).
while (( $(date +%s) <= pending_s )); do sleep 0.05; done
if [[ $(job_field Reason) == *Held* || $(job_field Priority) == 0 ]]; then
  scontrol release "$jobid" || fail "scontrol release failed"
fi
scontrol update JobId="$jobid" StartTime=now || fail "scontrol update StartTime=now failed"
if ! until_true 120 run1_done || ! has_line "run 1: strata finished with status"; then
  fail "the requeued run did not finish (within 120 s; state $(job_field JobState) Reason=$(job_field Reason))"
  show_and_exit
fi
if has_line "run 1: the strata step did not launch"; then
  pass "run 1: the first launch failed ($(grep -m1 -E '^srun: .*launch failed' "$file")) and the script launched again"
fi
has_line "run 1: strata finished with status 0$" && pass "the requeued run finished with status 0" \
  || fail "the requeued run did not finish with status 0: $(grep 'run 1: strata finished' "$file")"
# The controller's view (MinJobAge=60 from the CTest registration keeps the record long enough).
if until_true 15 finished; then
  state="$(job_field JobState) ExitCode=$(job_field ExitCode) Restarts=$(job_field Restarts)"
  [[ $state == "COMPLETED ExitCode=0:0 Restarts=1" ]] && pass "scontrol show job: $state" \
    || fail "scontrol show job: $state, expected COMPLETED ExitCode=0:0 Restarts=1"
else
  fail "job $jobid not finished in the controller 15 s after the script's last line (state $(job_field JobState))"
fi
has_line "^checkpoint: restored 6 variable\(s\) from $ckpt/ckpt-$stop_step\.h5 \(global step $stop_step\)$" \
  && pass "$(grep -m1 '^checkpoint: restored' "$file")" || fail "no 'checkpoint: restored 6 variable(s) from .../ckpt-$stop_step.h5' line"
has_line "^resuming at epoch [0-9]+, step [0-9]+, global step $stop_step$" && pass "$(grep -m1 '^resuming at epoch' "$file")" \
  || fail "no 'resuming at ... global step $stop_step' line"

# 3. The first run's summary stops at the preemption save; the resumed run's (the last JSON line)
# covers the whole training, exactly as many steps as an uninterrupted run.
n_runs=$(grep -c '^{.*"global_step"' "$file")
[[ $n_runs -eq 2 ]] && pass "two runs' summaries in the appended output" || fail "expected 2 summaries, found $n_runs"
first=$(grep -E '^\{.*"global_step"' "$file" | head -n1)
summary=$(grep -E '^\{.*"global_step"' "$file" | tail -n1)
check=$(python3 -c '
import json, sys
j = json.loads(sys.argv[1]); stop = int(sys.argv[2])
bad = [k for k, ok in [("preempted", j.get("preempted") is True), ("global_step", j["global_step"] == stop)] if not ok]
print("bad %s: %s" % (bad, j) if bad else "ok")' "$first" "$stop_step" 2>&1)
[[ $check == ok ]] && pass "first run's summary: preempted, global_step $stop_step" || fail "first run's summary: $check"
check=$(python3 -c '
import json, sys
j = json.loads(sys.argv[1]); epochs, stop, steps, glob = map(int, sys.argv[2:6])
bad = [k for k, ok in [("epochs", j["epochs"] == epochs), ("workers", j["workers"] == 2),
                       ("steps", j["steps"] == steps), ("global_step", j["global_step"] == glob),
                       ("restored_from", j.get("restored_from", "").endswith("/ckpt-%d.h5" % stop)),
                       ("preempted", not j.get("preempted", False)),
                       ("test_accuracy", j["test_accuracy"] > 0.8)] if not ok]
print("bad %s: %s" % (bad, j) if bad else "ok global_step %d steps %d test_accuracy %s" % (j["global_step"], j["steps"], j["test_accuracy"]))' \
  "$summary" "$EPOCHS" "$stop_step" "$want_steps" "$want_global" 2>&1)
[[ $check == ok* ]] && pass "final summary: ${check#ok }, as uninterrupted (2 x $EPOCHS x $steps_per_epoch), restored_from ckpt-$stop_step.h5" \
  || fail "final summary (want global_step $want_global, steps $want_steps): $check"

if [[ $failed -ne 0 ]]; then show_and_exit; fi
jobid=""
echo "preempt_test: all assertions passed"
