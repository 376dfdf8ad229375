#!/usr/bin/env bash
# dynamic_big_test.sh STRATA_BIN SPEC -- issue 22 item 5 with one big id column, small: the spec
# examples/specs/criteo_dlrm_churn_big_dynamic.json (C1 a column of its own, its ttl and
# capacities scaled to this data) trained by 3 PS + 3 workers on three emulated nodes, one PS and
# one worker per node, so every PS serves two workers on other nodes.
#
# Run inside run_on_cluster.sh with 3 nodes (it provides STRATA_CLUSTER_DIR):
#   tests/cluster/run_on_cluster.sh 3 tests/cluster/dynamic_big_test.sh build/bin/strata \
#     examples/specs/criteo_dlrm_churn_big_dynamic.json
#
# Data: `strata data synth-ctr --days 3 --churn 0.3 --id-bits 40 --zipf 0.5`, C1 with 10^6 ranks
# (almost every C1 value of a row is an id seen once or twice), the other 25 with 500; days 0..1
# trained in file order (--shard data), day 2 evaluated; async (the default).
# Asserts: exit 0; ranks where asked (PS 0/1/2 on cn1/cn2/cn3, workers 3/4/5 on cn1/cn2/cn3,
# from each rank's tcp listener address) and tcp over 3 nodes; C1's table: rows on each of the 3
# PS (each between a sixth and a half of them), evicted rows, no shard over its capacity,
# admitted = rows + evicted, live rows at most half the distinct C1 ids of the training days, no
# rejected lookup; every other table evicted rows too; AUC clearly above chance (> 0.55).
# Environment: STRATA_STEP_TIMEOUT (default 80 s) bounds each command; STRATA_KEEP_CLUSTER_DIR=1
# keeps the data and the job's output (with run_on_cluster.sh's cluster directory).
set -uo pipefail

# shellcheck source=tests/cluster/dynamic_test_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/dynamic_test_lib.sh"
dynamic_test_init dynamic_big_test 3 dynbig "$@"
# 36,000 rows a day: 2 training days are 94 steps of each of the 3 workers (256 rows).
BIG_CAPACITY=4000   # C1 rows per PS: far below the ~34,000 C1 ids of one day (about 11,000 a PS), so it binds
SMALL_CAPACITY=80   # rows per PS of C2..C26: 240 in all, below half of the ~660 ids a table sees on days 0..1
TTL=30              # steps of a worker: about two thirds of a day (47 steps)

vocab="1000000$(printf ',500%.0s' $(seq 25))"
step data "$BIN" data synth-ctr --out "$work/day.tsv" --rows 108000 --days 3 --churn 0.3 --id-bits 40 \
  --vocab "$vocab" --zipf 0.5 --seed 5
if [[ $rc -eq 0 ]]; then pass "data: synth-ctr wrote 3 days"; else fail "data: exit status $rc"; dump data; exit 1; fi
DAY0=$work/day-00000-of-00003.tsv DAY1=$work/day-00001-of-00003.tsv DAY2=$work/day-00002-of-00003.tsv

/usr/bin/python3 - "$SPEC" "$work/spec.json" "$BIG_CAPACITY" "$SMALL_CAPACITY" "$TTL" <<'PY' || { echo "FAIL: spec: cannot scale $SPEC"; exit 1; }
import json, sys
spec = json.load(open(sys.argv[1]))
seen = set()
for c in spec["feature_columns"]:
    keys = c.get("for_keys")
    if keys in ("C1..C1", "C2..C26"):
        cat = c["categorical"]
        assert cat.get("dynamic") is True and cat["ttl"] > 0 and cat["capacity"] > 0, cat
        cat.update(capacity=int(sys.argv[3] if keys == "C1..C1" else sys.argv[4]), ttl=int(sys.argv[5]))
        seen.add(keys)
assert seen == {"C1..C1", "C2..C26"}, seen
json.dump(spec, open(sys.argv[2], "w"))
PY

name=train
# --map-by node: ranks 0, 1, 2 (the PS, STRATA_NUM_PS) on cn1, cn2, cn3, then ranks 3, 4, 5 (the
# workers) on cn1, cn2, cn3.
STRATA_NUM_PS=3 STRATA_LOG_LEVEL=debug step "$name" "$here/cluster_mpirun" "$D" --host cn1:2,cn2:2,cn3:2 \
  --map-by node -np 6 "$BIN" train --model-spec "$work/spec.json" --data "csv:$DAY0,$DAY1" --eval-data "csv:$DAY2" \
  --streaming --shuffle-buffer 0 --shard data --epochs 1 --log-every 0 --log-every-secs 0
if [[ $rc -eq 0 ]]; then pass "$name: exit status 0"; else fail "$name: exit status $rc"; fi
line=$(grep -m1 '^strata train: transport' "$work/$name.out")
if [[ $line == *"transport tcp"*"3 node(s)"* ]]; then pass "$name: transport line: tcp over 3 nodes"
else fail "$name: transport line is '${line:-missing}'"; fi

summary=$(grep -E '^\{.*"global_step"' "$work/$name.out" | tail -n 1)
check=$(/usr/bin/python3 - "$summary" "$work/day.tsv.json" "$BIG_CAPACITY" "$SMALL_CAPACITY" <<'PY' 2>&1
import json, sys
j = json.loads(sys.argv[1])
gen = json.load(open(sys.argv[2]))
big_cap, small_cap = int(sys.argv[3]), int(sys.argv[4])
train_ids = [gen["per_day"][0]["new_per_field"][f] + gen["per_day"][1]["new_per_field"][f] for f in range(26)]
out = []
def check(ok, what):
    out.append(("PASS: " if ok else "FAIL: ") + "train: " + what)
check(j.get("ps") == 3 and j.get("workers") == 3, "summary: 3 PS and 3 workers (got %s PS, %s workers)" % (j.get("ps"), j.get("workers")))
check(j.get("auc", 0) > 0.55, "auc %.4f > 0.55" % j.get("auc", 0))
d = j.get("dynamic", {})
check(len(d) == 26, "26 dynamic tables in the summary (got %d)" % len(d))
bad = []
c1 = None
for f in range(26):
    name = "dlrm/C%d_embedding/embeddings" % (f + 1)
    v = d.get(name)
    if v is None:
        bad.append("%s missing" % name); continue
    per = v.get("per_ps", [])
    if len(per) != 3: bad.append("%s: per_ps has %d entries" % (name, len(per))); continue
    cap = big_cap if f == 0 else small_cap
    if not v["evicted"] > 0: bad.append("%s: nothing evicted" % name)
    for p in range(3):
        if per[p]["rows"] > cap: bad.append("%s: ps %d holds %d rows > capacity %d" % (name, p, per[p]["rows"], cap))
    if v["rows"] != sum(p["rows"] for p in per): bad.append("%s: rows %d != sum of per_ps" % (name, v["rows"]))
    if v["admitted"] != v["rows"] + v["evicted"]: bad.append("%s: admitted %d != rows %d + evicted %d" % (name, v["admitted"], v["rows"], v["evicted"]))
    if v["rows"] > train_ids[f] // 2: bad.append("%s: %d live rows > half of %d distinct ids" % (name, v["rows"], train_ids[f]))
    if v["rejected_lookups"] != 0: bad.append("%s: %d rejected lookups" % (name, v["rejected_lookups"]))
    if f == 0: c1 = v
check(not bad, "every table: evicted > 0, no shard over its capacity, admitted = rows + evicted, rows <= distinct/2%s"
      % ("" if not bad else " -- " + "; ".join(bad[:6])))
if c1 is not None and len(c1.get("per_ps", [])) == 3:
    rows = [p["rows"] for p in c1["per_ps"]]
    total = max(1, sum(rows))
    check(all(total / 6 <= r <= total / 2 for r in rows), "C1 rows spread over the 3 PS: %d, %d, %d" % tuple(rows))
    check(c1["evicted_capacity"] > 0, "C1's capacity evicted rows (%d)" % c1["evicted_capacity"])
    out.append("  auc %.4f; C1: %d live rows of %d distinct training ids, admitted %d, evicted %d (ttl %d, capacity %d)"
               % (j.get("auc", 0), c1["rows"], train_ids[0], c1["admitted"], c1["evicted"], c1["evicted_ttl"], c1["evicted_capacity"]))
print("\n".join(out))
PY
)
echo "$check"
if [[ $check != *"PASS: "* ]] || [[ $check == *"FAIL"* ]] || [[ $check == *Error* ]]; then
  [[ $check == *"FAIL"* ]] || fail "$name: summary could not be checked"
  failed=$((failed + $(grep -c '^FAIL' <<<"$check")))
  dump "$name"
fi

# Where the ranks ran: the address each rank's tcp transport serves on (its debug line).
cn1=$(awk '$2 == "cn1" {print $3}' "$D/nodes.txt") cn2=$(awk '$2 == "cn2" {print $3}' "$D/nodes.txt")
cn3=$(awk '$2 == "cn3" {print $3}' "$D/nodes.txt")
served=$(grep -o 'tcp transport: rank [0-9]* serves on [0-9.]*' "$work/$name.err" | awk '{print $4 "@" $NF}' | sort -u | tr '\n' ' ')
want="0@$cn1 1@$cn2 2@$cn3 3@$cn1 4@$cn2 5@$cn3 "
if [[ -n $cn1 && -n $cn2 && -n $cn3 && $served == "$want" ]]; then
  pass "$name: placement: PS 0, 1, 2 and workers 3, 4, 5 on cn1, cn2, cn3 ($cn1, $cn2, $cn3)"
else
  fail "$name: placement: rank@address seen: '${served}', wanted '$want'"
fi

dynamic_test_finish
