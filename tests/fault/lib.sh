# Shared helpers of the fault tier (tests/fault/README.md). Sourced by fault_test.sh.
#
# A case launches 1 PS + 2 workers through mpi_launch/strata-mpirun, waits until the job is in the
# phase it wants (markers written by the STRATA_TEST_PHASE_DIR hook, or the chief's progress
# lines), sends a real signal to one rank, and measures the time from the signal to the job's exit.
# Every wait here is bounded, and whatever a case started (the job's process group, the ranks it
# found, a tmpfs it mounted) is cleaned up on every exit path by the EXIT trap.
set -uo pipefail

: "${STRATA_BIN:?STRATA_BIN must point at the strata binary}"
FAULT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE_DIR=${STRATA_SOURCE_DIR:-$(cd "$FAULT_DIR/../.." && pwd)}
LAUNCH="$SOURCE_DIR/mpi_launch/strata-mpirun"
HOST=$(hostname -s)

# Never inherit a cluster description, a hook or a timeout from the calling shell.
unset TF_CONFIG STRATA_CLUSTER SLURM_PROCID SLURM_JOB_ID SLURM_STEP_NODELIST SLURM_JOB_NODELIST SLURM_NODELIST \
      SLURM_STEP_NUM_TASKS SLURM_NTASKS SLURM_NPROCS SLURM_STEP_TASKS_PER_NODE SLURM_TASKS_PER_NODE \
      OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE CUDA_VISIBLE_DEVICES
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^STRATA_TEST_\|^STRATA_TIMEOUT_S$\|^STRATA_STALL_TIMEOUT_S$\|^STRATA_MAX_RESTARTS$' || true)

# The tier's knobs: short timeouts keep the tier fast; the slack keeps it robust on a loaded machine.
STALL_S=${STRATA_FAULT_STALL_S:-4}          # --stall-timeout of every job
KILL_BOUND_S=${STRATA_FAULT_KILL_BOUND_S:-10} # a killed rank: the job ends within this
STOP_SLACK_S=${STRATA_FAULT_STOP_SLACK_S:-8}  # a stopped rank: within --stall-timeout + this
GUARD_S=90                                    # no wait of a case ever exceeds this

CASE_TMP=$(mktemp -d /tmp/strata-fault.XXXXXX)
OUT=$CASE_TMP/job.out
ERR=$CASE_TMP/job.err
JOB=""            # PID of the running strata-mpirun (leader of its own process group)
RANK_PIDS=()      # the ranks found while the job ran
STOPPED=()        # processes this case stopped (continued before they are killed)
MOUNTED=""        # a tmpfs this case mounted
FAILURES=0
TIME_TO_END=""

fail() {
  echo "FAIL [$CASE_NAME]: $*"
  FAILURES=$((FAILURES + 1))
}

show_job_output() {
  echo "  --- job stdout (last 25 lines) ---"; tail -n 25 "$OUT" 2>/dev/null | sed 's/^/  /'
  echo "  --- job stderr (last 25 lines) ---"; tail -n 25 "$ERR" 2>/dev/null | sed 's/^/  /'
}

now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# le A B: A <= B for decimals.
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# running PID: the process exists and has not exited (a zombie counts as exited).
running() {
  local state
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

descendants() {
  local p
  for p in $(pgrep -P "$1" 2>/dev/null); do
    echo "$p"
    descendants "$p"
  done
}

# Ends the job, whatever state it is in: stopped processes are continued, then the process group
# and every rank found are killed by PID; the job is reaped (bounded).
kill_job() {
  [ -n "$JOB" ] || return 0
  local p
  for p in "${STOPPED[@]}" "${RANK_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; done
  if running "$JOB"; then
    for p in $(descendants "$JOB"); do RANK_PIDS+=("$p"); done
    kill -KILL -- "-$JOB" 2>/dev/null
  fi
  for p in "${RANK_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  local t=0
  while running "$JOB" && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
  wait "$JOB" 2>/dev/null
  JOB=""
}

cleanup() {
  kill_job
  if [ -n "$MOUNTED" ]; then
    local t=0
    until umount "$MOUNTED" 2>/dev/null || [ $t -ge 50 ]; do sleep 0.1; t=$((t + 1)); done
    mountpoint -q "$MOUNTED" 2>/dev/null && umount -l "$MOUNTED" 2>/dev/null
    MOUNTED=""
  fi
  rm -rf "$CASE_TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# start_job ENV_ASSIGNMENTS... -- TRAIN_ARGS...: strata train, 1 PS + 2 workers, in the
# background, as the leader of a new process group (so cleanup reaches every process it starts).
start_job() {
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  : >"$OUT"; : >"$ERR"
  RANK_PIDS=(); STOPPED=()
  setsid env ${envs[@]+"${envs[@]}"} "$LAUNCH" --ps 1 --workers 2 -- "$STRATA_BIN" train "$@" \
    </dev/null >"$OUT" 2>"$ERR" &
  JOB=$!
}

# dump_ranks: what each rank of a job that did not get where it should is doing: the phases it
# marked (STRATA_TEST_PHASE_DIR), its state and, where gdb is installed, every thread's stack.
dump_ranks() {
  local p r
  echo "  --- ranks of the job (phase markers: $(ls "$CASE_TMP/marks" 2>/dev/null | tr '\n' ' ')) ---"
  for p in $(descendants "$JOB"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = strata ] || continue
    r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    echo "  rank $r pid $p state $(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1) wchan $(cat "/proc/$p/wchan" 2>/dev/null)"
    if command -v gdb >/dev/null; then
      timeout 30 gdb -q -batch -p "$p" -ex 'thread apply all bt 14' 2>/dev/null |
        grep -E '^Thread|^#' | sed 's/^/    /' | head -n 120
    fi
  done
}

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND every 50 ms until it succeeds; fails
# (status 1, after dump_ranks) when the job ended first or SECONDS passed.
wait_for() {
  local what=$1 limit=$2 t0
  shift 2
  t0=$(now)
  while ! "$@"; do
    if ! running "$JOB"; then
      fail "the job ended before $what"
      return 1
    fi
    if ! le "$(elapsed_since "$t0")" "$limit"; then
      fail "no $what within $limit s"
      dump_ranks
      return 1
    fi
    sleep 0.05
  done
}

# rank_pid R: the PID of world rank R of the running job ("" while it does not exist yet).
rank_pid() {
  local p
  for p in $(descendants "$JOB"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = strata ] || continue
    if grep -qxz "OMPI_COMM_WORLD_RANK=$1" "/proc/$p/environ" 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
have_rank() { rank_pid "$1" >/dev/null; }
have_file() { [ -e "$1" ]; }
have_all_files() {
  local f
  for f in "$@"; do [ -e "$f" ] || return 1; done
}
# The chief printed a progress line after resuming (training is under way).
training_started() { grep -q '^step [0-9]* global_step' "$OUT" 2>/dev/null; }

# inject SIGNAL RANK: sends SIGNAL (KILL|STOP) to world rank RANK and notes the time.
inject() {
  local sig=$1 rank=$2 pid
  pid=$(rank_pid "$rank") || { fail "world rank $rank is not running"; return 1; }
  RANK_PIDS+=("$pid")
  for p in $(descendants "$JOB"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = strata ] && RANK_PIDS+=("$p"); done
  [ "$sig" = STOP ] && STOPPED+=("$pid")
  T_FAULT=$(now)
  kill -s "$sig" "$pid"
}

# wait_end BOUND: waits for the job to exit; TIME_TO_END is the time from the fault. A job still
# running at the guard is a hang: it is killed and the case fails.
wait_end() {
  local bound=$1
  while running "$JOB" && le "$(elapsed_since "$T_FAULT")" "$GUARD_S"; do sleep 0.05; done
  TIME_TO_END=$(elapsed_since "$T_FAULT")
  if running "$JOB"; then
    fail "the job still ran $GUARD_S s after the fault (a hang)"
    kill_job
    RC=137
  else
    wait "$JOB"
    RC=$?
    JOB=""
    # The stopped rank may outlive mpirun for a moment: make sure nothing is left behind.
    local p
    for p in "${STOPPED[@]}" "${RANK_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  fi
  echo "  ended $TIME_TO_END s after the fault (status $RC; bound $bound s)"
  le "$TIME_TO_END" "$bound" || fail "the job took $TIME_TO_END s to end after the fault, more than the bound of $bound s"
}

expect_err() { grep -qF -- "$1" "$ERR" || fail "stderr lacks '$1'"; }
expect_out() { grep -qF -- "$1" "$OUT" || fail "stdout lacks '$1'"; }

# latest_step DIR: the global step of DIR's latest committed checkpoint (checkpoint.json).
latest_step() {
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]+"/checkpoint.json")); print(next(c["global_step"] for c in j["checkpoints"] if c["file"]==j["latest"]))' "$1" 2>/dev/null
}

# check_checkpoint DIR MIN_STEP: the latest committed checkpoint is at MIN_STEP or later (nothing
# committed was lost), `strata ckpt verify` passes on it, and `--restore latest` resumes from it
# and completes a few more steps.
check_checkpoint() {
  local dir=$1 min=$2 step
  step=$(latest_step "$dir")
  if [ -z "$step" ]; then fail "no committed checkpoint in $dir after the fault"; return; fi
  [ "$step" -ge "$min" ] || fail "the latest committed checkpoint is at global step $step, older than $min (one was lost)"
  local latest
  latest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/checkpoint.json"))["latest"])' "$dir")
  if ! timeout 60 "$STRATA_BIN" ckpt verify "$dir/$latest" >"$CASE_TMP/verify.out" 2>&1; then
    fail "strata ckpt verify $dir/$latest failed: $(cat "$CASE_TMP/verify.out")"
  fi
  resume "$dir" "$step" "${@:3}"
}

# resume DIR EXPECTED_STEP [TRAIN_ARGS...]: --restore latest from DIR, a few steps, must complete.
resume() {
  local dir=$1 expected=$2
  shift 2
  local worker_step
  worker_step=$(timeout 60 "$STRATA_BIN" ckpt show --json "$dir" 2>/dev/null |
    python3 -c 'import json,sys; print(max(w["step"] for w in json.load(sys.stdin)["training_position"]["workers"]))' 2>/dev/null)
  [ -n "$worker_step" ] || { fail "cannot read the training position of $dir's latest checkpoint"; return; }
  # (the default --stall-timeout: this run measures nothing, and must not fail on a loaded machine)
  start_job -- --checkpoint-dir "$dir" --restore latest --steps $((worker_step + 5)) --epochs 50 \
    --log-every 0 --log-every-secs 0 "$@"
  local t0
  t0=$(now)
  while running "$JOB" && le "$(elapsed_since "$t0")" 60; do sleep 0.05; done
  if running "$JOB"; then
    fail "the --restore latest run did not end within 60 s"
    kill_job
    return
  fi
  wait "$JOB"
  local rc=$?
  JOB=""
  echo "  resumed from global step $expected: status $rc in $(elapsed_since "$t0") s"
  if [ "$rc" != 0 ]; then
    fail "the --restore latest run exited with status $rc"
    show_job_output
    return
  fi
  grep -q "^resuming at epoch .*global step $expected\$" "$OUT" ||
    { fail "the resumed run did not resume at global step $expected"; show_job_output; }
  # The chief's summary line, wherever it falls: the PS's "saved ... final" line may reach the
  # launcher's stdout after it (the ranks' outputs interleave).
  grep -q '^{"test_accuracy"' "$OUT" || { fail "the resumed run printed no summary"; show_job_output; }
}
