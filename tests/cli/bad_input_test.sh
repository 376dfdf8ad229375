#!/usr/bin/env bash
# Bad input gets exactly one clear line on stderr and exit status 2 (issue: foundation, DESIGN 7).
source "$(dirname "$0")/lib.sh"

GOOD_CLUSTER='{"ps":["p:1"],"worker":["w0:1","w1:1"]}'

case_begin "malformed TF_CONFIG"
run env TF_CONFIG='{"cluster": {"worker": ["a:1"]' "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "TF_CONFIG is not valid JSON"; expect_stdout_empty

case_begin "TF_CONFIG not an object"
run env TF_CONFIG='[1,2]' "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "TF_CONFIG must be a JSON object"

case_begin "task type not in the cluster"
run env TF_CONFIG="{\"cluster\": $GOOD_CLUSTER, \"task\": {\"type\": \"chief\", \"index\": 0}}" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "task type 'chief' is not a job of the cluster"

case_begin "task index out of range"
run env TF_CONFIG="{\"cluster\": $GOOD_CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 2}}" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "task index 2 is out of range for job 'worker'"

case_begin "non-integer task index"
run env TF_CONFIG="{\"cluster\": $GOOD_CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 1.5}}" "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "task index 1.5"

case_begin "missing SLURM_PROCID"
run env SLURM_STEP_NODELIST=n1 SLURM_STEP_TASKS_PER_NODE=2 "$STRATA_BIN" cluster --resolver slurm
expect_rc 2; expect_one_stderr_line; expect_stderr_has "SLURM_PROCID is not set"

case_begin "bad hostlist in the Slurm environment"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST='n[3-1]' SLURM_STEP_TASKS_PER_NODE=2 \
  "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "SLURM_STEP_NODELIST"

case_begin "bad hostlist (strata slurm hostnames)"
# (scontrol itself accepts an unclosed 'n[1-3' and prints 'n]'; strata does the same.)
run "$STRATA_BIN" slurm hostnames 'n[1-2]]'
expect_rc 2; expect_one_stderr_line; expect_stderr_has "n[1-2]]"; expect_stdout_empty

case_begin "bad tasks-per-node list"
run "$STRATA_BIN" slurm tasks-per-node '2(x0),1'
expect_rc 2; expect_one_stderr_line; expect_stderr_has "2(x0),1"; expect_stdout_empty

case_begin "bad tasks-per-node in the Slurm environment"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST=n1 SLURM_STEP_TASKS_PER_NODE='two' \
  "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "SLURM_STEP_TASKS_PER_NODE"

case_begin "jobs that do not add up to the step's tasks"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_NODELIST='n[1-2]' SLURM_STEP_TASKS_PER_NODE='2(x2)' \
  "$STRATA_BIN" cluster --jobs ps=1,worker=2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "ask for 3 tasks but the Slurm step has 4"

case_begin "more GPUs per task than the node has"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_NODELIST='n[1-2]' SLURM_STEP_TASKS_PER_NODE='2(x2)' \
  "$STRATA_BIN" cluster --gpus-per-node 2 --gpus-per-task 2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "a node has 2"

case_begin "malformed jobs spec"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST=n1 SLURM_STEP_TASKS_PER_NODE=2 \
  "$STRATA_BIN" cluster --jobs ps:1,worker=1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--jobs"

case_begin "unknown flag on a command"
run "$STRATA_BIN" cluster --bogus
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--bogus"

case_begin "unknown top-level flag"
run "$STRATA_BIN" --frobnicate
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--frobnicate"

case_begin "unknown command"
run "$STRATA_BIN" frobnicate
expect_rc 2; expect_one_stderr_line; expect_stderr_has "frobnicate"

case_begin "no command"
run "$STRATA_BIN"
expect_rc 2; expect_one_stderr_line

case_begin "non-numeric port base"
run "$STRATA_BIN" cluster --cluster "$GOOD_CLUSTER" --port-base 88a8
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--port-base: '88a8' is not an integer"

case_begin "non-numeric task id"
run "$STRATA_BIN" cluster --cluster "$GOOD_CLUSTER" --task-type worker --task-id one
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--task-id: 'one' is not an integer"

case_begin "negative GPU count"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST=n1 SLURM_STEP_TASKS_PER_NODE=2 \
  "$STRATA_BIN" cluster --gpus-per-node=-1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--gpus-per-node"

case_begin "port out of range"
run "$STRATA_BIN" cluster --cluster "$GOOD_CLUSTER" --port-base 70000
expect_rc 2; expect_one_stderr_line; expect_stderr_has "out of range"

case_begin "non-numeric SLURM_PROCID"
run env SLURM_PROCID=x SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST=n1 SLURM_STEP_TASKS_PER_NODE=2 "$STRATA_BIN" cluster
expect_rc 2; expect_one_stderr_line; expect_stderr_has "SLURM_PROCID: 'x' is not an integer"

case_begin "unknown resolver"
run "$STRATA_BIN" cluster --resolver kubernetes
expect_rc 2; expect_one_stderr_line; expect_stderr_has "kubernetes"

case_begin "bad STRATA_LOG_LEVEL"
run env STRATA_LOG_LEVEL=loud "$STRATA_BIN" slurm hostnames n1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_LOG_LEVEL: 'loud'"

case_begin "bad STRATA_TIMEOUT_S"
run env STRATA_TIMEOUT_S=soon "$STRATA_BIN" cluster --verify --cluster "$GOOD_CLUSTER"
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_TIMEOUT_S: 'soon'"

case_begin "missing --cluster file"
run "$STRATA_BIN" cluster --cluster /nonexistent/cluster.json
expect_rc 2; expect_one_stderr_line; expect_stderr_has "cannot read file '/nonexistent/cluster.json'"

case_begin "--num-ps leaving no worker"
run "$STRATA_BIN" cluster --resolver mpi --num-ps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "leaves no worker"

case_begin "a usage error under mpirun is said once for the job, not once per rank"
mpi 3 "$STRATA_BIN" train --epochs 1 --no-such-flag
expect_rc 2
[ "$(grep -c '^strata: error: ' "$ERR")" = 1 ] || fail "expected one 'strata: error:' line for 3 ranks"
expect_stderr_has "strata: error: The following argument was not expected: --no-such-flag"
mpi 3 "$STRATA_BIN" train --stall-timeout=-1
expect_rc 2
[ "$(grep -c '^strata: error: ' "$ERR")" = 1 ] || fail "expected one '--stall-timeout must be positive' line for 3 ranks"
expect_stderr_has "strata: error: --stall-timeout must be positive"

case_begin "strata-mpirun: a usage error ends without Open MPI's boilerplate"
run "$STRATA_SOURCE_DIR/mpi_launch/strata-mpirun" --ps 1 --workers 2 -- "$STRATA_BIN" train --epochs 1 --no-such-flag
expect_rc 2
expect_one_stderr_line
expect_stderr_has "strata: error: The following argument was not expected: --no-such-flag"
run "$STRATA_SOURCE_DIR/mpi_launch/strata-mpirun" --ps 1 --workers 2 -- "$STRATA_BIN" train --epochs 1 --global-batch 40000
expect_rc 2
expect_one_stderr_line
expect_stderr_has "strata train: error: --global-batch 40000 is larger"

case_begin "a global batch larger than a worker's share of the data is a usage error naming both numbers"
mpi 3 env STRATA_NUM_PS=1 "$STRATA_BIN" train --epochs 1 --global-batch 40000
expect_rc 2
[ "$(grep -c '^strata train: error: ' "$ERR")" = 1 ] || fail "expected one 'strata train: error:' line"
expect_stderr_has "--global-batch 40000 is larger than a worker's share of the training data (30000 of 60000 examples over 2 worker(s))"

case_begin "an unusable --checkpoint-dir is a usage error before the first step"
mpi 3 env STRATA_NUM_PS=1 "$STRATA_BIN" train --epochs 1 --checkpoint-dir /proc/strata-no-such-dir
expect_rc 2
[ "$(grep -c '^strata train: error: ' "$ERR")" = 1 ] || fail "expected one 'strata train: error:' line"
expect_stderr_has "--checkpoint-dir '/proc/strata-no-such-dir' cannot be created"
grep -q '^step ' "$OUT" && fail "training started although the checkpoint directory is unusable"
mkdir -p "$TEST_TMP/ro" && chmod 0555 "$TEST_TMP/ro"
# As root the mode bits do not stop a write: a read-only bind mount does, where mounts are allowed.
if mount --bind "$TEST_TMP/ro" "$TEST_TMP/ro" 2>/dev/null && mount -o remount,bind,ro "$TEST_TMP/ro" 2>/dev/null; then
  mpi 3 env STRATA_NUM_PS=1 "$STRATA_BIN" train --epochs 1 --checkpoint-dir "$TEST_TMP/ro"
  umount "$TEST_TMP/ro"
  expect_rc 2
  expect_stderr_has "--checkpoint-dir '$TEST_TMP/ro' is not writable: Read-only file system"
else
  umount "$TEST_TMP/ro" 2>/dev/null
  echo "   (read-only case skipped: no bind mounts here)"
fi

finish
