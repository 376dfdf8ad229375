#!/usr/bin/env bash
# restart_test.sh STRATA_BIN REPO_ROOT -- STRATA_MAX_RESTARTS through a real Slurm.
#
# Run inside run_with_slurm.sh (private cluster):
#   tests/slurm/run_with_slurm.sh tests/slurm/restart_test.sh build/bin/strata .
#
# Submits the sbatch templates training the MLP on Fashion-MNIST (1 PS + 2 workers, 2 epochs,
# a save every 100 global steps) with STRATA=a wrapper that execs strata and SIGKILLs task 2
# (worker:1) on cue, and checks:
#   1. strata.sbatch, STRATA_MAX_RESTARTS=2, task 2 killed once a checkpoint is committed (first
#      run only): one restart line naming task 2 (worker:1 on this node), the step launched again
#      in the same allocation (no requeue: Restarts=0), "checkpoint: restored", and a final summary
#      with the uninterrupted global step (2 workers x 2 epochs x 60000/2/128 steps) and
#      "restarts": 1; the job COMPLETED with ExitCode 0:0;
#   2. strata-preempt.sbatch, STRATA_MAX_RESTARTS=1, the same kill: the same, without a requeue;
#   3. strata.sbatch, STRATA_MAX_RESTARTS=3, task 2 killed 0.5 s into every run (before any
#      checkpoint): one restart, then "restart 1 made no progress", and the job FAILED.
# Takes about 40 s. Every wait is bounded (3 x 60 s < SLURM_TEST_TIMEOUT).
# shellcheck disable=SC2015,SC2140  # `check && pass || fail`: pass (an echo) never fails; --export=A="x",B="y"
set -uo pipefail   # no -e: every assertion runs and reports

[[ $# -eq 2 ]] || { echo "usage: restart_test.sh STRATA_BIN REPO_ROOT" >&2; exit 2; }
[[ -x $1 ]] || { echo "FAIL: strata binary not found or not executable: $1" >&2; exit 1; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
ROOT=$(cd "$2" && pwd -P) || exit 1
[[ -n ${SLURM_CONF:-} ]] || { echo "restart_test: SLURM_CONF is not set; run under tests/slurm/run_with_slurm.sh" >&2; exit 2; }
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
until_true() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [[ $SECONDS -lt $deadline ]] || return 1
    sleep 0.2
  done
}
job_field() { scontrol show job "$jobid" 2>/dev/null | grep -o "\b$1=[^ ]*" | head -n1 | cut -d= -f2; }
finished() { [[ $(job_field JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
has_line() { grep -qE -- "$1" "$file"; }
show() { echo "---- scontrol show job $jobid ----"; scontrol show job "$jobid" 2>&1; echo "---- job output ----"; cat "$file" 2>&1; }

HOST=$(hostname -s)
EPOCHS=2
n_train=$(python3 -c 'import gzip, struct, sys; print(struct.unpack(">II", gzip.open(sys.argv[1]).read(8))[1])' \
  /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz) || { echo "FAIL: cannot read the dataset header"; exit 1; }
want_global=$((2 * EPOCHS * (n_train / 2 / 128)))

# The tasks' program: strata, except that task 2 is SIGKILLed (the strata process itself) when
# KILL_WHEN says: after-ckpt = once KILL_DIR holds a committed checkpoint, in the first run only;
# early = 0.5 s after it starts, in every run.
cat >"$work/kill_task.sh" <<'EOF'
#!/usr/bin/env bash
if [ "$SLURM_PROCID" = 2 ]; then
  me=$$
  case $KILL_WHEN in
    after-ckpt)
      if [ "${STRATA_RESTART_COUNT:-0}" = 0 ]; then
        ( for _ in $(seq 1200); do compgen -G "$KILL_DIR/ckpt-*.h5" >/dev/null && break; sleep 0.05; done
          kill -9 "$me" ) &
      fi ;;
    early) ( sleep 0.5; kill -9 "$me" ) & ;;
  esac
fi
exec "$REAL_STRATA" "$@"
EOF
chmod +x "$work/kill_task.sh"

# submit NAME SCRIPT MAX WHEN: submits SCRIPT training into $work/NAME with STRATA_MAX_RESTARTS
# MAX and the kill cue WHEN; waits (60 s at most) for it to end. Sets jobid, file, ck.
submit() {
  local name=$1 script=$2 max=$3 when=$4
  ck=$work/$name/ck
  mkdir -p "$work/$name"
  echo "== $name: sbatch --ntasks=3 slurm/$script, STRATA_MAX_RESTARTS=$max, kill $when"
  sbatch --parsable --ntasks=3 --job-name="strata-restart-$name" --chdir="$work/$name" --output="$work/$name/job-%j.out" \
    --export=ALL,STRATA="$work/kill_task.sh",REAL_STRATA="$BIN",KILL_WHEN="$when",KILL_DIR="$ck",STRATA_MAX_RESTARTS="$max" \
    "$ROOT/slurm/$script" train --model mlp --data fashion-mnist --num-ps 1 --epochs "$EPOCHS" --log-every 0 \
    --checkpoint-dir "$ck" --save-every-steps 100 >"$work/sbatch.out" 2>&1
  jobid=$(grep -Eo '^[0-9]+' "$work/sbatch.out" | head -n1)
  [[ -n $jobid ]] || { echo "FAIL: sbatch: $(cat "$work/sbatch.out")"; exit 1; }
  file=$work/$name/job-$jobid.out
  local t0=$SECONDS
  if ! until_true 60 finished; then fail "$name: job $jobid did not end within 60 s (state $(job_field JobState))"; show; return 1; fi
  echo "   job $jobid $(job_field JobState) after $((SECONDS - t0)) s"
}
# summary_check WANT: the last summary line's global_step and restarts against "WANT".
summary_check() {
  local got
  got=$(grep -E '^\{.*"global_step"' "$file" | tail -n1 | python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["global_step"], j["restarts"])' 2>&1)
  [[ $got == "$1" ]] && pass "$name: summary global_step, restarts: $got" || fail "$name: summary global_step, restarts: '$got', expected '$1'"
}

for spec in "plain strata.sbatch 2 strata.sbatch" "preempt strata-preempt.sbatch 1 strata-preempt.sbatch: job [0-9]+ run 0"; do
  read -r name script max prog <<<"$spec"
  submit "$name" "$script" "$max" after-ckpt || continue
  before=$failed
  [[ $(job_field JobState) == COMPLETED && $(job_field ExitCode) == 0:0 && $(job_field Restarts) == 0 ]] \
    && pass "$name: COMPLETED, ExitCode=0:0, Restarts=0 (restarted inside the allocation, never requeued)" \
    || fail "$name: $(job_field JobState) ExitCode=$(job_field ExitCode) Restarts=$(job_field Restarts)"
  [[ $(grep -cE ": restart [0-9]+ of " "$file") == 1 ]] && has_line "^$prog: restart 1 of $max: task 2 \(worker:1 on $HOST\): Killed \(srun status [0-9]+\); launching the step again with --restore latest \(latest checkpoint: ckpt-[0-9]+\.h5\)$" \
    && pass "$name: $(grep ': restart 1 of' "$file")" || fail "$name: no single restart line naming task 2 (worker:1 on $HOST)"
  has_line '^checkpoint: restored [0-9]+ variable\(s\) from .*/ckpt-[0-9]+\.h5 \(global step [0-9]+\)$' \
    && pass "$name: $(grep -m1 '^checkpoint: restored' "$file")" || fail "$name: no 'checkpoint: restored' line"
  summary_check "$want_global 1"
  (( failed == before )) || show
done

name=norestart
if submit "$name" strata.sbatch 3 early; then
  before=$failed
  [[ $(job_field JobState) == FAILED ]] && pass "$name: FAILED ($(job_field ExitCode))" || fail "$name: state $(job_field JobState), expected FAILED"
  [[ $(grep -cE ": restart [0-9]+ of " "$file") == 1 ]] && pass "$name: exactly one restart" || fail "$name: expected exactly one restart line"
  has_line "^strata.sbatch: not restarting: restart 1 made no progress \(no checkpoint newer than none in $ck\) and failed again: task 2 \(worker:1 on $HOST\): Killed \(srun status [0-9]+\)$" \
    && pass "$name: $(grep 'not restarting' "$file")" || fail "$name: no 'restart 1 made no progress' line"
  (( failed == before )) || show
fi

jobid=""
if [[ $failed -ne 0 ]]; then
  echo "restart_test: $failed assertion(s) failed"
  exit 1
fi
echo "restart_test: all assertions passed"
