#!/usr/bin/env bash
# strata train with dynamic embedding tables end to end under mpirun: the shipped DLRM spec with
# dynamic hash columns (examples/specs/criteo_dlrm_dynamic.json) trains on synth-ctr data to an
# AUC well above chance, and its summary line carries every table's rows / admitted / evicted /
# bytes, summed and per PS shard; sync runs are bit-equal run to run and across PS counts (rows
# are a function of the id, applied in worker order); admission and capacity show in the
# counters; checkpoints hold the tables (a resumed sync job evaluates the same); a bad dynamic
# option is one line, exit 2. (The evaluator task with dynamic tables: dynamic_ops_test.sh.)
source "$(dirname "$0")/lib.sh"

QUIET=(--log-every 0 --log-every-secs 0)
D=$TEST_TMP
SPEC="$(dirname "$0")/../../examples/specs/criteo_dlrm_dynamic.json"

case_begin "synth-ctr data in the Criteo layout"
run "$STRATA_BIN" data synth-ctr --out "$D/all.tsv" --rows 24000 --vocab 50 --seed 3
expect_rc 0
head -n 20000 "$D/all.tsv" > "$D/train.tsv"
tail -n 4000 "$D/all.tsv" > "$D/eval.tsv"
# The distinct values of each categorical column in the training data: no table can hold more.
python3 - "$D/train.tsv" > "$D/distinct.json" <<'PY'
import json, sys
seen = [set() for _ in range(26)]
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    for i in range(26):
        if f[14 + i]:
            seen[i].add(f[14 + i])
print(json.dumps({f"dlrm/C{i + 1}_embedding/embeddings": len(s) for i, s in enumerate(seen)}))
PY

case_begin "the dynamic DLRM spec, 1 PS + 2 workers: exit 0, AUC above chance, dynamic stats in the summary"
mpi 3 "$STRATA_BIN" train --model-spec "$SPEC" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'int(j["auc"] > 0.6)')" = 1 ] || fail "auc: $(summary_get 'j.get("auc")')"
CHECK=$(summary | python3 -c "
import json, sys
j = json.load(sys.stdin)
distinct = json.load(open('$D/distinct.json'))
d = j['dynamic']
assert sorted(d) == sorted(distinct), sorted(d)
for name, v in d.items():
    assert v['dim'] == 8, v
    assert len(v['per_ps']) == 1, v
    for k in ('rows', 'admitted', 'evicted', 'bytes'):
        assert v[k] == sum(p[k] for p in v['per_ps']), (name, k, v)
    # admit_after 0: every id seen in training got a row, and none was evicted; evaluation
    # lookups are read-only, so the table holds exactly the training data's distinct values.
    assert v['rows'] == v['admitted'] == distinct[name], (name, v, distinct[name])
    assert v['evicted'] == 0 and v['rejected_lookups'] == 0, v
    assert v['bytes'] >= v['rows'] * 8 * 4, v
print('ok')
" 2>&1)
[ "$CHECK" = ok ] || fail "dynamic stats: $CHECK"
echo "  auc $(summary_get 'j["auc"]'), rows $(summary_get 'sum(v["rows"] for v in j["dynamic"].values())')"

case_begin "sync: bit-equal run to run and with 2 PS (per-shard stats add up)"
mpi 3 "$STRATA_BIN" train --model-spec "$SPEC" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --consistency sync --epochs 1 "${QUIET[@]}"
expect_rc 0
A=$(summary_get 'repr((j["auc"], j["test_loss"], j["final_loss"]))')
mpi 3 "$STRATA_BIN" train --model-spec "$SPEC" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --consistency sync --epochs 1 "${QUIET[@]}"
expect_rc 0
B=$(summary_get 'repr((j["auc"], j["test_loss"], j["final_loss"]))')
[ "$A" = "$B" ] || fail "two sync runs differ: $A vs $B"
mpi 4 "$STRATA_BIN" train --model-spec "$SPEC" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --num-ps 2 --consistency sync --epochs 1 "${QUIET[@]}"
expect_rc 0
C=$(summary_get 'repr((j["auc"], j["test_loss"], j["final_loss"]))')
[ "$A" = "$C" ] || fail "1 PS and 2 PS differ under sync: $A vs $C"
CHECK=$(summary_get 'all(len(v["per_ps"]) == 2 and v["rows"] == sum(p["rows"] for p in v["per_ps"]) and all(p["rows"] > 0 for p in v["per_ps"]) for v in j["dynamic"].values())')
[ "$CHECK" = True ] || fail "per-PS stats: $CHECK"
echo "  sync auc/test_loss/final_loss $A on 1 and 2 PS"

case_begin "admission and capacity show in the counters"
python3 - "$SPEC" "$D/admit.json" "$D/cap.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
def with_options(path, **opts):
    s = json.loads(json.dumps(spec))
    for c in s["feature_columns"]:
        if c.get("for_keys") == "C1..C26":
            c["categorical"].update(opts)
    json.dump(s, open(path, "w"))
with_options(sys.argv[2], admit_after=65535)
with_options(sys.argv[3], capacity=10)
PY
mpi 3 "$STRATA_BIN" train --model-spec "$D/admit.json" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" --epochs 1 "${QUIET[@]}"
expect_rc 0
CHECK=$(summary_get 'all(v["rows"] == 0 and v["admitted"] == 0 and v["rejected_lookups"] > 0 and v["rejected_updates"] > 0 for v in j["dynamic"].values())')
[ "$CHECK" = True ] || fail "nothing admitted: $(summary_get 'j["dynamic"]["dlrm/C1_embedding/embeddings"]')"
mpi 3 "$STRATA_BIN" train --model-spec "$D/cap.json" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" --epochs 1 "${QUIET[@]}"
expect_rc 0
CHECK=$(summary_get 'all(v["rows"] <= 10 and v["evicted_capacity"] > 0 and v["evicted"] == v["evicted_ttl"] + v["evicted_capacity"] for v in j["dynamic"].values())')
[ "$CHECK" = True ] || fail "capacity 10: $(summary_get 'j["dynamic"]["dlrm/C1_embedding/embeddings"]')"

case_begin "checkpoints hold the tables: a sync job resumed from its final checkpoint evaluates the same"
mpi 4 "$STRATA_BIN" train --model-spec "$SPEC" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --num-ps 2 --consistency sync --epochs 1 --checkpoint-dir "$D/ck" "${QUIET[@]}"
expect_rc 0
ls "$D/ck"/dynamic-*.h5 >/dev/null 2>&1 || fail "no dynamic tables file in $D/ck: $(ls "$D/ck")"
A=$(summary_get 'repr((j["auc"], j["test_loss"], {k: v["rows"] for k, v in j["dynamic"].items()}))')
STEP=$(summary_get 'j["global_step"]')
# Restored onto 1 PS (the tables' shards are re-split by id); the epoch is done, so no step runs.
mpi 3 "$STRATA_BIN" train --model-spec "$SPEC" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --consistency sync --epochs 1 --checkpoint-dir "$D/ck" --restore latest "${QUIET[@]}"
expect_rc 0
B=$(summary_get 'repr((j["auc"], j["test_loss"], {k: v["rows"] for k, v in j["dynamic"].items()}))')
[ "$(summary_get 'j["global_step"]')" = "$STEP" ] || fail "global step after the resume: $(summary_get 'j["global_step"]'), saved $STEP"
[ "$A" = "$B" ] || fail "the resumed job differs: $A vs $B"

case_begin "a bad dynamic option: one line naming the field, exit 2"
sed 's/"capacity": 1048576/"capacity": 0/' "$SPEC" > "$D/bad.json"
grep -q '"capacity": 0' "$D/bad.json" || fail "the spec has no capacity to change"
run "$STRATA_BIN" train --model-spec "$D/bad.json" --data "csv:$D/train.tsv"
expect_rc 2
expect_one_stderr_line
expect_stderr_has "feature_columns[2] (key C1).categorical.capacity: expected an integer in [1, 2147483647], got 0"

finish
