#!/usr/bin/env bash
# sbatch_test.sh STRATA_BIN REPO_ROOT -- submit slurm/strata.sbatch for real and check it.
#
# Run inside run_with_slurm.sh (private cluster):
#   tests/slurm/run_with_slurm.sh tests/slurm/sbatch_test.sh build/bin/strata .
#
# Every job runs `strata cluster --verify --jobs ps=1,worker=3` on 4 tasks and is watched
# in scontrol until it ends (JobState, ExitCode). Cases:
#   1. normal: COMPLETED, ExitCode=0:0, the job's output holds the chief's table (4 rows,
#      rank 0 ps:0, ranks 1..3 worker:0..2) and the "# ok:" line, and no launch retry.
#   2. the step never launches (STRATA_SRUN_ARGS="--output=<missing dir>/task-%t.out": each
#      slurmstepd fails to open its task's output, and Slurm 22.05's srun prints "srun: error:
#      task 0 launch failed: Slurmd could not connect IO" and exits 0), with
#      STRATA_LAUNCH_ATTEMPTS=2: FAILED with a non-zero ExitCode, srun's errors of both
#      attempts in the job's output, one retry line and, last, one line "strata.sbatch: the
#      strata step did not launch (srun status 0): ... giving up after 2 attempt(s)".
#   3. the step does not launch once, for the reason seen in practice: the job is submitted
#      held, and a directory pmix.<job>.0 is put in slurmd's spool first, as a lingering step
#      daemon of an earlier run of the job id leaves it; step 0 aborts ("aborted before step
#      completely launched", "task 0 launch failed: Unspecified error", srun status 0), the
#      script launches step 1 2 s later, and the job is COMPLETED with the table.
#   4. strata-gpu.sbatch (STRATA_GPUS_PER_NODE=1 on this GPU-less node), step never launches,
#      STRATA_LAUNCH_ATTEMPTS=1: FAILED with its own "strata-gpu.sbatch: the strata step did
#      not launch" line. (strata-hetero.sbatch needs 2+ nodes: launch_step_test.sh covers it.)
#   5. an srun that outlives its step (a stub srun that runs the real one, then stays), with
#      STRATA_STEP_EXIT_GRACE=4: FAILED within seconds, one 'srun still runs' line, the table.
# Before the launch check, cases 2 and 4 ended COMPLETED with ExitCode=0:0.
#
# Environment: STRATA_SBATCH_TIMEOUT (default 60 s) bounds each job, pending included.
# shellcheck disable=SC2015  # `check && pass || fail`: pass (an echo) never fails
set -uo pipefail   # no -e: every assertion runs and reports

[[ $# -eq 2 ]] || { echo "usage: sbatch_test.sh STRATA_BIN REPO_ROOT" >&2; exit 2; }
[[ -x $1 ]] || { echo "FAIL: strata binary not found or not executable: $1" >&2; exit 1; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
ROOT=$(cd "$2" && pwd -P) || exit 1
SCRIPT=$ROOT/slurm/strata.sbatch
GPU_SCRIPT=$ROOT/slurm/strata-gpu.sbatch
for f in "$SCRIPT" "$GPU_SCRIPT"; do [[ -f $f ]] || { echo "FAIL: $f not found" >&2; exit 1; }; done
[[ -n ${SLURM_CONF:-} ]] || { echo "sbatch_test: SLURM_CONF is not set; run under tests/slurm/run_with_slurm.sh" >&2; exit 2; }
LIMIT=${STRATA_SBATCH_TIMEOUT:-60}
# slurm_up.sh: SlurmdSpoolDir=DIR/spool/%n.
SPOOL=${STRATA_SLURM_DIR:?}/spool/${STRATA_SLURM_NODE:?}

work=$(mktemp -d)
jobid=""
cleanup() {
  [[ -n $jobid ]] && scancel "$jobid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
case_failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); case_failed=1; }

# run_job NAME HOLD_HOOK [VAR=VALUE...] -- SBATCH_ARGS... SCRIPT ARGS...
# Submits with the VARs in the job's environment (--export=ALL), the job's files in $work;
# if HOLD_HOOK is not "-", submits held, runs `HOLD_HOOK JOBID`, then releases. Watches the
# job in scontrol (0.2 s polls, well inside MinJobAge) until it ends. Sets jobid, state,
# exitcode, file (the job's output) and out (its text). Returns 1 if it never got there.
run_job() {
  local name=$1 hook=$2 vars=() hold=() line deadline
  shift 2
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  state="" exitcode="" out="" jobid="" file="" case_failed=0
  [[ $hook == - ]] || hold=(--hold)
  echo "== ${vars[*]} sbatch ${hold[*]} $*"
  jobid=$(env STRATA="$BIN" "${vars[@]}" sbatch --parsable "${hold[@]}" --job-name="strata-sbatch-$name" \
            --chdir="$work" --output="$work/$name-%j.out" --export=ALL "$@" 2>"$work/$name.sbatch.err")
  jobid=$(grep -Eo '^[0-9]+' <<<"$jobid" | head -n1)
  if [[ -z $jobid ]]; then
    fail "$name: sbatch failed: $(tail -n1 "$work/$name.sbatch.err")"
    return 1
  fi
  file=$work/$name-$jobid.out
  if [[ $hook != - ]]; then
    "$hook" "$jobid" || { fail "$name: $hook $jobid failed"; return 1; }
    scontrol release "$jobid" || { fail "$name: scontrol release $jobid failed"; return 1; }
  fi
  deadline=$((SECONDS + LIMIT))
  while :; do
    line=$(scontrol show job -o "$jobid" 2>/dev/null)
    state=$(grep -o '\bJobState=[^ ]*' <<<"$line" | cut -d= -f2)
    exitcode=$(grep -o '\bExitCode=[^ ]*' <<<"$line" | cut -d= -f2)
    case $state in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) break ;;
    esac
    if (( SECONDS >= deadline )); then
      fail "$name: job $jobid not finished within ${LIMIT} s (state '${state:-no record}')"
      scancel "$jobid" 2>/dev/null
      return 1
    fi
    sleep 0.2
  done
  out=$(cat "$file" 2>/dev/null)
  jobid=""   # ended: nothing to cancel
  echo "   job ended: JobState=$state ExitCode=$exitcode"
  return 0
}
has() { grep -qE -- "$1" <<<"$out"; }
count() { grep -cE -- "$1" <<<"$out"; }
show() { [[ $case_failed == 0 || -z $file ]] || { echo "---- job output $file ----"; cat "$file" 2>&1; }; }
check_table() {   # NAME: the chief's verify table in $out
  local got want="0=ps:0 1=worker:0 2=worker:1 3=worker:2 "
  has '^# strata cluster --verify:.*resolver slurm' && pass "$1: output has the '# strata cluster --verify: ... resolver slurm' header" \
    || fail "$1: output lacks a '# strata cluster --verify: ... resolver slurm' header"
  got=$(awk '!/^#/ && $1 ~ /^[0-9]+$/ {printf "%s=%s ", $1, $2}' <<<"$out")
  [[ $got == "$want" ]] && pass "$1: table rows: ${want% }" || fail "$1: table rows are '${got% }', expected '${want% }'"
  has '^# ok:' && pass "$1: '# ok:' line present" || fail "$1: no '# ok:' line"
}
VERIFY=(cluster --verify --jobs 'ps=1,worker=3')
DID_NOT='^strata.sbatch: the strata step did not launch \(srun status 0\): '

# --- 1. normal ------------------------------------------------------------------------------
if run_job normal - -- --ntasks=4 "$SCRIPT" "${VERIFY[@]}"; then
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "normal: COMPLETED, ExitCode=0:0" \
    || fail "normal: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  check_table normal
  ! has 'did not launch' && pass "normal: no launch retry" || fail "normal: a 'did not launch' line"
fi
show

# --- 2. the step never launches -----------------------------------------------------------
if run_job nolaunch - STRATA_SRUN_ARGS="--output=$work/no-such-dir/task-%t.out" STRATA_LAUNCH_ATTEMPTS=2 \
     -- --ntasks=4 "$SCRIPT" "${VERIFY[@]}"; then
  [[ $state == FAILED && $exitcode != 0:0 && -n $exitcode ]] && pass "nolaunch: FAILED, ExitCode=$exitcode" \
    || fail "nolaunch: JobState=$state ExitCode=$exitcode, expected FAILED with a non-zero exit code"
  n=$(count '^srun: error: task 0 launch failed: ')
  [[ $n == 2 ]] && pass "nolaunch: srun's launch errors of both attempts are in the job's output" \
    || fail "nolaunch: $n 'srun: error: task 0 launch failed' line(s), expected 2 (one per attempt)"
  [[ $(count "${DID_NOT}.*launching it again in 2 s \(attempt 2 of 2\)$") == 1 ]] && pass "nolaunch: one retry line" \
    || fail "nolaunch: no single 'launching it again in 2 s (attempt 2 of 2)' line"
  last=$(tail -n1 <<<"$out")
  [[ $(count 'giving up') == 1 ]] && grep -qE "${DID_NOT}task 0 launch failed: .*; giving up after 2 attempt\(s\)" <<<"$last" \
    && pass "nolaunch: one final line: $last" \
    || fail "nolaunch: the last line is not the one 'strata.sbatch: the strata step did not launch (srun status 0): ... giving up after 2 attempt(s)' line: '$last'"
  ! has '^# ok:' && pass "nolaunch: strata never ran" || fail "nolaunch: strata's '# ok:' line in the output"
fi
show

# --- 3. the step does not launch once (PMIx directory of step 0 taken) --------------------
block_step0() { mkdir -p "$SPOOL/pmix.$1.0"; }
if run_job retry block_step0 -- --ntasks=4 "$SCRIPT" "${VERIFY[@]}"; then
  if has 'aborted before step completely launched|task 0 launch failed'; then
    pass "retry: step 0 did not launch: $(grep -m1 -E 'task 0 launch failed' <<<"$out")"
  else
    fail "retry: step 0 launched although $SPOOL/pmix.<job>.0 existed (did Slurm's PMIx layout change?)"
  fi
  [[ $state == COMPLETED && $exitcode == 0:0 ]] && pass "retry: COMPLETED, ExitCode=0:0" \
    || fail "retry: JobState=$state ExitCode=$exitcode, expected COMPLETED 0:0"
  [[ $(count "${DID_NOT}task 0 launch failed: Unspecified error; launching it again in 2 s \(attempt 2 of 3\)$") == 1 ]] \
    && pass "retry: one retry line" || fail "retry: no single 'did not launch (srun status 0): task 0 launch failed: Unspecified error; launching it again in 2 s (attempt 2 of 3)' line"
  ! has 'giving up' && pass "retry: no 'giving up' line" || fail "retry: a 'giving up' line"
  check_table retry
fi
show

# --- 4. strata-gpu.sbatch: the step never launches -------------------------------------------
# Its #SBATCH defaults (2 nodes x 4 GPUs) are overridden to fit the one GPU-less node.
if run_job gpu - STRATA_GPUS_PER_NODE=1 STRATA_SRUN_ARGS="--output=$work/no-such-dir/task-%t.out" STRATA_LAUNCH_ATTEMPTS=1 \
     -- --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
     "$GPU_SCRIPT" cluster --verify --jobs ps=1,worker=1; then
  [[ $state == FAILED && $exitcode != 0:0 && -n $exitcode ]] && pass "gpu: FAILED, ExitCode=$exitcode" \
    || fail "gpu: JobState=$state ExitCode=$exitcode, expected FAILED with a non-zero exit code"
  last=$(tail -n1 <<<"$out")
  grep -qE '^strata-gpu.sbatch: the strata step did not launch \(srun status 0\): task 0 launch failed: .*giving up after 1 attempt\(s\)' <<<"$last" \
    && pass "gpu: final line: $last" || fail "gpu: the last line is not 'strata-gpu.sbatch: the strata step did not launch ...': '$last'"
fi
show

# --- 5. an srun that outlives its step ------------------------------------------------------
# What Slurm 22.05's srun did with a heterogeneous step (tests/cluster/README.md, Known issues):
# the step ends, srun does not. A wrapper named srun first on the job's PATH runs the real srun,
# then stays (its sleep ends with it). With STRATA_STEP_EXIT_GRACE=4 the script's watchdog sees
# the step gone from squeue, ends "srun" with one line, and the job FAILS within seconds instead
# of holding the allocation.
mkdir -p "$work/hang-bin"
printf '%s
' '#!/bin/bash' "$(command -v srun) \"\$@\"; rc=\$?" \
  'sleep 300 & sp=$!' 'trap "kill \$sp 2>/dev/null; exit 143" TERM' 'wait $sp; exit $rc' >"$work/hang-bin/srun"
chmod +x "$work/hang-bin/srun"
start=$SECONDS
if run_job hang - PATH="$work/hang-bin:$PATH" STRATA_STEP_EXIT_GRACE=4 -- --ntasks=4 "$SCRIPT" "${VERIFY[@]}"; then
  took=$((SECONDS - start))
  [[ $state == FAILED && $exitcode != 0:0 && -n $exitcode ]] && pass "hang: FAILED, ExitCode=$exitcode" \
    || fail "hang: JobState=$state ExitCode=$exitcode, expected FAILED with a non-zero exit code"
  has '^strata.sbatch: srun still runs 4 s after its step ended .*STRATA_STEP_EXIT_GRACE' \
    && pass "hang: one line: $(grep -m1 'srun still runs' <<<"$out")" || fail "hang: no 'srun still runs 4 s after its step ended' line"
  (( took < 40 )) && pass "hang: the job ended ${took} s after submission (the hung srun would have held it 300 s)" \
    || fail "hang: the job took ${took} s"
  check_table hang
fi
show

if [[ $failed -ne 0 ]]; then
  echo "sbatch_test: $failed assertion(s) failed"
  exit 1
fi
echo "sbatch_test: all assertions passed"
