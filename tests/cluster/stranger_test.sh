#!/usr/bin/env bash
# stranger_test.sh STRATA_BIN -- a stranger on the cluster network cannot read, write, end, stall
# or slow a job (issue 18, docs/SECURITY.md).
#
# Run inside run_on_cluster.sh with 3 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 3 tests/cluster/stranger_test.sh build/bin/strata
#
# A job trains on cn1 (PS) and cn2 (worker) with the default transport (TCP between the nodes).
# Once both ranks serve, tests/tools/stranger.py on cn3 probes both listeners: the pre-handshake
# hello with a GET of the weights, a PUT of NaN over the first layer, a poisoned inbox row, an
# accumulate of element type 7, random bytes, a port scan, a wrong secret, huge and unknown
# requests, 1,100 connections, and an idle connection plus half a header held open to the end.
# The job trains until every probe but the held ones has run and it is past its third epoch,
# however fast this machine trains; then SIGUSR1 to mpirun asks it to stop (a save at the next
# step boundary, status 75). Asserts: the job ends so, with its usual accuracy (>= 0.82 after 3
# epochs, like cluster.multinode's training), no parameter byte reached the stranger, and the
# job's log names the stranger's address in a warning. Every assertion prints PASS/FAIL.
set -uo pipefail

[[ $# -eq 1 ]] || { echo "usage: stranger_test.sh STRATA_BIN" >&2; exit 2; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
[[ -n ${STRATA_CLUSTER_DIR:-} ]] || { echo "stranger_test: run under tests/cluster/run_on_cluster.sh 3" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
D=$STRATA_CLUSTER_DIR
work=$(mktemp -d "$D/stranger.XXXXXX")
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

cn3=$(awk '$2 == "cn3" {print $3}' "$D/nodes.txt")
[[ -n $cn3 ]] || { echo "FAIL: no cn3 in $D/nodes.txt"; exit 1; }

# The job: more epochs than it reaches before the probes are done; it is stopped then (below).
# cluster_mpirun execs mpirun, so mpirun is the child of `timeout`.
STRATA_NUM_PS=1 STRATA_LOG_LEVEL=debug timeout --kill-after=10 150 \
  "$here/cluster_mpirun" "$D" --host cn1,cn2 -np 2 "$BIN" train --epochs 100 --checkpoint-dir "$work/ckpt" \
  >"$work/job.out" 2>"$work/job.err" &
job=$!

# The listeners, from the job's own debug lines ("tcp transport: rank R serves on IP:PORT").
targets=""
for _ in $(seq 1 300); do
  mapfile -t eps < <(grep -o 'tcp transport: rank [0-9]* serves on [0-9.]*:[0-9]*' "$work/job.err" | awk '{print $NF}' | sort -u)
  if [[ ${#eps[@]} -ge 2 ]]; then targets=$(IFS=,; echo "${eps[*]}"); break; fi
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $targets ]]; then
  fail "the job's listeners were not announced"
  wait "$job"
  tail -n 30 "$work/job.err"
  exit 1
fi
echo "listeners: $targets; stranger: cn3 ($cn3)"

"$here/node_exec" "$D" cn3 /usr/bin/python3 "$here/../tools/stranger.py" --targets "$targets" \
  --hold-file "$work/job.done" --report "$work/report.json" --active-done-file "$work/probes.done" \
  >"$work/stranger.out" 2>&1 &
stranger=$!

# Until the probes have run and the job is past epoch 3 (or it ended: then its status says why).
for _ in $(seq 1 1200); do
  epoch=$(grep -oE ' epoch [0-9]+/' "$work/job.out" | tail -n 1 | tr -dc '0-9')
  [[ -e $work/probes.done && ${epoch:-0} -ge 4 ]] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
mpirun_pid=$(pgrep -P "$job" mpirun | head -1)
[[ -n $mpirun_pid ]] && kill -USR1 "$mpirun_pid"
wait "$job"
rc=$?
touch "$work/job.done"
wait "$stranger"
src=$?

if [[ $rc -eq 75 ]]; then
  pass "the job trained under the probes and stopped when asked (status 75)"
else
  fail "the job exited $rc (75 expected: asked to stop after the probes)"
fi
acc=$(tail -n 1 "$work/job.out" | /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["test_accuracy"])' 2>/dev/null || echo 0)
if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.82 else 1)"; then
  pass "test accuracy $acc >= 0.82"
else
  fail "test accuracy $acc < 0.82"
fi
if [[ $src -eq 0 && -s $work/report.json ]]; then
  leaked=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["leaked_total"])' "$work/report.json")
  probes=$(/usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(len(r["probes"]), len(r["errors"]))' "$work/report.json")
  if [[ $leaked == 0 ]]; then pass "no byte beyond the handshake's challenge reached the stranger"; else fail "$leaked bytes leaked to the stranger"; fi
  read -r nprobes nerrors <<<"$probes"
  if [[ $nprobes -ge 10 && $nerrors -eq 0 ]]; then pass "all $nprobes probes ran against a live job"
  else fail "$nprobes probes ran, $nerrors could not connect (did the job end early?)"; fi
else
  fail "the stranger failed (status $src)"
  cat "$work/stranger.out"
fi
if grep -q "warning: tcp transport refused a connection from $cn3:" "$work/job.err"; then
  pass "a warning names the stranger's address: $(grep -m1 "refused a connection from $cn3:" "$work/job.err")"
else
  fail "no warning names the stranger's address $cn3"
fi
warnings=$(grep -c "refused a connection" "$work/job.err")
if [[ $warnings -le 40 ]]; then pass "$warnings warning lines for thousands of probes (rate-limited)"
else fail "$warnings warning lines: not rate-limited"; fi
if grep -Eq 'MPI_Abort|tcp transport server:' "$work/job.err"; then fail "the job logged an abort"; fi

if [[ $failed -ne 0 ]]; then
  echo "---- job stdout (last 20) ----"; tail -n 20 "$work/job.out"
  echo "---- job stderr (last 40, debug lines left out) ----"; grep -v '\[debug\]\|DEBUG' "$work/job.err" | tail -n 40
  echo "---- stranger ----"; cat "$work/stranger.out"; cat "$work/report.json" 2>/dev/null
fi
rm -rf "$work"
echo "stranger_test: $failed failure(s)"
[[ $failed -eq 0 ]]
