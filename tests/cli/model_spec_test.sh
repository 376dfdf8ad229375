#!/usr/bin/env bash
# strata train --model-spec end to end under mpirun: a wide-and-deep JSON spec over synth-ctr
# (Criteo layout) data trains across 1 PS + 2 workers to an AUC well above chance, with
# checkpoints and a resume; a regressor spec over a CSV with a header reports mae/mse; a bad spec
# or a csv: input without a spec is one stderr line naming the field, exit status 2; a spec of
# numeric columns trains on Fashion-MNIST (examples/specs/fashion_mnist_dnn.json).
source "$(dirname "$0")/lib.sh"

QUIET=(--log-every 0 --log-every-secs 0)
D=$TEST_TMP

case_begin "synth-ctr: train and eval files in the Criteo layout"
# One planted model (one seed) for both sets: the last 4000 rows are held out.
run "$STRATA_BIN" data synth-ctr --out "$D/all.tsv" --rows 24000 --vocab 50 --seed 3
expect_rc 0
ORACLE=$(json_get 'j["oracle_auc"]')
# The log loss of always predicting the positive rate: a model that learned nothing scores this.
BASE_LOG_LOSS=$(json_get '(lambda p: -(p * __import__("math").log(p) + (1 - p) * __import__("math").log(1 - p)))(j["positive_rate"])')
head -n 20000 "$D/all.tsv" > "$D/train.tsv"
tail -n 4000 "$D/all.tsv" > "$D/eval.tsv"

# A wide-and-deep spec of the kind docs/MODELS.md describes: every categorical field hashed in the
# linear part; the integer fields and an embedding of every categorical field in the DNN part.
python3 - "$D/wd.json" <<'PY'
import json, sys
linear = [{"type": "hash_bucket", "key": f"C{i}", "hash_bucket_size": 1000} for i in range(1, 27)]
dnn = [{"type": "numeric", "key": f"I{i}", "normalizer": {"mean": 6, "std": 10}} for i in range(1, 14)]
dnn += [{"type": "embedding", "dimension": 4,
         "categorical": {"type": "hash_bucket", "key": f"C{i}", "hash_bucket_size": 1000}} for i in range(1, 27)]
spec = {"estimator": "DNNLinearCombinedClassifier", "scope": "ctr", "csv": {"layout": "criteo"},
        "linear_feature_columns": linear, "dnn_feature_columns": dnn, "dnn_hidden_units": [32, 16],
        "learning_rate": 0.1, "epochs": 2, "batch_size": 128}
json.dump(spec, open(sys.argv[1], "w"), indent=1)
PY

case_begin "wide-and-deep spec, 1 PS + 2 workers: exit 0, AUC well above chance, log_loss"
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --checkpoint-dir "$D/ck" "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'int(j["auc"] > 0.6)')" = 1 ] || fail "auc: $(summary_get 'j.get("auc")') (oracle $ORACLE)"
[ "$(summary_get "int(0 < j['log_loss'] < $BASE_LOG_LOSS)")" = 1 ] \
  || fail "log_loss: $(summary_get 'j.get("log_loss")'), not below the base rate's $BASE_LOG_LOSS"
[ "$(summary_get 'int(all(k in j for k in ("precision", "recall", "test_accuracy")))')" = 1 ] \
  || fail "summary lacks precision/recall/test_accuracy: $(summary)"
ls "$D/ck"/ckpt-*.h5 >/dev/null 2>&1 || fail "no checkpoint written in $D/ck"
GSTEP=$(summary_get 'j["global_step"]')
AUC1=$(summary_get 'j["auc"]')
echo "  auc $AUC1, log_loss $(summary_get 'j["log_loss"]') (oracle auc $ORACLE, base-rate log_loss $BASE_LOG_LOSS), global step $GSTEP"

case_begin "resume: --restore latest continues from the saved step (a third epoch)"
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "csv:$D/train.tsv" --eval-data "csv:$D/eval.tsv" \
  --checkpoint-dir "$D/ck" --restore latest --epochs 3 "${QUIET[@]}"
expect_rc 0
expect_stdout_has "checkpoint: restored"
expect_stdout_has "(global step $GSTEP)"
[ "$(summary_get "int(j['global_step'] > $GSTEP)")" = 1 ] || fail "global step did not advance past $GSTEP"
[ "$(summary_get "int(j['auc'] > 0.6)")" = 1 ] || fail "auc after resume: $(summary_get 'j.get("auc")') (before $AUC1)"

case_begin "the evaluator task on a spec, best by AUC: eval.jsonl rows carry auc, best.json names it"
mpi 4 "$STRATA_BIN" train --jobs ps=1,worker=2,evaluator=1 --model-spec "$D/wd.json" --data "csv:$D/train.tsv" \
  --eval-data "csv:$D/eval.tsv" --checkpoint-dir "$D/ck_eval" --save-every-steps 40 --eval-best-metric auc "${QUIET[@]}"
expect_rc 0
ROWS=$(wc -l < "$D/ck_eval/eval.jsonl" 2>/dev/null || echo 0)
[ "$ROWS" -ge 1 ] || fail "no evaluation in $D/ck_eval/eval.jsonl"
/usr/bin/python3 - "$D/ck_eval" <<'PY' || fail "eval.jsonl / best.json do not carry the AUC as expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/eval.jsonl")]
best = json.load(open(sys.argv[1] + "/best/best.json"))
assert all(0.5 < r["auc"] <= 1 and "log_loss" in r and "precision" in r for r in rows), rows
assert best["metric"] == "auc" and best["value"] == max(r["auc"] for r in rows), (best, rows)
PY
expect_stdout_has "auc "
# The chief and the evaluator read the evaluation file; the other worker does not.
EVAL_ROWS=$(wc -l < "$D/eval.tsv")
[ "$(grep -c "^strata train: evaluation data: $EVAL_ROWS rows from 1 file(s)$" "$OUT")" = 2 ] \
  || fail "expected the evaluation data read by 2 ranks (chief, evaluator): $(grep "evaluation data" "$OUT")"

case_begin "--eval-best-metric auc on a model that is not a binary classifier: exit 2 before training"
mpi 3 "$STRATA_BIN" train --jobs ps=1,worker=1,evaluator=1 --model softmax --steps 5 --checkpoint-dir "$D/ck_soft" \
  --eval-best-metric auc "${QUIET[@]}"
expect_rc 2
expect_stderr_has "--eval-best-metric auc: the model is not a binary classifier"
ls "$D/ck_soft"/ckpt-*.h5 >/dev/null 2>&1 && fail "a checkpoint was written before the usage error"

case_begin "--streaming: two training files read a chunk at a time by 2 workers (one file each), resumed mid-epoch"
run "$STRATA_BIN" data synth-ctr --out "$D/st.tsv" --rows 12000 --vocab 50 --seed 3 --files 2
expect_rc 0
ST="csv:$D/st-00000-of-00002.tsv,$D/st-00001-of-00002.tsv"
# 6000 rows a worker, batches of 128: 46 steps an epoch each; a save at the step past 30, stop at 35.
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --eval-data "csv:$D/eval.tsv" --streaming \
  --global-batch 128 --epochs 2 --steps 35 --save-every-steps 30 --checkpoint-dir "$D/ck_stream" "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'j["global_step"]')" = 70 ] || fail "expected global step 70 (2 x 35), got $(summary_get 'j.get("global_step")')"
# Only the chief reads the evaluation file (the second worker never evaluates), a chunk at a time.
[ "$(grep -c "^strata train: evaluation data: streamed from 1 file(s), 64000 rows at a time$" "$OUT")" = 1 ] \
  || fail "expected the evaluation data streamed by the chief alone: $(grep "evaluation data" "$OUT")"
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --eval-data "csv:$D/eval.tsv" --streaming \
  --global-batch 128 --epochs 2 --checkpoint-dir "$D/ck_stream" --restore latest "${QUIET[@]}"
expect_rc 0
expect_stdout_has "resuming at epoch 1, step 35, global step 70"
# 2 epochs of 46 steps on each worker, whatever the resume.
[ "$(summary_get 'j["global_step"]')" = 184 ] || fail "expected global step 184 after the resume, got $(summary_get 'j.get("global_step")')"
[ "$(summary_get 'int(j["auc"] > 0.6)')" = 1 ] || fail "auc after streaming: $(summary_get 'j.get("auc")')"
echo "  streamed: auc $(summary_get 'j["auc"]'), global step $(summary_get 'j["global_step"]')"

case_begin "--streaming --shard data: each file counted by one worker, the counts shared; a bad record names the worker"
# DATA sharding: every worker reads both files (every other row); the count at the start is shared
# (file 0 by worker 0, file 1 by worker 1): 6000 rows a worker, 46 steps each.
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --eval-data "csv:$D/eval.tsv" --streaming \
  --shard data --global-batch 128 --epochs 1 "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'j["global_step"]')" = 92 ] || fail "expected global step 92 (2 x 46), got $(summary_get 'j.get("global_step")')"
# 3 files of 25,000 rows, a record of 3 fields at the end of the third (past the 65,536 rows the
# layout is planned on): worker 0 counts file 2 and fails; both workers stop with its line, exit 2.
run "$STRATA_BIN" data synth-ctr --out "$D/three.tsv" --rows 75000 --vocab 50 --seed 3 --files 3
expect_rc 0
printf '1\t2\t3\n' >> "$D/three-00002-of-00003.tsv"
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --eval-data "csv:$D/eval.tsv" --streaming --shard data \
  --data "csv:$D/three-00000-of-00003.tsv,$D/three-00001-of-00003.tsv,$D/three-00002-of-00003.tsv" \
  --global-batch 128 --epochs 1 "${QUIET[@]}"
expect_rc 2
expect_stderr_has "worker 0 counting its part of the input: $D/three-00002-of-00003.tsv:25001: 3 fields, expected 40"

case_begin "--streaming evaluates a chunk at a time: the metrics of the same set read whole, to the last digit"
# 130,000 rows: two chunks of 64,000 and one of 2,000. The checkpoint above, evaluated without a
# step (--steps 0) once streamed and once read whole (the same layout: every column is hashed or
# normalised as the spec says, whatever the sample).
run "$STRATA_BIN" data synth-ctr --out "$D/big_eval.tsv" --rows 130000 --vocab 50 --seed 3
expect_rc 0
cp -r "$D/ck_stream" "$D/ck_stream2"
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --eval-data "csv:$D/big_eval.tsv" --streaming \
  --global-batch 128 --checkpoint-dir "$D/ck_stream" --restore latest --steps 0 "${QUIET[@]}"
expect_rc 0
STREAMED=$(summary_get '" ".join(repr(j[k]) for k in ("test_loss", "test_accuracy", "auc", "log_loss", "precision", "recall"))')
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --eval-data "csv:$D/big_eval.tsv" \
  --global-batch 128 --checkpoint-dir "$D/ck_stream2" --restore latest --steps 0 "${QUIET[@]}"
expect_rc 0
expect_stdout_has "strata train: evaluation data: 130000 rows from 1 file(s)"
WHOLE=$(summary_get '" ".join(repr(j[k]) for k in ("test_loss", "test_accuracy", "auc", "log_loss", "precision", "recall"))')
[ -n "$STREAMED" ] && [ "$STREAMED" = "$WHOLE" ] || fail "streamed evaluation: $STREAMED; read whole: $WHOLE"
echo "  130,000 rows streamed and whole: $STREAMED"

case_begin "--streaming with an --eval-data file that cannot be opened: exit 2 before training"
mpi 3 "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --eval-data "csv:$D/eval.tsv,$D/missing.tsv" \
  --streaming --global-batch 128 --checkpoint-dir "$D/ck_missing" "${QUIET[@]}"
expect_rc 2
expect_stderr_has "--eval-data: cannot open '$D/missing.tsv'"
ls "$D/ck_missing"/ckpt-*.h5 >/dev/null 2>&1 && fail "a checkpoint was written before the usage error"

case_begin "--streaming with a bad value past the first chunk of --eval-data: the final checkpoint is kept, then exit 2 naming it"
# Streamed in chunks of 1000: the first (checked before training) is clean; row 2001's label is not
# an integer. The chief ends the job after saving its final checkpoint, with one line naming the
# file and line.
{ head -n 2000 "$D/eval.tsv"; printf 'x'; head -n 1 "$D/eval.tsv" | cut -c2-; tail -n 100 "$D/eval.tsv"; } > "$D/bad_eval.tsv"
STRATA_EVAL_CHUNK_ROWS=1000 mpi 2 "$STRATA_BIN" train --model-spec "$D/wd.json" \
  --data "$ST" --eval-data "csv:$D/bad_eval.tsv" --streaming --global-batch 128 --steps 5 \
  --checkpoint-dir "$D/ck_bad_eval" "${QUIET[@]}"
expect_rc 2
expect_stderr_has "bad_eval.tsv:2001: column 'label'"
[ -f "$D/ck_bad_eval/ckpt-5.h5" ] || fail "the final checkpoint ckpt-5.h5 was not kept: $(ls "$D/ck_bad_eval")"

case_begin "--streaming without --eval-data, or --shuffle-buffer without --streaming: exit 2"
run "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --streaming
expect_rc 2
expect_one_stderr_line
expect_stderr_has "--streaming needs --eval-data"
run "$STRATA_BIN" train --model-spec "$D/wd.json" --data "$ST" --shuffle-buffer 10
expect_rc 2
expect_stderr_has "--shuffle-buffer goes with --streaming"

# A regressor over a plain CSV with a header (y = 3 a - 2 b + 1 + noise, c a category).
python3 - "$D/reg.csv" <<'PY'
import random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    f.write("a,b,c,y\n")
    for _ in range(3000):
        a, b = r.uniform(-1, 1), r.uniform(-1, 1)
        c = r.choice("pqrs")
        y = 3 * a - 2 * b + 1 + (0.5 if c in "pq" else -0.5) + r.gauss(0, 0.1)
        f.write(f"{a:.5f},{b:.5f},{c},{y:.5f}\n")
PY
cat > "$D/reg.json" <<'JSON'
{
  "estimator": "DNNRegressor",
  "label": "y",
  "feature_columns": [
    {"type": "numeric", "key": "a"},
    {"type": "numeric", "key": "b"},
    {"type": "indicator", "categorical": {"type": "vocabulary_list", "key": "c", "vocabulary": ["p", "q", "r", "s"]}}
  ],
  "hidden_units": [16],
  "optimizer": "adam", "learning_rate": 0.01,
  "epochs": 5, "batch_size": 64
}
JSON

case_begin "regressor spec on a CSV with a header: mae and mse in the summary"
mpi 3 "$STRATA_BIN" train --model-spec "$D/reg.json" --data "csv:$D/reg.csv" "${QUIET[@]}"
expect_rc 0
# The target's variance is about 4.6; predicting its mean would score mse ~4.6, mae ~1.7.
[ "$(summary_get 'int(0 <= j["mse"] < 1.0 and 0 <= j["mae"] < 0.8)')" = 1 ] \
  || fail "mae/mse: $(summary_get '(j.get("mae"), j.get("mse"))')"
[ "$(summary_get 'int("auc" not in j)')" = 1 ] || fail "a regressor's summary has an auc"
echo "  mae $(summary_get 'j["mae"]'), mse $(summary_get 'j["mse"]')"

# A spec is read and checked before any rank starts, so a bad one is refused by a lone process.
case_begin "bad spec: an unknown member is one line naming it, exit 2"
sed 's/"dnn_hidden_units"/"dnn_hiden_units"/' "$D/wd.json" > "$D/bad1.json"
run "$STRATA_BIN" train --model-spec "$D/bad1.json" --data "csv:$D/train.tsv"
expect_rc 2
expect_one_stderr_line
expect_stderr_has "$D/bad1.json: dnn_hiden_units: unknown member for DNNLinearCombinedClassifier"

case_begin "bad spec: an unknown column type is one line naming its path, exit 2"
sed 's/"type": "numeric"/"type": "numerik"/' "$D/wd.json" > "$D/bad2.json"
run "$STRATA_BIN" train --model-spec "$D/bad2.json" --data "csv:$D/train.tsv"
expect_rc 2
expect_one_stderr_line
expect_stderr_has "$D/bad2.json: dnn_feature_columns[0].type: unknown column type \"numerik\""

case_begin "bad spec under mpirun: every rank refuses it with the same line, exit 2"
mpi 3 "$STRATA_BIN" train --model-spec "$D/bad1.json" --data "csv:$D/train.tsv"
expect_rc 2
[ "$(grep -c 'error' "$ERR")" -ge 1 ] || fail "no error line"
[ "$(grep 'error' "$ERR" | sort -u | wc -l)" = 1 ] || fail "ranks disagree on the error"
expect_stderr_has "dnn_hiden_units: unknown member"

# Columns are checked against the data once the ranks have the files.
case_begin "a column the data lacks: one distinct line naming it, exit 2"
sed 's/"key": "I2"/"key": "I99"/' "$D/wd.json" > "$D/bad3.json"
grep -q I99 "$D/bad3.json" || fail "the spec has no I2 to rename"
mpi 3 "$STRATA_BIN" train --model-spec "$D/bad3.json" --data "csv:$D/train.tsv"
expect_rc 2
[ "$(grep 'error' "$ERR" | sort -u | wc -l)" = 1 ] || fail "expected one distinct error line"
expect_stderr_has "no column 'I99' in the data"

case_begin "--data csv: without --model-spec is exit 2"
run "$STRATA_BIN" train --data "csv:$D/train.tsv"
expect_rc 2
expect_one_stderr_line
expect_stderr_has "--data csv:... needs --model-spec FILE.json"

case_begin "--model-spec with --data synthetic-sparse (ids without columns) is exit 2"
run "$STRATA_BIN" train --model-spec "$D/wd.json" --data synthetic-sparse
expect_rc 2
expect_one_stderr_line
expect_stderr_has "a --model-spec reads csv:FILE, fashion-mnist[:DIR] or FILE.h5"

# A spec of numeric columns over a dense dataset: the shipped DNNClassifier example on Fashion-MNIST.
FMNIST_SPEC=$STRATA_SOURCE_DIR/examples/specs/fashion_mnist_dnn.json
case_begin "DNNClassifier spec on fashion-mnist, 1 PS + 1 worker, one epoch: exit 0, accuracy well above chance"
mpi 2 "$STRATA_BIN" train --model-spec "$FMNIST_SPEC" --data fashion-mnist --epochs 1 "${QUIET[@]}"
expect_rc 0
[ "$(summary_get 'int(j["model"] == "DNNClassifier" and j["test_accuracy"] > 0.75)')" = 1 ] \
  || fail "expected a DNNClassifier with test accuracy > 0.75: $(summary)"
echo "  test accuracy $(summary_get 'j["test_accuracy"]') after one epoch"

case_begin "a categorical column over fashion-mnist: one distinct line naming it, exit 2"
python3 - "$D/fm_hash.json" <<'PY'
import json, sys
json.dump({"estimator": "LinearClassifier", "n_classes": 10,
           "feature_columns": [{"type": "hash_bucket", "key": "image", "hash_bucket_size": 10}]}, open(sys.argv[1], "w"))
PY
mpi 2 "$STRATA_BIN" train --model-spec "$D/fm_hash.json" --data fashion-mnist --steps 1 "${QUIET[@]}"
expect_rc 2
[ "$(grep 'error' "$ERR" | sort -u | wc -l)" = 1 ] || fail "expected one distinct error line"
expect_stderr_has "feature column 'image': --data fashion-mnist holds dense features only"

case_begin "numeric shapes that do not cover fashion-mnist's 784 features: exit 2 naming both counts"
sed 's/"shape": 784/"shape": 100/' "$FMNIST_SPEC" > "$D/fm_shape.json"
mpi 2 "$STRATA_BIN" train --model-spec "$D/fm_shape.json" --data fashion-mnist --steps 1 "${QUIET[@]}"
expect_rc 2
expect_stderr_has "their shapes add up to 100 features, but --data fashion-mnist has 784 per example"

finish
