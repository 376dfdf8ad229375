#!/usr/bin/env bash
# srun_verify_test.sh STRATA_BIN -- `strata cluster` under a real srun (PMIx).
#
# Run inside run_with_slurm.sh (it provides SLURM_CONF for a private cluster):
#   tests/slurm/run_with_slurm.sh tests/slurm/srun_verify_test.sh build/bin/strata
#
# Cases (contract: `strata cluster --verify`, README.md "Using it" and docs/ARCHITECTURE.md
# "Bootstrap protocol"):
#   1. srun --mpi=pmix -n 4 --overcommit --kill-on-bad-exit=1 strata cluster --verify
#      --jobs ps=1,worker=3: exit 0; the chief's table has exactly 4 rows, rank 0 = ps:0,
#      ranks 1..3 = worker:0..2, on this cluster's node; the header names resolver slurm;
#      a "# ok:" line follows.
#   2. the same with --jobs ps=1,worker=2 (3 tasks asked, 4 launched): non-zero exit, and a
#      stderr line from strata that names both counts, 3 and 4. A hang is a failure too.
#   3. srun -n 3 strata cluster --jobs ps=1,worker=2 (no --verify, no MPI needed): one
#      JSON object per task; task 0 is {"type":"ps","index":0}, tasks 1, 2 are workers 0, 1.
# Every assertion prints PASS/FAIL with what it saw; a failing case also dumps its output.
#
# Environment: STRATA_STEP_TIMEOUT (default 60 s) bounds each srun, so a hang is reported
# as such by the case that hung rather than by the outer timeout.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

[[ $# -eq 1 ]] || { echo "usage: srun_verify_test.sh STRATA_BIN" >&2; exit 2; }
BIN=$1
[[ -x $BIN ]] || { echo "FAIL: strata binary not found or not executable: $BIN" >&2; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd -P)/$(basename "$BIN")
[[ -n ${SLURM_CONF:-} ]] || { echo "srun_verify_test: SLURM_CONF is not set; run under tests/slurm/run_with_slurm.sh" >&2; exit 2; }
STEP_TIMEOUT=${STRATA_STEP_TIMEOUT:-60}
# The node name the cluster registered (env.sh); a real cluster is not expected here.
NODE=${STRATA_SLURM_NODE:-$(hostname -s)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=0
case_failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); case_failed=1; }
# dump NAME: show a failing case's captured output, so the log alone explains it.
dump() {
  [[ $case_failed -eq 1 ]] || return 0
  echo "---- $1: stdout ----"; cat "$work/$1.out"
  echo "---- $1: stderr ----"; cat "$work/$1.err"
  echo "---- end $1 ----"
}
# step NAME CMD...: run one srun bounded by STEP_TIMEOUT; status in $rc.
step() {
  local name=$1; shift
  echo "== $name: $*"
  case_failed=0
  timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$name: did not finish within ${STEP_TIMEOUT} s (hang)"
  fi
}

# ---- case 1: a consistent cluster verifies and the chief prints the table ------------
step verify_ok srun --mpi=pmix -n 4 --overcommit --kill-on-bad-exit=1 \
  "$BIN" cluster --verify --jobs ps=1,worker=3
out=$work/verify_ok.out
if [[ $rc -eq 0 ]]; then pass "verify_ok: exit status 0"; else fail "verify_ok: exit status $rc, expected 0"; fi

header=$(grep -m1 '^# strata cluster --verify:' "$out")
if [[ -z $header ]]; then
  fail "verify_ok: no '# strata cluster --verify:' header line"
else
  if [[ $header =~ resolver[[:space:]]+slurm([,[:space:]]|$) ]]; then pass "verify_ok: resolver is slurm"
  else fail "verify_ok: header does not say 'resolver slurm': $header"; fi
  if [[ $header =~ (^|[^0-9])4[[:space:]]+ranks ]]; then pass "verify_ok: header says 4 ranks"
  else fail "verify_ok: header does not say '4 ranks': $header"; fi
fi
if grep -Eq '^[[:space:]]*rank[[:space:]]+task[[:space:]]+node' "$out"; then pass "verify_ok: column header line present"
else fail "verify_ok: no 'rank  task  node ...' column header line"; fi

# Data rows: not comments, first column a rank number. Exactly 4 also proves that only
# the chief printed a table (srun merges every task's stdout).
rows=$(awk '!/^#/ && $1 ~ /^[0-9]+$/' "$out")
nrows=$(printf '%s' "$rows" | grep -c . || true)
if [[ $nrows -eq 4 ]]; then pass "verify_ok: exactly 4 data rows"
else fail "verify_ok: $nrows data rows, expected 4"; fi
got=$(printf '%s\n' "$rows" | awk 'NF {printf "%s=%s ", $1, $2}')
want="0=ps:0 1=worker:0 2=worker:1 3=worker:2 "
if [[ $got == "$want" ]]; then pass "verify_ok: rank -> task is ${want% }"
else fail "verify_ok: rank -> task is '${got% }', expected '${want% }'"; fi
nodes=$(printf '%s\n' "$rows" | awk 'NF {print $3}' | sort -u | tr '\n' ' ')
if [[ $nodes == "$NODE " ]]; then pass "verify_ok: every row is on node $NODE"
else fail "verify_ok: node column is '${nodes% }', expected '$NODE' (Slurm node name)"; fi
if grep -q '^# ok:' "$out"; then pass "verify_ok: '# ok:' line present"
else fail "verify_ok: no '# ok:' line"; fi
dump verify_ok

# ---- case 2: jobs that do not add up to the launched tasks are refused -------------------
step verify_mismatch srun --mpi=pmix -n 4 --overcommit \
  "$BIN" cluster --verify --jobs ps=1,worker=2
if [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]]; then pass "verify_mismatch: exit status $rc (non-zero)"
elif [[ $rc -eq 0 ]]; then fail "verify_mismatch: exit status 0, expected non-zero"; fi
# srun's and slurmstepd's own lines ("tasks 0-3: Exited ...") do not count: the message
# must come from strata and name the requested (3) and the actual (4) task counts.
msg=$(grep -Ev '^(srun|slurmstepd[^:]*):' "$work/verify_mismatch.err" \
      | grep -E '(^|[^0-9])3([^0-9]|$)' | grep -E '(^|[^0-9])4([^0-9]|$)' | head -n1)
if [[ -n $msg ]]; then pass "verify_mismatch: stderr names 3 and 4: $msg"
else fail "verify_mismatch: no stderr line from strata mentioning both 3 (requested) and 4 (actual)"; fi
dump verify_mismatch

# ---- case 3: plain resolution, one JSON object per task -----------------------------------
# --label prefixes each line with its task id, so a multi-line (pretty) JSON object is
# still attributed to its task, whatever order srun interleaves the tasks' output in.
step resolve_json srun -n 3 --label "$BIN" cluster --jobs ps=1,worker=2
if [[ $rc -eq 0 ]]; then pass "resolve_json: exit status 0"; else fail "resolve_json: exit status $rc, expected 0"; fi
if command -v python3 >/dev/null 2>&1; then
  if verdict=$(python3 - "$work/resolve_json.out" <<'EOF'
import json, re, sys
per_task = {}
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    m = re.match(r"\s*(\d+): ?(.*)$", line.rstrip("\n"))
    if m:
        per_task.setdefault(int(m.group(1)), []).append(m.group(2))
want = {0: ("ps", 0), 1: ("worker", 0), 2: ("worker", 1)}
problems, clusters = [], []
for t, (ty, ix) in want.items():
    if t not in per_task:
        problems.append(f"task {t} printed nothing")
        continue
    try:
        obj = json.loads("\n".join(per_task[t]))
    except ValueError as e:
        problems.append(f"task {t} output is not one JSON object ({e})")
        continue
    task = obj.get("task") if isinstance(obj, dict) else None
    if not isinstance(task, dict) or task.get("type") != ty or task.get("index") != ix:
        problems.append(f'task {t}: "task" is {json.dumps(task)}, expected {{"type": "{ty}", "index": {ix}}}')
    clusters.append(json.dumps(obj.get("cluster") if isinstance(obj, dict) else None, sort_keys=True))
extra = sorted(set(per_task) - set(want))
if extra:
    problems.append(f"unexpected output from task(s) {extra}")
if clusters and len(set(clusters)) != 1:
    problems.append("tasks disagree on \"cluster\"")
if problems:
    print("; ".join(problems))
    sys.exit(1)
print('tasks 0,1,2 are ps:0, worker:0, worker:1 and agree on "cluster"')
EOF
  ); then pass "resolve_json: $verdict"; else fail "resolve_json: $verdict"; fi
else
  # No python: at least task 0's own lines must hold the ps:0 task object.
  t0=$(sed -n 's/^ *0: \{0,1\}//p' "$work/resolve_json.out" | tr -d ' \n')
  if [[ $t0 == *'"task":{"type":"ps","index":0}'* ]]; then pass 'resolve_json: task 0 is {"type":"ps","index":0}'
  else fail "resolve_json: task 0 output lacks \"task\":{\"type\":\"ps\",\"index\":0}: $t0"; fi
fi
dump resolve_json

echo
if [[ $failed -eq 0 ]]; then echo "srun_verify_test: all assertions passed"; exit 0; fi
echo "srun_verify_test: $failed assertion(s) failed"
exit 1
