#!/usr/bin/env bash
# Churning ids end to end: `strata data synth-ctr --id-bits 40 --days 3 --churn 0.3` writes one
# file a day with 10-hex-digit ids and the per-day id counts in FILE.json (bad day/churn/id-bits
# flags are one line, exit 2); the shipped dynamic churn spec
# (examples/specs/criteo_dlrm_churn_dynamic.json), with its ttl and capacity scaled to this small
# data, trains on days 0..1 in file order (sync, so the figures repeat) and evaluates on day 2:
# eviction bounds the tables (rows evicted, live rows within the capacity and at most half the
# distinct ids the generator wrote) and the model still learns (AUC clearly above chance).
source "$(dirname "$0")/lib.sh"

QUIET=(--log-every 0 --log-every-secs 0)
D=$TEST_TMP
SPEC="$(dirname "$0")/../../examples/specs/criteo_dlrm_churn_dynamic.json"
CAPACITY=600

case_begin "synth-ctr with days and churning 40-bit ids: a file a day, the id counts in FILE.json"
run "$STRATA_BIN" data synth-ctr --out "$D/day.tsv" --rows 30000 --days 3 --churn 0.3 --id-bits 40 --vocab 3000 --seed 4
expect_rc 0
expect_json 'len(j["files"])' 3
expect_json '(j["days"], j["churn"], j["id_bits"], j["id_hex_digits"])' "(3, 0.3, 40, 10)"
expect_json '[d["rows"] for d in j["per_day"]]' "[10000, 10000, 10000]"
expect_json 'all(d["new"] == sum(d["new_per_field"]) and 0 < d["new"] <= d["distinct"] for d in j["per_day"])' True
expect_json 'j["distinct_ids_all_fields"] == sum(d["new"] for d in j["per_day"]) == sum(j["distinct_ids"])' True
expect_json '0.7 < j["oracle_auc"] < 0.9' True
cmp -s <(cat "$OUT") "$D/day.tsv.json" || fail "FILE.json differs from the printed line"
DAY0="$D/day-00000-of-00003.tsv" DAY1="$D/day-00001-of-00003.tsv" DAY2="$D/day-00002-of-00003.tsv"
bad=$(cat "$DAY0" "$DAY1" "$DAY2" | awk -F'\t' '{ for (i = 15; i <= 40; i++) if ($i != "" && (length($i) != 10 || $i !~ /^[0-9a-f]+$/)) n++ } END { print n + 0 }')
[ "$bad" = 0 ] || fail "$bad categorical values are not 10 hex digits"
# Day 1's ids that day 0 did not write: the generator's count, from the files themselves.
new1=$(awk -F'\t' 'FNR == NR { for (i = 15; i <= 40; i++) if ($i != "") seen[i, $i] = 1; next }
                   { for (i = 15; i <= 40; i++) if ($i != "" && !((i, $i) in seen) && !((i, $i) in counted)) { counted[i, $i] = 1; n++ } }
                   END { print n + 0 }' "$DAY0" "$DAY1")
expect_json 'j["per_day"][1]["new"]' "$new1"
run "$STRATA_BIN" data synth-ctr --out "$D/again.tsv" --rows 30000 --days 3 --churn 0.3 --id-bits 40 --vocab 3000 --seed 4
expect_rc 0
for k in 0 1 2; do
  cmp -s "$D/day-0000$k-of-00003.tsv" "$D/again-0000$k-of-00003.tsv" || fail "day $k differs between two runs of one seed"
done
# Distinct ids per column in the training days (0 and 1): what a table without eviction would hold.
TRAIN_IDS=$(python3 -c "
import json; j = json.load(open('$D/day.tsv.json'))
print(json.dumps([j['per_day'][0]['new_per_field'][f] + j['per_day'][1]['new_per_field'][f] for f in range(26)]))")

case_begin "bad day, churn and id-bits flags: one line naming the flag, exit 2"
for args in "--days 0" "--days 1001" "--churn 2 --days 3 --id-bits 40" "--churn 0.5 --days 1 --id-bits 40" \
            "--churn 0.5 --days 3" "--id-bits 63" "--id-bits 8" "--days 3 --files 2" "--id-bits 16 --days 40 --churn 1"; do
  # shellcheck disable=SC2086
  run "$STRATA_BIN" data synth-ctr --out "$D/bad.tsv" --rows 1000 $args
  expect_rc 2; expect_one_stderr_line
  want=${args%% *}
  case "$args" in --churn*) want=--churn ;; "--days 3 --files 2") want=--files ;; "--id-bits 16"*) want=--id-bits ;; esac
  expect_stderr_has "$want"
done
ls "$D"/bad* >/dev/null 2>&1 && fail "a refused run wrote its output"

case_begin "dynamic churn spec, 1 PS + 1 worker, days 0..1 in order, eval on day 2: eviction bounds the rows, AUC > 0.55"
python3 - "$SPEC" "$D/spec.json" "$CAPACITY" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
n = 0
for c in spec["feature_columns"]:
    if c.get("for_keys") == "C1..C26":
        cat = c["categorical"]
        assert cat.get("dynamic") is True and cat["ttl"] > 0 and cat["capacity"] > 0, cat
        # 20,000 training rows are 79 steps of 256: a ttl of 20 steps keeps about a quarter
        # of a day's ids, the capacity caps any table.
        cat.update(ttl=20, capacity=int(sys.argv[3]))
        n += 1
assert n == 1
json.dump(spec, open(sys.argv[2], "w"))
PY
mpi 2 "$STRATA_BIN" train --model-spec "$D/spec.json" --data "csv:$DAY0,$DAY1" --eval-data "csv:$DAY2" \
  --streaming --shuffle-buffer 0 --epochs 1 --consistency sync "${QUIET[@]}"
expect_rc 0
CHECK=$(summary | python3 -c "
import json, sys
j = json.load(sys.stdin)
train_ids = json.loads('$TRAIN_IDS')
d = j['dynamic']
assert len(d) == 26, sorted(d)
assert j['auc'] > 0.55, ('auc', j['auc'])
rows = evicted = distinct = 0
for f in range(26):
    v = d['dlrm/C%d_embedding/embeddings' % (f + 1)]
    # Live rows within the capacity and at most half of the distinct ids the column saw.
    assert v['rows'] <= $CAPACITY, v
    assert v['rows'] <= train_ids[f] // 2, (f, v, train_ids[f])
    assert v['evicted'] > 0 and v['admitted'] == v['rows'] + v['evicted'], v
    assert v['rejected_lookups'] == 0, v
    rows += v['rows']; evicted += v['evicted']; distinct += train_ids[f]
print('ok auc %.4f rows %d evicted %d distinct ids %d' % (j['auc'], rows, evicted, distinct))
" 2>&1)
[[ "$CHECK" == ok* ]] || fail "dynamic stats: $CHECK"
echo "  $CHECK"
AUC_ALONE=$(summary_get 'repr(j["auc"])')

case_begin "the same with an evaluator task, day 2 streamed in chunks of 3000 rows: the evaluator's final row is the chief's"
# Day 2 is 10,000 rows: chunks of 3000, 3000, 3000 and 1000. The chief looks up each chunk's rows on
# the PS; the evaluator collects every chunk's ids, reads their rows from the final checkpoint's
# table chain once, and reads the day again to evaluate: both must give the same figures, and the
# same as the run above (sync: the same training).
STRATA_EVAL_CHUNK_ROWS=3000 mpi 3 "$STRATA_BIN" train --jobs ps=1,worker=1,evaluator=1 --model-spec "$D/spec.json" \
  --data "csv:$DAY0,$DAY1" --eval-data "csv:$DAY2" --streaming --shuffle-buffer 0 --epochs 1 --consistency sync \
  --checkpoint-dir "$D/ck_eval" --eval-best-metric auc "${QUIET[@]}"
expect_rc 0
[ "$(grep -c "^strata train: evaluation data: streamed from 1 file(s), 3000 rows at a time$" "$OUT")" = 2 ] \
  || fail "expected the evaluation data streamed by the chief and the evaluator: $(grep "evaluation data" "$OUT")"
CHIEF=$(summary_get '" ".join(repr(j[k]) for k in ("auc", "test_loss", "test_accuracy"))')
FINAL=$(/usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$D/ck_eval/eval.jsonl')]
r = rows[-1]
assert r['examples'] == 10000, r
print(' '.join(repr(r[k]) for k in ('auc', 'loss', 'accuracy')))" 2>&1)
[ -n "$CHIEF" ] && [ "$CHIEF" = "$FINAL" ] || fail "the chief's evaluation: $CHIEF; the evaluator's final row: $FINAL"
[ "${CHIEF%% *}" = "$AUC_ALONE" ] || fail "auc with the evaluator ${CHIEF%% *}, without $AUC_ALONE"
echo "  chief and evaluator: auc loss accuracy $CHIEF"

finish
