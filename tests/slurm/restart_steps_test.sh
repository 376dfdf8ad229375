#!/usr/bin/env bash
# restart_steps_test.sh REPO_ROOT -- unit check of STRATA_MAX_RESTARTS in the sbatch scripts, no Slurm.
#
#   tests/slurm/restart_steps_test.sh .
#
# strata.sbatch, strata-gpu.sbatch, strata-hetero.sbatch and strata-preempt.sbatch each carry a
# copy of the restarts block (between "# >>> restarts" and "# <<< restarts"). This test
#   1. checks that the four copies are the same text;
#   2. runs each script directly with bash, a stub `srun` first on PATH and the job's SLURM_*
#      variables set by hand, and checks the decisions: a failed train step launched again with
#      --restore latest and STRATA_RESTART_COUNT 1 (one restart line naming task, role, node and
#      status), a later failure after a newer checkpoint restarted again, a failure that repeats
#      without a newer checkpoint stopped with one line, no restart after status 2 or 75 or with
#      STRATA_MAX_RESTARTS unset, and bad settings (status 2, srun never called).
# tests/slurm/restart_test.sh does the same through a real Slurm with a real killed task.
# shellcheck disable=SC2016,SC2034,SC2054  # eval'd checks read err and prog; --jobs values have commas
set -uo pipefail   # no -e: every assertion runs and reports

[[ $# -eq 1 ]] || { echo "usage: restart_steps_test.sh REPO_ROOT" >&2; exit 2; }
ROOT=$(cd "$1" && pwd -P) || exit 1
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin" "$work/tmp"

# --- 1. the copies match ---------------------------------------------------------------------
scripts=(strata.sbatch strata-gpu.sbatch strata-hetero.sbatch strata-preempt.sbatch)
for s in "${scripts[@]}"; do
  sed -n '/^# >>> restarts/,/^# <<< restarts/p' "$ROOT/slurm/$s" >"$work/$s.block"
done
if grep -q '^restarts_next()' "$work/strata.sbatch.block"; then pass "strata.sbatch has the restarts block"
else fail "strata.sbatch: no '# >>> restarts' ... '# <<< restarts' block with restarts_next() in it"; fi
for s in "${scripts[@]:1}"; do
  if cmp -s "$work/strata.sbatch.block" "$work/$s.block"; then pass "$s: the restarts block is the same text as in strata.sbatch"
  else fail "$s: the restarts block differs from strata.sbatch's:"; diff "$work/strata.sbatch.block" "$work/$s.block" | head -n 20; fi
done

# --- 2. the scripts with a stub srun ---------------------------------------------------------
# STUB_PLAN: what each srun call does, comma-separated, the last entry repeating:
#   ok          the step runs: status 0
#   exit:N      task 1 fails with status N (what Slurm 22.05's srun prints)
#   kill        task 2 is killed by a signal (srun status 137)
#   ckpt:S/E    the step commits checkpoint ckpt-S.h5 in $CKPT (checkpoint.json), then plan E
cat >"$work/bin/srun" <<'EOF'
#!/usr/bin/env bash
n=$(( $(wc -l <"$STUB_DIR/srun.calls") + 1 ))
echo "RESTART_COUNT=${STRATA_RESTART_COUNT:-unset} srun $*" >>"$STUB_DIR/srun.calls"
IFS=, read -ra plan <<<"$STUB_PLAN"
what=${plan[$(( n <= ${#plan[@]} ? n - 1 : ${#plan[@]} - 1 ))]}
if [[ $what == ckpt:* ]]; then
  step=${what#ckpt:}; step=${step%%/*}; what=${what#*/}
  mkdir -p "$CKPT"
  printf '{\n  "format_version": 2,\n  "latest": "ckpt-%s.h5"\n}\n' "$step" >"$CKPT/checkpoint.json"
fi
case $what in
  ok) echo "task stdout $n"; exit 0 ;;
  exit:*) echo "task stderr $n" >&2; echo "srun: error: node1: task 1: Exited with exit code ${what#exit:}" >&2; exit "${what#exit:}" ;;
  kill) echo "srun: error: node1: task 2: Killed" >&2; echo "srun: Force Terminated StepId=1234.$((n - 1))" >&2; exit 137 ;;
  *) echo "stub srun: bad STUB_PLAN entry '$what'" >&2; exit 99 ;;
esac
EOF
chmod +x "$work/bin/srun"

# run_script SCRIPT PLAN [VAR=VALUE...] -- STRATA_ARGS...: sets st, err, calls (srun calls).
run_script() {
  local script=$1 plan=$2 vars=()
  shift 2
  while [[ $# -gt 0 && $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  : >"$work/srun.calls"
  rm -rf "$work/ck"
  env -i PATH="$work/bin:$PATH" HOME="$HOME" TMPDIR="$work/tmp" STUB_DIR="$work" STUB_PLAN="$plan" CKPT="$work/ck" \
    SLURM_JOB_ID=1234 SLURM_JOB_NODELIST=node1 SLURM_NTASKS=3 STRATA=/opt/strata STRATA_CHECKPOINT_DIR="$work/ck" \
    STRATA_GPUS_PER_NODE=1 SLURM_NTASKS_HET_GROUP_0=1 SLURM_NTASKS_HET_GROUP_1=2 "${vars[@]}" \
    timeout 60 bash "$ROOT/slurm/$script" "$@" >"$work/out" 2>"$work/err"
  st=$?
  err=$(cat "$work/err")
  calls=$(wc -l <"$work/srun.calls")
}
expect() {
  local what=$1; shift
  if "$@"; then pass "$s: $what"; else fail "$s: $what (status $st, $calls srun call(s)); srun calls and stderr:"; sed 's/^/    /' "$work/srun.calls" "$work/err"; fi
}
has() { grep -qE -- "$1" <<<"$2"; }
call() { sed -n "${1}p" "$work/srun.calls"; }

for s in "${scripts[@]}"; do
  prog=$s
  [[ $s == strata-preempt.sbatch ]] && prog="strata-preempt.sbatch: job 1234 run 0"
  T=(train --jobs ps=1,worker=2 --checkpoint-dir "$work/ck")

  run_script "$s" exit:1,ok STRATA_MAX_RESTARTS=2 -- "${T[@]}"
  expect "a failed train step is launched again: status 0, 2 srun calls" eval '[[ $st == 0 && $calls == 2 ]]'
  expect "... the first with STRATA_RESTART_COUNT=0 and no --restore, the second with 1 and --restore latest after train" \
    eval 'has "^RESTART_COUNT=0 srun .* train .*--jobs" "$(call 1)" && ! has " [-]-restore" "$(call 1)" && has "^RESTART_COUNT=1 srun .*/opt/strata train --restore latest .*--jobs" "$(call 2)"'
  expect "... one restart line naming task, role, node and status" \
    eval 'has "^$prog: restart 1 of 2: task 1 \(worker:0 on node1\) exited with status 1 \(srun status 1\); launching the step again with --restore latest \(latest checkpoint: none\)$" "$err" && [[ $(grep -c "restart 1 of" <<<"$err") == 1 ]]'

  run_script "$s" "ckpt:100/kill,ckpt:300/kill,ok" STRATA_MAX_RESTARTS=3 -- "${T[@]}"
  expect "failures after newer checkpoints are restarted each time: status 0, 3 srun calls, --restore added once" \
    eval '[[ $st == 0 && $calls == 3 && $(grep -o -- "--restore" "$work/srun.calls" | wc -l) == 2 ]] && has "^RESTART_COUNT=2 " "$(call 3)"'
  expect "... a killed task is named (task 2, worker:1)" \
    eval 'has "^$prog: restart 2 of 3: task 2 \(worker:1 on node1\): Killed \(srun status 137\); launching the step again with --restore latest \(latest checkpoint: ckpt-300.h5\)$" "$err"'

  run_script "$s" "ckpt:100/kill,kill" STRATA_MAX_RESTARTS=3 -- "${T[@]}"
  expect "a failure that repeats without a newer checkpoint: one restart, then status 137 and one 'no progress' line" \
    eval '[[ $st == 137 && $calls == 2 ]] && has "^$prog: not restarting: restart 1 made no progress \(no checkpoint newer than ckpt-100.h5 in $work/ck\) and failed again: task 2 \(worker:1 on node1\): Killed \(srun status 137\)$" "$err"'

  run_script "$s" "ckpt:100/kill,ckpt:200/kill" STRATA_MAX_RESTARTS=1 -- "${T[@]}"
  expect "restarts used up: status 137 and one line saying so" \
    eval '[[ $st == 137 && $calls == 2 ]] && has "^$prog: not restarting: task 2 \(worker:1 on node1\): Killed \(srun status 137\), and all 1 restart\(s\) of STRATA_MAX_RESTARTS are used$" "$err"'

  run_script "$s" exit:2 STRATA_MAX_RESTARTS=2 -- "${T[@]}"
  expect "status 2 (usage error): not launched again" eval '[[ $st == 2 && $calls == 1 ]] && ! has "restart" "$err"'

  if [[ $s != strata-preempt.sbatch ]]; then   # (there 75 means a requeue: tests/slurm/preempt_test.sh)
    run_script "$s" exit:75 STRATA_MAX_RESTARTS=2 -- "${T[@]}"
    expect "status 75 (preempted): not launched again, one line" \
      eval '[[ $st == 75 && $calls == 1 ]] && has "^$prog: not restarting: status 75" "$err"'
  fi

  run_script "$s" exit:1,ok -- "${T[@]}"
  expect "STRATA_MAX_RESTARTS unset: a failure ends the job, STRATA_RESTART_COUNT not set" \
    eval '[[ $st == 1 && $calls == 1 ]] && has "^RESTART_COUNT=unset " "$(call 1)" && ! has "restart" "$err"'

  run_script "$s" exit:1,ok STRATA_MAX_RESTARTS=2 -- train --jobs ps=1,worker=2 --checkpoint-dir "$work/ck" --restore "$work/x.h5"
  expect "an explicit --restore is kept, not doubled" \
    eval '[[ $st == 0 && $calls == 2 && $(grep -o -- "--restore" "$work/srun.calls" | wc -l) == 2 ]] && ! has "restore latest" "$(cat "$work/srun.calls")"'

  run_script "$s" ok STRATA_MAX_RESTARTS=x -- "${T[@]}"
  expect "STRATA_MAX_RESTARTS=x: status 2 with one line, srun not called" \
    eval '[[ $st == 2 && $calls == 0 ]] && has "STRATA_MAX_RESTARTS must be a non-negative integer, not .x.$" "$err"'

  if [[ $s != strata-preempt.sbatch ]]; then   # (that script always adds a --checkpoint-dir)
    run_script "$s" ok STRATA_MAX_RESTARTS=1 -- train --jobs ps=1,worker=2
    expect "restarts without --checkpoint-dir: status 2 with one line, srun not called" \
      eval '[[ $st == 2 && $calls == 0 ]] && has "STRATA_MAX_RESTARTS=1 needs --checkpoint-dir" "$err"'
    run_script "$s" exit:1 STRATA_MAX_RESTARTS=1 -- cluster --verify
    expect "other commands are not restarted" eval '[[ $st == 1 && $calls == 1 ]] && ! has "restart" "$err"'
  fi

  left=$(find "$work/tmp" -mindepth 1 -maxdepth 1 -printf '%f ')
  if [[ -z $left ]]; then pass "$s: no temporary files left in TMPDIR"
  else fail "$s: left in TMPDIR: $left"; rm -rf "${work:?}/tmp/"*; fi
done

if [[ $failed -ne 0 ]]; then
  echo "restart_steps_test: $failed assertion(s) failed"
  exit 1
fi
echo "restart_steps_test: all assertions passed"
