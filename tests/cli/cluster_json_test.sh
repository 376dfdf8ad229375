#!/usr/bin/env bash
# `strata cluster` JSON output for each resolver (strata/cluster/resolve.h), no --verify.
source "$(dirname "$0")/lib.sh"

case_begin "TF_CONFIG resolver"
run env TF_CONFIG='{"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"]},
                    "task": {"type": "worker", "index": "1"}, "rpc_layer": "grpc", "environment": "cloud"}' \
  "$STRATA_BIN" cluster
expect_rc 0
expect_json 'j["task"]' "{'type': 'worker', 'index': 1}"
expect_json 'list(j["cluster"].keys())' "['chief', 'worker', 'ps']"
expect_json 'j["cluster"]["worker"]' "['w0:2222', 'w1:2222']"
expect_json 'j["rpc_layer"]' "grpc"
expect_json 'j["environment"]' "cloud"
expect_json 'j["master"]' "grpc://w1:2222"
expect_json 'j["num_accelerators"]' "{'GPU': 0}"
expect_json 'j["resolver"]' "tfconfig"

case_begin "TF_CONFIG sparse job and session_master"
run env TF_CONFIG='{"cluster": {"worker": {"1": "w1:1", "3": "w3:1"}}, "session_master": "grpc://m:1"}' \
  "$STRATA_BIN" cluster
expect_rc 0
expect_json 'j["cluster"]["worker"]' "{'1': 'w1:1', '3': 'w3:1'}"
expect_json 'j["task"]' "None"
expect_json 'j["master"]' "grpc://m:1"

case_begin "--task-type/--task-id override TF_CONFIG"
run env TF_CONFIG='{"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 0}}' \
  "$STRATA_BIN" cluster --task-type ps --task-id 0
expect_rc 0
expect_json 'j["task"]' "{'type': 'ps', 'index': 0}"

case_begin "Slurm resolver, two nodes, GPUs"
run env SLURM_PROCID=3 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_NODELIST='gpu[07-08]' SLURM_STEP_TASKS_PER_NODE='2(x2)' \
  "$STRATA_BIN" cluster --jobs ps=1,worker=3 --gpus-per-node 4
expect_rc 0
expect_json 'j["cluster"]' "{'ps': ['gpu07:8888'], 'worker': ['gpu07:8889', 'gpu08:8888', 'gpu08:8889']}"
expect_json 'j["task"]' "{'type': 'worker', 'index': 2}"
expect_json 'j["cuda_visible_devices"]' "2,3"
expect_json 'j["num_accelerators"]' "{'GPU': 2}"
expect_json 'j["rpc_layer"]' "grpc"
expect_json 'j["resolver"]' "slurm"

case_begin "Slurm resolver keeps Slurm's node order"
run env SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=3 SLURM_STEP_NODELIST='zeta,alpha,mid' SLURM_STEP_TASKS_PER_NODE='1(x3)' \
  "$STRATA_BIN" cluster --port-base 9000
expect_rc 0
expect_json 'j["cluster"]["worker"]' "['zeta:9000', 'alpha:9000', 'mid:9000']"

case_begin "Slurm job-level fallbacks and --no-auto-set-gpu"
run env SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_JOB_NODELIST=n1 SLURM_TASKS_PER_NODE=2 CUDA_VISIBLE_DEVICES=5 \
  "$STRATA_BIN" cluster --no-auto-set-gpu --gpus-per-node 0
expect_rc 0
expect_json 'j["task"]' "{'type': 'worker', 'index': 1}"
expect_json 'j["cuda_visible_devices"]' "5"

case_begin "explicit --cluster job map, task from the launcher rank"
run env OMPI_COMM_WORLD_RANK=2 "$STRATA_BIN" cluster --cluster '{"ps": ["p:1"], "worker": ["w0:1", "w1:1"]}'
expect_rc 0
expect_json 'j["task"]' "{'type': 'worker', 'index': 1}"
expect_json 'j["resolver"]' "explicit"

case_begin "explicit cluster from a file beats TF_CONFIG"
echo '{"cluster": {"worker": ["f:1"]}, "task": {"type": "worker", "index": 0}}' > "$TEST_TMP/cluster.json"
run env STRATA_CLUSTER="$TEST_TMP/cluster.json" TF_CONFIG='{"cluster": {"worker": ["t:1"]}}' "$STRATA_BIN" cluster
expect_rc 0
expect_json 'j["cluster"]["worker"]' "['f:1']"

case_begin "MPI resolver as a singleton"
run "$STRATA_BIN" cluster
expect_rc 0
expect_json 'j["task"]' "{'type': 'worker', 'index': 0}"
expect_json 'j["rpc_layer"]' "mpi"
expect_json 'j["resolver"]' "mpi"

case_begin "MPI resolver under mpirun, 3 ranks, --num-ps 1"
mpi 3 "$STRATA_BIN" cluster --num-ps 1
expect_rc 0
[ "$(wc -l < "$OUT")" = 3 ] || fail "expected 3 JSON lines"
types=$(for l in 1 2 3; do json_get 'j["task"]["type"]+":"+str(j["task"]["index"])' $l; done | sort | tr '\n' ' ')
[ "$types" = "ps:0 worker:0 worker:1 " ] || fail "tasks were '$types'"

case_begin "--help-env lists the variables"
run "$STRATA_BIN" --help-env
expect_rc 0
for v in STRATA_LOG_LEVEL STRATA_TIMEOUT_S TF_CONFIG SLURM_STEP_NODELIST CUDA_VISIBLE_DEVICES; do expect_stdout_has "$v"; done

case_begin "slurm hostnames and tasks-per-node"
run "$STRATA_BIN" slurm hostnames 'rack[1-2]-n[08-10]'
expect_rc 0
[ "$(tr '\n' ' ' < "$OUT")" = "rack1-n08 rack1-n09 rack1-n10 rack2-n08 rack2-n09 rack2-n10 " ] || fail "hostnames: $(cat "$OUT")"
run "$STRATA_BIN" slurm tasks-per-node '2(x3),1'
expect_rc 0
[ "$(cat "$OUT")" = "2 2 2 1" ] || fail "tasks-per-node: $(cat "$OUT")"

finish
