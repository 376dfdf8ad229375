#!/usr/bin/env bash
# preempt_test.sh STRATA_BIN REPO_ROOT -- preemption and requeue through a real Slurm.
#
# Run inside run_with_slurm.sh (private cluster):
#   tests/slurm/run_with_slurm.sh tests/slurm/preempt_test.sh build/bin/strata .
#
# Submits REPO_ROOT/slurm/strata-preempt.sbatch training the MLP on Fashion-MNIST (1 PS + 2
# workers), and once it trains sends `scancel --signal=USR1 --batch` (what --signal=B:USR1@T does
# before a time limit). Checks, in order:
#   1. strata saves at the next step boundary ("preemption: stopping") and exits 75, and the
#      script requeues the job: same job id, PENDING, Restarts=1;
#   2. after `scontrol update StartTime=now` the job runs again with --restore latest: it restores
#      the preemption checkpoint (same global step), resumes, and finishes with status 0;
#   3. the final summary covers the whole run: epochs as asked, global_step = 2 workers x steps.
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

EPOCHS=8
ckpt=$work/ckpt
echo "== sbatch --ntasks=3 $SCRIPT train --num-ps 1 --epochs $EPOCHS"
sbatch --parsable --ntasks=3 --job-name=strata-preempt-test --chdir="$work" --output="$work/job-%j.out" \
  --export=ALL,STRATA="$BIN",STRATA_CHECKPOINT_DIR="$ckpt" \
  "$SCRIPT" train --num-ps 1 --epochs "$EPOCHS" --log-every 20 --log-every-secs 0 >"$work/sbatch.out" 2>&1
jobid=$(grep -Eo '^[0-9]+' "$work/sbatch.out" | head -n1)
[[ -n $jobid ]] || { echo "FAIL: sbatch: $(cat "$work/sbatch.out")"; exit 1; }
file=$work/job-$jobid.out

# 1. Preempt once it trains.
if ! until_true 90 has_line '^step '; then fail "job $jobid printed no progress line within 90 s"; show_and_exit; fi
pass "job $jobid is training"
scancel --signal=USR1 --batch "$jobid" || fail "scancel --signal=USR1 --batch failed"
if ! until_true 60 requeued; then
  fail "job $jobid was not requeued within 60 s (state $(job_field JobState), restarts $(job_field Restarts))"
  show_and_exit
fi
pass "job $jobid requeued: PENDING, Restarts=1"
save_re="^checkpoint: saved $ckpt/ckpt-([0-9]+)\.h5 \(global step ([0-9]+), .*, preemption: stopping\)$"
line=$(grep -E "$save_re" "$file" | head -n1)
if [[ $line =~ $save_re ]]; then
  stop_step=${BASH_REMATCH[1]}
  pass "preemption checkpoint at global step $stop_step"
else
  fail "no 'checkpoint: saved ... preemption: stopping' line"
  show_and_exit
fi
has_line "run 0: got SIGUSR1, passing it to the strata step" && pass "the batch script forwarded SIGUSR1" \
  || fail "the batch script did not log forwarding SIGUSR1"
has_line "run 0: strata stopped with status 75 \(checkpoint saved\): scontrol requeue $jobid" \
  && pass "strata exited 75 and the script requeued" || fail "no 'stopped with status 75 ... scontrol requeue' line"

# 2. Release it now instead of after Slurm's ~2 min hold. The old batch step must have left the
# node first (see the script's header: released earlier, the restart fails with "Job credential
# revoked"); that takes a few seconds on this single-node cluster, 8 s leaves a margin.
sleep 8
scontrol update JobId="$jobid" StartTime=now || fail "scontrol update StartTime=now failed"
if ! until_true 150 has_line "run 1: strata finished with status"; then
  fail "the requeued run did not finish within 150 s (state $(job_field JobState))"
  show_and_exit
fi
has_line "run 1: strata finished with status 0$" && pass "the requeued run finished with status 0" \
  || fail "the requeued run did not finish with status 0: $(grep 'run 1: strata finished' "$file")"
has_line "^checkpoint: restored 6 variable\(s\) from $ckpt/ckpt-$stop_step\.h5 \(global step $stop_step\)$" \
  && pass "restored ckpt-$stop_step.h5" || fail "no 'checkpoint: restored 6 variable(s) from .../ckpt-$stop_step.h5' line"
has_line "^resuming at epoch [0-9]+, step [0-9]+, global step $stop_step$" && pass "resumed at global step $stop_step" \
  || fail "no 'resuming at ... global step $stop_step' line"

# 3. The summary of the resumed run (the last JSON line) covers the whole training.
summary=$(grep -E '^\{.*"global_step"' "$file" | tail -n1)
check=$(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
ok = j["epochs"] == int(sys.argv[2]) and j["workers"] == 2 and j["global_step"] == 2 * j["steps"] \
     and j["global_step"] > int(sys.argv[3]) and j["restored_from"].endswith("/ckpt-%s.h5" % sys.argv[3]) \
     and not j.get("preempted", False)
print("ok" if ok else "bad: %s" % j)' "$summary" "$EPOCHS" "$stop_step" 2>&1)
[[ $check == ok ]] && pass "final summary: $EPOCHS epochs, global_step = 2 x steps, restored_from ckpt-$stop_step.h5" \
  || fail "final summary: $check"
n_runs=$(grep -c '^{.*"global_step"' "$file")
[[ $n_runs -eq 2 ]] && pass "two runs' summaries in the appended output" || fail "expected 2 summaries, found $n_runs"

if [[ $failed -ne 0 ]]; then show_and_exit; fi
jobid=""
echo "preempt_test: all assertions passed"
