#!/usr/bin/env bash
# strata train --devices auto|cpu|gpu (README.md, "Using it"): where a worker's replicas run.
#   - `--devices gpu` on a worker that sees no GPU: one clear line for the job, exit status 2 on
#     every rank, no hang, nothing on stdout;
#   - `--devices auto` (the default) and `--devices cpu` (also the default when --cpu-replicas is
#     given): the startup line and the summary name the devices and replica count of each worker;
#   - bad combinations fail before MPI starts, with one line and exit status 2;
#   - where the machine has a GPU, the first case trains on it instead and the GPU cases below run
#     (the loss must fall); elsewhere they are reported as skipped.
source "$(dirname "$0")/lib.sh"
FMNIST=/usr/share/datasets/fashion-mnist

summary_get() { tail -1 "$OUT" | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>&1; }
QUIET=(--log-every 0 --log-every-secs 0)

if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: $FMNIST missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi

HAVE_GPU=0
case_begin "--devices gpu: one line and exit status 2 without a GPU (trains where there is one)"
start=$SECONDS
mpi 3 "$STRATA_BIN" train --model softmax --devices gpu --steps 20 "${QUIET[@]}"
if [ "$RC" = 0 ] && [ "$(summary_get 'j["devices"]')" = gpu ]; then
  HAVE_GPU=1
  echo "   this machine has a GPU: $(summary_get 'j["worker_devices"]')"
  grep -q "x GPU \[" "$OUT" || fail "the startup line does not name the GPUs"
else
  expect_rc 2
  [ "$(count_stderr 'strata train: error')" = 1 ] || fail "expected exactly one 'strata train: error' line"
  expect_stderr_has "strata train: error: --devices gpu: worker:"
  expect_stderr_has "sees no GPU ("
  expect_stderr_has "use --devices cpu or auto"
  # Nothing else from strata itself (the remaining lines are mpirun's report of the exit status).
  [ "$(grep -c '^strata' "$ERR")" = 1 ] || fail "strata printed more than one line"
  grep -q "Exit code: *2" "$ERR" || fail "mpirun does not report exit status 2"
  expect_stdout_empty
  [ $((SECONDS - start)) -lt 60 ] || fail "took $((SECONDS - start)) s"
fi

case_begin "--devices auto (default): the summary and the startup line say what ran"
mpi 3 "$STRATA_BIN" train --model softmax --steps 30 "${QUIET[@]}"
expect_rc 0
if [ "$HAVE_GPU" = 1 ]; then want=gpu; else want=cpu; fi
[ "$(summary_get 'j["devices"]')" = "$want" ] || fail "devices: $(summary_get 'j["devices"]'), expected $want"
[ "$(summary_get 'len(j["worker_devices"])')" = 2 ] || fail "worker_devices: $(summary_get 'j["worker_devices"]')"
[ "$(head -1 "$OUT" | grep -c '^strata train: softmax: 784 -> 10 .*2 worker(s) + 1 PS; replicas: worker 0 = .*, worker 1 = .*(--devices auto)$')" = 1 ] \
  || fail "startup line: $(head -1 "$OUT")"
if [ "$HAVE_GPU" = 0 ]; then
  [ "$(summary_get 'j["worker_devices"]')" = "['cpu:1', 'cpu:1']" ] || fail "worker_devices: $(summary_get 'j["worker_devices"]')"
  expect_stdout_has "worker 0 = 1 x CPU, worker 1 = 1 x CPU"
fi

case_begin "--devices cpu --cpu-replicas 2"
mpi 2 "$STRATA_BIN" train --model mlp --devices cpu --cpu-replicas 2 --global-batch 64 --steps 20 "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'j["devices"], j["worker_devices"], j["replicas_per_worker"]')" = "cpu ['cpu:2'] 2" ] \
  || fail "summary: $(summary_get 'j["devices"], j["worker_devices"], j["replicas_per_worker"]')"
expect_stdout_has "replicas: worker 0 = 2 x CPU (--devices cpu)"

case_begin "--cpu-replicas without --devices means CPU replicas, GPUs or not"
mpi 2 "$STRATA_BIN" train --model softmax --cpu-replicas 2 --global-batch 64 --steps 10 "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'j["worker_devices"]')" = "['cpu:2']" ] || fail "worker_devices: $(summary_get 'j["worker_devices"]')"
expect_stdout_has "replicas: worker 0 = 2 x CPU (--devices cpu)"

case_begin "bad --devices value (no MPI needed)"
run "$STRATA_BIN" train --devices tpu
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--devices: 'tpu' is not one of auto, cpu, gpu"

case_begin "--devices gpu with wide_deep"
run "$STRATA_BIN" train --model wide_deep --devices gpu
expect_rc 2; expect_one_stderr_line; expect_stderr_has "GPU replicas run the mlp and softmax models"

case_begin "--devices gpu with --cpu-replicas"
run "$STRATA_BIN" train --devices gpu --cpu-replicas 2
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--cpu-replicas sets CPU replicas"

if [ "$HAVE_GPU" = 1 ]; then
  case_begin "GPU replicas: mlp, 1 PS + 2 workers, the loss falls"
  mpi 3 "$STRATA_BIN" train --model mlp --devices gpu --steps 120 --log-every 40 --log-every-secs 0 \
    --metrics "$TEST_TMP/m.jsonl"
  expect_rc 0
  [ "$(summary_get 'j["global_step"]')" = 240 ] || fail "global step should count both workers' 120 steps"
  [ "$(summary_get 'int(j["test_accuracy"] > 0.6)')" = 1 ] || fail "accuracy: $(summary_get 'j["test_accuracy"]')"
  python3 - "$TEST_TMP/m.jsonl" <<'PY' || fail "metrics: the loss did not fall"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
assert rows[-1]["loss"] < rows[0]["loss"] * 0.8, rows
PY
else
  echo "== SKIPPED (no GPU visible to the workers): GPU replica training cases"
fi

finish
