#!/usr/bin/env bash
# launch_step_test.sh REPO_ROOT -- unit check of launch_step in the sbatch scripts, no Slurm.
#
#   tests/slurm/launch_step_test.sh .
#
# strata.sbatch, strata-gpu.sbatch and strata-hetero.sbatch each carry a copy of
# launch_step (srun, then a retry when the step never launched: Slurm 22.05's srun exits 0
# when every task fails to launch). This test
#   1. checks that the three copies (between "# >>> launch_step" and "# <<< launch_step")
#      are the same text, so a fix in one cannot silently miss the others;
#   2. runs each script directly with bash (not through sbatch), with stub `srun` and
#      `sleep` first on PATH and the job's SLURM_* variables set by hand, and checks its
#      status, its output and the srun calls for: a step that runs (status 0, and a
#      failing one: its status, no retry), a step that does not launch once (retried 2 s
#      later, then status 0), never (STRATA_LAUNCH_ATTEMPTS srun calls, then one "did not
#      launch" line and status 1, or srun's own non-zero status), and a bad
#      STRATA_LAUNCH_ATTEMPTS (status 2). strata-hetero.sbatch cannot run for real on the
#      one-node test cluster (slurm.sbatch covers the other two), so this is its check.
# The stub srun prints what Slurm 22.05 printed in these cases (measured; see sbatch_test.sh).
# shellcheck disable=SC2016,SC2034  # the checks are eval'd strings that read out/err/did_not
set -uo pipefail   # no -e: every assertion runs and reports

[[ $# -eq 1 ]] || { echo "usage: launch_step_test.sh REPO_ROOT" >&2; exit 2; }
ROOT=$(cd "$1" && pwd -P) || exit 1
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin" "$work/tmp"

# --- 1. the copies match -------------------------------------------------------------------
scripts=(strata.sbatch strata-gpu.sbatch strata-hetero.sbatch)
for s in "${scripts[@]}"; do
  sed -n '/^# >>> launch_step/,/^# <<< launch_step/p' "$ROOT/slurm/$s" >"$work/$s.fn"
done
if [[ $(grep -c '^launch_step()' "$work/strata.sbatch.fn") == 1 ]]; then pass "strata.sbatch has the launch_step block"
else fail "strata.sbatch: no '# >>> launch_step' ... '# <<< launch_step' block with launch_step() in it"; fi
for s in strata-gpu.sbatch strata-hetero.sbatch; do
  if cmp -s "$work/strata.sbatch.fn" "$work/$s.fn"; then pass "$s: launch_step is the same text as in strata.sbatch"
  else fail "$s: launch_step differs from strata.sbatch's:"; diff "$work/strata.sbatch.fn" "$work/$s.fn" | head -n 20; fi
done

# --- 2. the scripts with a stub srun -------------------------------------------------------
# STUB_PLAN: what each srun call does, comma-separated, the last entry repeating:
#   ok        the step runs: a task line on stdout and on stderr, status 0
#   exit:N    the step runs and a task fails: status N
#   nolaunch[:N]  the step never launches (what 22.05 prints), status N (default 0)
#   kill      a task dies of SIGKILL and srun ends the others: status 137
cat >"$work/bin/srun" <<'EOF'
#!/usr/bin/env bash
n=$(( $(wc -l <"$STUB_DIR/srun.calls") + 1 ))
echo "srun $*" >>"$STUB_DIR/srun.calls"
IFS=, read -ra plan <<<"$STUB_PLAN"
what=${plan[$(( n <= ${#plan[@]} ? n - 1 : ${#plan[@]} - 1 ))]}
case $what in
  ok) echo "task stdout $n"; echo "task stderr $n" >&2; exit 0 ;;
  exit:*) echo "task stderr $n" >&2; echo "srun: error: node1: task 0: Exited with exit code ${what#exit:}" >&2; exit "${what#exit:}" ;;
  nolaunch*)
    echo "srun: launch/slurm: launch_p_step_launch: StepId=1234.$((n - 1)) aborted before step completely launched." >&2
    echo "srun: Job step aborted: Waiting up to 7 seconds for job step to finish." >&2
    echo "srun: error: task 0 launch failed: Unspecified error" >&2
    echo "srun: error: task 1 launch failed: Unspecified error" >&2
    [[ $what == nolaunch:* ]] && exit "${what#nolaunch:}"
    exit 0 ;;
  kill) echo "task stderr $n" >&2; echo "srun: error: node1: task 1: Killed" >&2
        echo "srun: error: node1: task 0: Terminated" >&2; exit 137 ;;
  *) echo "stub srun: bad STUB_PLAN entry '$what'" >&2; exit 99 ;;
esac
EOF
cat >"$work/bin/sleep" <<'EOF'
#!/usr/bin/env bash
echo "sleep $*" >>"$STUB_DIR/sleep.calls"
EOF
chmod +x "$work/bin/srun" "$work/bin/sleep"

# run_script SCRIPT PLAN [VAR=VALUE...]: runs SCRIPT train --flag with the stubs; sets
# st (status), out, err, calls (srun calls), sleeps (sleep calls).
run_script() {
  local script=$1 plan=$2; shift 2
  : >"$work/srun.calls"; : >"$work/sleep.calls"
  env -i PATH="$work/bin:$PATH" HOME="$HOME" TMPDIR="$work/tmp" STUB_DIR="$work" STUB_PLAN="$plan" \
    SLURM_JOB_ID=1234 SLURM_JOB_NODELIST=node1 SLURM_NTASKS=2 STRATA=/opt/strata \
    STRATA_GPUS_PER_NODE=1 SLURM_NTASKS_HET_GROUP_0=1 SLURM_NTASKS_HET_GROUP_1=1 "$@" \
    timeout 30 bash "$ROOT/slurm/$script" train --flag >"$work/out" 2>"$work/err"
  st=$?
  out=$(cat "$work/out"); err=$(cat "$work/err")
  calls=$(wc -l <"$work/srun.calls"); sleeps=$(tr '\n' ' ' <"$work/sleep.calls")
}
# expect WHAT COND...: COND is a test command; reports WHAT with the script's stderr on failure.
expect() {
  local what=$1; shift
  if "$@"; then pass "$s: $what"; else fail "$s: $what (status $st, $calls srun call(s), sleeps '$sleeps'); stderr:"; sed 's/^/    /' "$work/err"; fi
}
has() { grep -qE -- "$1" <<<"$2"; }
count() { grep -cE -- "$1" <<<"$2"; }

for s in "${scripts[@]}"; do
  did_not="^$s: the strata step did not launch"

  run_script "$s" ok
  expect "a step that runs: status 0, one srun call, its stdout and stderr passed on, no retry" \
    eval '[[ $st == 0 && $calls == 1 && $out == "task stdout 1" ]] && has "^task stderr 1$" "$err" && ! has "did not launch" "$err"'
  expect "srun gets the script's options, the strata binary and the strata arguments" \
    eval 'has " --mpi=pmix --kill-on-bad-exit=1 .*/opt/strata train .*--flag$" "$(cat "$work/srun.calls")"'
  [[ $s == strata-hetero.sbatch ]] && expect "srun runs over both components (--het-group=0,1)" \
    eval 'has "^srun --het-group=0,1 " "$(cat "$work/srun.calls")"'

  run_script "$s" exit:3
  expect "a step whose task fails: srun's status 3, not launched again" \
    eval '[[ $st == 3 && $calls == 1 ]] && ! has "did not launch" "$err"'

  run_script "$s" kill
  expect "a task killed by a signal: srun's status, one line naming the strata task, its role and node" \
    eval '[[ $st == 137 && $calls == 1 ]] && [[ $(count "^$s: task " "$err") == 1 ]] && has "^$s: task 1 \(worker:0 on node1\) died: Killed$" "$err"'

  run_script "$s" nolaunch,ok
  expect "a step that does not launch once: launched again 2 s later, then status 0" \
    eval '[[ $st == 0 && $calls == 2 && $sleeps == "sleep 2 " && $out == "task stdout 2" ]]'
  expect "... srun's launch errors reach the job's stderr, and one retry line" \
    eval 'has "^srun: error: task 0 launch failed: Unspecified error$" "$err" && [[ $(count "$did_not" "$err") == 1 ]] && has "$did_not \(srun status 0\): task 0 launch failed: Unspecified error; launching it again in 2 s \(attempt 2 of 3\)$" "$err"'

  run_script "$s" nolaunch
  expect "a step that never launches: 3 srun calls 2 s apart, then status 1" \
    eval '[[ $st == 1 && $calls == 3 && $sleeps == "sleep 2 sleep 2 " && -z $out ]]'
  expect "... ending with one 'did not launch ... giving up' line, the last line" \
    eval 'has "$did_not \(srun status 0\): task 0 launch failed: Unspecified error; giving up after 3 attempt\(s\) \(STRATA_LAUNCH_ATTEMPTS=3\)$" "$(tail -n1 "$work/err")" && [[ $(count "giving up" "$err") == 1 && $(count "^srun: error: task 1 launch failed" "$err") == 3 ]]'

  run_script "$s" nolaunch STRATA_LAUNCH_ATTEMPTS=1
  expect "STRATA_LAUNCH_ATTEMPTS=1: one srun call, no sleep, status 1" \
    eval '[[ $st == 1 && $calls == 1 && -z $sleeps ]] && has "$did_not .*giving up after 1 attempt" "$err"'

  run_script "$s" nolaunch:2 STRATA_LAUNCH_ATTEMPTS=2
  expect "a launch failure with srun status 2: retried, then srun's status 2" \
    eval '[[ $st == 2 && $calls == 2 ]] && has "$did_not \(srun status 2\)" "$err"'

  run_script "$s" ok STRATA_LAUNCH_ATTEMPTS=x
  expect "STRATA_LAUNCH_ATTEMPTS=x: status 2 with a message, srun not called" \
    eval '[[ $st == 2 && $calls == 0 ]] && has "^$s: STRATA_LAUNCH_ATTEMPTS must be a positive integer" "$err"'

  left=$(find "$work/tmp" -mindepth 1 -maxdepth 1 -printf '%f ')
  if [[ -z $left ]]; then pass "$s: no temporary files left in TMPDIR"
  else fail "$s: left in TMPDIR: $left"; rm -rf "${work:?}/tmp/"*; fi
done

if [[ $failed -ne 0 ]]; then
  echo "launch_step_test: $failed assertion(s) failed"
  exit 1
fi
echo "launch_step_test: all assertions passed"
