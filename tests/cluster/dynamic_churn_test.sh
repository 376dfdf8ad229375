#!/usr/bin/env bash
# dynamic_churn_test.sh STRATA_BIN SPEC -- issue 22 item 5 between nodes, small: the dynamic churn
# spec (examples/specs/criteo_dlrm_churn_dynamic.json, its ttl and capacity scaled to this data)
# trained by 2 PS on cn1 and 2 workers on cn2 over churning 40-bit Zipf ids.
#
# Run inside run_on_cluster.sh with 2 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 2 tests/cluster/dynamic_churn_test.sh build/bin/strata \
#     examples/specs/criteo_dlrm_churn_dynamic.json
#
# Data: `strata data synth-ctr --days 3 --churn 0.3 --id-bits 40`, days 0..1 trained in file order
# (--shard data: each worker every other row), day 2 evaluated; once sync and once async.
# Asserts, for each: exit 0; the ranks sit where asked (PS on cn1, workers on cn2) and the
# transport is tcp over 2 nodes; every one of the 26 tables evicted rows, no shard holds more than
# the configured capacity, both PS hold rows of every table (ids are spread by their hash, so each
# PS holds between a quarter and three quarters of all rows), admitted = rows + evicted, live rows
# at most half the distinct ids the training days wrote; AUC clearly above chance (> 0.55).
# Every assertion prints PASS/FAIL; a failure dumps the job's output.
# Environment: STRATA_STEP_TIMEOUT (default 80 s) bounds each command; STRATA_KEEP_CLUSTER_DIR=1
# keeps the data and the jobs' output (with run_on_cluster.sh's cluster directory).
set -uo pipefail

# shellcheck source=tests/cluster/dynamic_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/dynamic_test_lib.sh"
dynamic_test_init dynamic_churn_test 2 dynchurn "$@"
CAPACITY=400   # rows per table per PS
TTL=6          # steps; 20,000 training rows are 39 sync steps of 2 workers x 256

step data "$BIN" data synth-ctr --out "$work/day.tsv" --rows 30000 --days 3 --churn 0.3 --id-bits 40 --vocab 3000 --seed 4
if [[ $rc -eq 0 ]]; then pass "data: synth-ctr wrote 3 days"; else fail "data: exit status $rc"; dump data; exit 1; fi
DAY0=$work/day-00000-of-00003.tsv DAY1=$work/day-00001-of-00003.tsv DAY2=$work/day-00002-of-00003.tsv

/usr/bin/python3 - "$SPEC" "$work/spec.json" "$CAPACITY" "$TTL" <<'PY' || { echo "FAIL: spec: cannot scale $SPEC"; exit 1; }
import json, sys
spec = json.load(open(sys.argv[1]))
n = 0
for c in spec["feature_columns"]:
    if c.get("for_keys") == "C1..C26":
        cat = c["categorical"]
        assert cat.get("dynamic") is True and cat["ttl"] > 0 and cat["capacity"] > 0, cat
        cat.update(capacity=int(sys.argv[3]), ttl=int(sys.argv[4]))
        n += 1
assert n == 1
json.dump(spec, open(sys.argv[2], "w"))
PY

# Sync (the figures repeat run to run) and async (updates applied on arrival).
for mode in sync async; do
  name=train_$mode
  # The first two ranks are the PS (STRATA_NUM_PS) and fill cn1's two slots; the workers run on cn2,
  # so every lookup and update crosses the link.
  STRATA_NUM_PS=2 STRATA_LOG_LEVEL=debug step "$name" "$here/cluster_mpirun" "$D" --host cn1:2,cn2:2 -np 4 \
    "$BIN" train --model-spec "$work/spec.json" --data "csv:$DAY0,$DAY1" --eval-data "csv:$DAY2" \
    --streaming --shuffle-buffer 0 --shard data --epochs 1 --consistency "$mode" --log-every 0 --log-every-secs 0
  if [[ $rc -eq 0 ]]; then pass "$name: exit status 0"; else fail "$name: exit status $rc"; fi
  line=$(grep -m1 '^strata train: transport' "$work/$name.out")
  if [[ $line == *"transport tcp"*"2 node(s)"* ]]; then pass "$name: transport line: tcp over 2 nodes"
  else fail "$name: transport line is '${line:-missing}'"; fi

  summary=$(grep -E '^\{.*"global_step"' "$work/$name.out" | tail -n 1)
  check=$(/usr/bin/python3 - "$summary" "$work/day.tsv.json" "$CAPACITY" "$name" <<'PY' 2>&1
import json, sys
j = json.loads(sys.argv[1])
gen = json.load(open(sys.argv[2]))
cap = int(sys.argv[3])
# Distinct ids per column in the training days (0 and 1), from the generator's counts.
train_ids = [gen["per_day"][0]["new_per_field"][f] + gen["per_day"][1]["new_per_field"][f] for f in range(26)]
out = []
def check(ok, what):
    out.append(("PASS: " if ok else "FAIL: ") + sys.argv[4] + ": " + what)
check(j.get("ps") == 2 and j.get("workers") == 2, "summary: 2 PS and 2 workers (got %s PS, %s workers)" % (j.get("ps"), j.get("workers")))
check(j.get("auc", 0) > 0.55, "auc %.4f > 0.55" % j.get("auc", 0))
d = j.get("dynamic", {})
check(len(d) == 26, "26 dynamic tables in the summary (got %d)" % len(d))
rows = evicted = distinct = ttl = cap_ev = 0
ps_rows = [0, 0]
bad = []
for f in range(26):
    name = "dlrm/C%d_embedding/embeddings" % (f + 1)
    v = d.get(name)
    if v is None:
        bad.append("%s missing" % name); continue
    per = v.get("per_ps", [])
    if len(per) != 2: bad.append("%s: per_ps has %d entries" % (name, len(per))); continue
    if not v["evicted"] > 0: bad.append("%s: nothing evicted" % name)
    for p in range(2):
        if per[p]["rows"] > cap: bad.append("%s: ps %d holds %d rows > capacity %d" % (name, p, per[p]["rows"], cap))
        if per[p]["rows"] <= 0: bad.append("%s: ps %d holds no row" % (name, p))
        ps_rows[p] += per[p]["rows"]
    if v["rows"] != per[0]["rows"] + per[1]["rows"]: bad.append("%s: rows %d != sum of per_ps" % (name, v["rows"]))
    if v["admitted"] != v["rows"] + v["evicted"]: bad.append("%s: admitted %d != rows %d + evicted %d" % (name, v["admitted"], v["rows"], v["evicted"]))
    if v["rows"] > train_ids[f] // 2: bad.append("%s: %d live rows > half of %d distinct ids" % (name, v["rows"], train_ids[f]))
    if v["rejected_lookups"] != 0: bad.append("%s: %d rejected lookups" % (name, v["rejected_lookups"]))
    rows += v["rows"]; evicted += v["evicted"]; distinct += train_ids[f]
    ttl += v["evicted_ttl"]; cap_ev += v["evicted_capacity"]
check(not bad, "every table: evicted > 0, each PS 1..%d rows, admitted = rows + evicted, rows <= distinct/2%s"
      % (cap, "" if not bad else " -- " + "; ".join(bad[:6])))
total = max(1, ps_rows[0] + ps_rows[1])
check(all(0.25 <= r / total <= 0.75 for r in ps_rows), "rows spread over both PS: %d and %d" % tuple(ps_rows))
out.append("  auc %.4f, live rows %d (ps0 %d, ps1 %d), evicted %d (ttl %d, capacity %d), distinct ids of the training days %d"
           % (j.get("auc", 0), rows, ps_rows[0], ps_rows[1], evicted, ttl, cap_ev, distinct))
print("\n".join(out))
PY
  )
  echo "$check"
  if [[ $check != *"PASS: "* ]] || [[ $check == *"FAIL"* ]] || [[ $check == *Error* ]]; then
    [[ $check == *"FAIL"* ]] || fail "$name: summary could not be checked"
    failed=$((failed + $(grep -c '^FAIL' <<<"$check")))
    dump "$name"
  fi

  # Where the ranks ran: the address each rank's tcp transport serves on (its debug line), against
  # the nodes' addresses.
  cn1=$(awk '$2 == "cn1" {print $3}' "$D/nodes.txt") cn2=$(awk '$2 == "cn2" {print $3}' "$D/nodes.txt")
  served=$(grep -o 'tcp transport: rank [0-9]* serves on [0-9.]*' "$work/$name.err" | awk '{print $4 "@" $NF}' | sort -u | tr '\n' ' ')
  if [[ -n $cn1 && -n $cn2 && $served == "0@$cn1 1@$cn1 2@$cn2 3@$cn2 " ]]; then
    pass "$name: placement: ranks 0, 1 (PS) on cn1 ($cn1), ranks 2, 3 (workers) on cn2 ($cn2)"
  else
    fail "$name: placement: rank@address seen: '${served}' (cn1 $cn1, cn2 $cn2)"
  fi
done

dynamic_test_finish
