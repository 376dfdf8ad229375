# Shared helpers for the CLI test tier. Each test script sources this, runs the strata binary for
# real (under mpirun where it needs ranks) and asserts on exit status, stdout and stderr.
# Environment from CTest: STRATA_BIN, STRATA_MPIEXEC, STRATA_MPIEXEC_FLAGS (;-separated by CMake).
set -uo pipefail

: "${STRATA_BIN:?STRATA_BIN must point at the strata binary}"
MPIEXEC=${STRATA_MPIEXEC:-mpirun}
read -r -a MPIEXEC_FLAGS <<< "${STRATA_MPIEXEC_FLAGS:---oversubscribe --bind-to none}"
if [ "$(id -u)" = 0 ] && [[ " ${MPIEXEC_FLAGS[*]} " != *" --allow-run-as-root "* ]]; then
  MPIEXEC_FLAGS=(--allow-run-as-root "${MPIEXEC_FLAGS[@]}")
fi

TEST_TMP=$(mktemp -d)
trap 'rm -rf "$TEST_TMP"' EXIT
FAILURES=0
CASES=0
OUT="$TEST_TMP/out"
ERR="$TEST_TMP/err"
RC=0

# Never let a strata test inherit a cluster description from the calling shell.
unset TF_CONFIG STRATA_CLUSTER SLURM_PROCID SLURM_JOB_ID SLURM_STEP_NODELIST SLURM_JOB_NODELIST SLURM_NODELIST \
      SLURM_STEP_NUM_TASKS SLURM_NTASKS SLURM_NPROCS SLURM_STEP_TASKS_PER_NODE SLURM_TASKS_PER_NODE \
      SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE
# Nor NCCL's logging: with NCCL_DEBUG set (WARN or above), each GPU worker prints
# "NCCL version 2.x.y+cudaZ" on stdout before strata's startup line (seen on an H200 run).
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE

# run CMD...: runs it with a 120 s guard, capturing stdout/stderr into $OUT/$ERR and status into $RC.
run() {
  timeout 120 "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# mpi NP ARGS...: strata under mpirun with NP ranks.
mpi() {
  local np=$1; shift
  run "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" -np "$np" "$@"
}

fail() {
  echo "FAIL [$CASE]: $*"
  echo "  exit status: $RC"
  echo "  --- stdout ---"; sed 's/^/  /' "$OUT" | head -40
  echo "  --- stderr ---"; sed 's/^/  /' "$ERR" | head -40
  FAILURES=$((FAILURES + 1))
}

# For scripts that train on Fashion-MNIST: sets FMNIST, skips the script (exit 77) when the dataset
# is missing, and makes fail() show the end of the logs (where a training run says what went wrong).
require_fashion_mnist_training() {
  FMNIST=/usr/share/datasets/fashion-mnist
  if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
    echo "SKIP: $FMNIST missing (apt-get install dataset-fashion-mnist)"
    exit 77
  fi
  fail() {
    echo "FAIL [$CASE]: $*"
    echo "  exit status: $RC"
    echo "  --- stdout (tail) ---"; tail -15 "$OUT" | sed 's/^/  /'
    echo "  --- stderr (tail, without auto-shard notes) ---"; grep -v 'auto-shard' "$ERR" | tail -15 | sed 's/^/  /'
    FAILURES=$((FAILURES + 1))
  }
}

case_begin() { CASE=$1; CASES=$((CASES + 1)); echo "== case $CASES ($SECONDS s): $CASE"; }

expect_rc() { [ "$RC" = "$1" ] || fail "expected exit status $1, got $RC"; }
expect_rc_nonzero() { [ "$RC" != 0 ] || fail "expected a non-zero exit status"; }
expect_stdout_has() { grep -qF -- "$1" "$OUT" || fail "stdout lacks '$1'"; }
expect_stderr_has() { grep -qF -- "$1" "$ERR" || fail "stderr lacks '$1'"; }
expect_stdout_empty() { [ ! -s "$OUT" ] || fail "stdout should be empty"; }
# The bad-input contract: exactly one line on stderr.
expect_one_stderr_line() {
  local n
  n=$(wc -l < "$ERR")
  [ "$n" = 1 ] || fail "expected exactly one line on stderr, got $n"
}
# stderr lines containing TEXT, counted.
count_stderr() { grep -cF -- "$1" "$ERR"; }

# json_get EXPR: evaluates a Python expression over the JSON object on stdout line N (default 1), `j`.
json_get() {
  local expr=$1 line=${2:-1}
  sed -n "${line}p" "$OUT" | python3 -c "import json,sys; j=json.load(sys.stdin); print($expr)"
}
# summary: the last line of stdout that is a training summary (a JSON object with global_step);
# summary_get EXPR evaluates a Python expression over it (`j`), or prints the error.
summary() { grep -E '^\{.*"global_step"' "$OUT" | tail -n1; }
summary_get() { summary | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>&1; }
expect_json() {
  local expr=$1 want=$2 line=${3:-1} got
  got=$(json_get "$expr" "$line" 2>&1) || { fail "stdout line $line is not JSON ($got)"; return; }
  [ "$got" = "$want" ] || fail "$expr: expected '$want', got '$got'"
}

finish() {
  if [ "$FAILURES" -gt 0 ]; then
    echo "$FAILURES of $CASES case(s) failed"
    exit 1
  fi
  echo "all $CASES case(s) passed"
  exit 0
}
