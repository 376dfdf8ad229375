#!/usr/bin/env bash
# `strata train` under a real srun (run inside run_with_slurm.sh): roles come from the Slurm step
# (SLURM_PROCID, SLURM_STEP_*), with --num-ps turning the first task into the parameter server;
# the job trains and the chief's last line is the JSON summary. Also the explicit --jobs form.
# Usage: srun_train_test.sh STRATA_BIN
set -uo pipefail
STRATA_BIN=$1
FMNIST=/usr/share/datasets/fashion-mnist
[ -r "$FMNIST/train-images-idx3-ubyte.gz" ] || { echo "SKIP: $FMNIST missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

check() {  # NAME EXPECTED_GLOBAL_STEP ARGS...
  local name=$1 want=$2; shift 2
  timeout 180 srun --mpi=pmix -n 3 --overcommit --kill-on-bad-exit=1 "$STRATA_BIN" train --model softmax \
    --steps 40 --log-every 0 --log-every-secs 0 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local got
  got=$(tail -1 "$tmp/out" | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['ps'], j['workers'], j['global_step'], int(j['test_accuracy'] > 0.5))" 2>&1)
  [ "$rc" = 0 ] && [ "$got" = "1 2 $want 1" ]
  report "$name" "exit $rc, summary '$got'"
}

# report NAME DETAIL: PASS when the last command succeeded, else FAIL with DETAIL and the step's
# last output lines.
report() {
  if [ $? = 0 ]; then
    echo "PASS: $1"
  else
    echo "FAIL: $1 ($2)"
    sed 's/^/  out: /' "$tmp/out" | tail -8
    sed 's/^/  err: /' "$tmp/err" | tail -10
    failures=$((failures + 1))
  fi
}

check "srun -n 3, --num-ps 1 (Slurm resolver)" 80 --num-ps 1
check "srun -n 3, --jobs ps=1,worker=2" 80 --jobs ps=1,worker=2

# The evaluator task under srun: --jobs ps=1,worker=2,evaluator=1 on 4 tasks; the last task joins
# no worker group, evaluates the checkpoints the job commits, the final one last, and the job ends
# with status 0 after it.
name="srun -n 4, --jobs ps=1,worker=2,evaluator=1 (the evaluator task)"
ck=$tmp/eval-ck
timeout 180 srun --mpi=pmix -n 4 --overcommit --kill-on-bad-exit=1 "$STRATA_BIN" train --model softmax \
  --steps 40 --log-every 0 --log-every-secs 0 --jobs ps=1,worker=2,evaluator=1 \
  --checkpoint-dir "$ck" --save-every-steps 30 >"$tmp/out" 2>"$tmp/err"
rc=$?
got=$(python3 - "$ck" "$tmp/out" <<'PY' 2>&1
import json, os, sys
ck, out = sys.argv[1], sys.argv[2]
summary = json.loads([l for l in open(out) if l.startswith("{")][-1])
rows = [json.loads(l) for l in open(os.path.join(ck, "eval.jsonl"))]
final = os.path.basename(summary["final_checkpoint"])
steps = [r["global_step"] for r in rows]
ok = (summary["workers"] == 2 and summary["ps"] == 1 and summary["global_step"] == 80 and rows
      and os.path.basename(rows[-1]["checkpoint"]) == final and steps == sorted(set(steps))
      and os.path.isdir(os.path.join(ck, "best")))
print("ok" if ok else "summary %s, eval.jsonl %s" % (summary, rows))
PY
)
[ "$rc" = 0 ] && [ "$got" = ok ] && grep -q '^eval: ' "$tmp/out" "$tmp/err"
report "$name" "exit $rc: $got"

[ "$failures" = 0 ] || exit 1
echo "srun train test passed"
