#!/usr/bin/env bash
# The evaluator task (TF's sidecar evaluation) end to end on Fashion-MNIST: under
# strata-mpirun --evaluator, --jobs and TF_CONFIG it evaluates committed checkpoints while the
# trainers keep writing (saves held open by a test hook), each at most once, never a file being
# written, the final one always and with the chief's own test accuracy; eval.jsonl, the `eval`
# lines and best/ agree; bad input is one line and exit status 2, never a hang.
source "$(dirname "$0")/lib.sh"
FMNIST=/usr/share/datasets/fashion-mnist
LAUNCH="$STRATA_SOURCE_DIR/mpi_launch/strata-mpirun"
if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: $FMNIST missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi
QUIET=(--log-every 0 --log-every-secs 0)

# The chief's summary: the stdout line that is a JSON object with test_accuracy.
summary_get() {
  grep '^{"test_accuracy"' "$OUT" | tail -1 | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>&1
}

# check_eval DIR [ROWS_BEFORE]: eval.jsonl against the run's summary and stdout (see the header);
# the rows after the first ROWS_BEFORE are this run's.
check_eval() {
  local dir=$1 before=${2:-0}
  [ -s "$dir/eval.jsonl" ] || { fail "no $dir/eval.jsonl"; return; }
  local final saved acc
  final=$(summary_get 'j["final_checkpoint"]')
  saved=$(summary_get 'j["checkpoints_saved"]')
  acc=$(summary_get 'j["test_accuracy"]')
  python3 - "$dir" "$final" "$saved" "$acc" "$OUT" "$before" <<'PY' || fail "eval.jsonl / best/ / eval lines disagree"
import json, os, re, sys
d, final, saved, acc, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
before = int(sys.argv[6])
rows = [json.loads(l) for l in open(os.path.join(d, "eval.jsonl"))]
assert len(rows) > before, ("this run evaluated nothing", rows)
steps = [r["global_step"] for r in rows]
assert steps == sorted(set(steps)), ("a checkpoint evaluated twice or out of order", steps)
for r in rows:
    assert re.fullmatch(r"ckpt-\d+\.h5", r["checkpoint"]), r          # never a .tmp being written
    assert r["checkpoint"] == "ckpt-%d.h5" % r["global_step"], r
    assert 0 < r["accuracy"] <= 1 and r["loss"] > 0 and r["examples"] == 10000, r
# The final checkpoint is always evaluated, last, and on the same weights the chief evaluated.
assert rows[-1]["checkpoint"] == os.path.basename(final), (rows[-1], final)
assert abs(rows[-1]["accuracy"] - acc) < 1e-9, (rows[-1], acc)
# Each checkpoint at most once: evaluated + skipped never exceeds what was saved.
assert sum(1 + r["skipped"] for r in rows[before:]) <= saved, (rows, saved)
lines = [l for l in open(out) if l.startswith("eval: ckpt-")]
assert len(lines) == len(rows) - before, (len(lines), len(rows), before)
best = json.load(open(os.path.join(d, "best", "best.json")))
assert best["metric"] == "accuracy" and best["value"] == max(r["accuracy"] for r in rows), best
files = sorted(f for f in os.listdir(os.path.join(d, "best")) if f.startswith("ckpt-"))
assert files == [best["checkpoint"]], files
PY
  expect_stdout_has "eval: done: evaluated"
  "$STRATA_BIN" ckpt verify "$dir/best/$(python3 -c "import json; print(json.load(open('$dir/best/best.json'))['checkpoint'])")" \
    >/dev/null 2>&1 || fail "the best/ copy does not verify"
}

case_begin "strata-mpirun --evaluator 1: evaluates while the trainers write, the final one always"
D="$TEST_TMP/run1"
start=$SECONDS
run env STRATA_TEST_SAVE_DELAY_S=0.3 "$LAUNCH" --ps 1 --workers 2 --evaluator 1 -- \
  "$STRATA_BIN" train --model softmax --steps 400 --checkpoint-dir "$D" --save-every-steps 100 --max-to-keep 3 "${QUIET[@]}"
expect_rc 0
check_eval "$D"
[ "$(summary_get 'j["workers"]')" = 2 ] || fail "the evaluator counted as a worker"
[ "$(summary_get 'j["global_step"]')" = 800 ] || fail "global step $(summary_get 'j["global_step"]')"
rows=$(wc -l < "$D/eval.jsonl")
[ "$rows" -ge 2 ] || fail "expected the evaluator to see more than the final checkpoint (got $rows)"
echo "   $rows evaluation(s) in $((SECONDS - start)) s"

case_begin "--jobs ps=1,worker=2,evaluator=1 under plain mpirun, restarted: eval.jsonl grows, no step twice"
D="$TEST_TMP/run2"
mpi 4 "$STRATA_BIN" train --jobs ps=1,worker=2,evaluator=1 --model softmax --steps 100 --checkpoint-dir "$D" "${QUIET[@]}"
expect_rc 0
check_eval "$D"
before=$(wc -l < "$D/eval.jsonl")
mpi 4 "$STRATA_BIN" train --jobs ps=1,worker=2,evaluator=1 --model softmax --steps 200 --checkpoint-dir "$D" \
  --restore latest "${QUIET[@]}"
expect_rc 0
check_eval "$D" "$before"
expect_stdout_has "after global step 200"

case_begin "--eval-throttle-secs: the first and the final checkpoint only; --eval-best-metric loss"
D="$TEST_TMP/run4"
mpi 4 "$STRATA_BIN" train --jobs ps=1,worker=2,evaluator=1 --model softmax --steps 300 --checkpoint-dir "$D" \
  --save-every-steps 50 --eval-throttle-secs 600 --eval-best-metric loss "${QUIET[@]}"
expect_rc 0
[ "$(wc -l < "$D/eval.jsonl")" -le 2 ] || fail "throttled evaluator evaluated $(wc -l < "$D/eval.jsonl") checkpoints"
python3 - "$D" <<'PY' || fail "best by loss"
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "eval.jsonl"))]
best = json.load(open(os.path.join(sys.argv[1], "best", "best.json")))
assert rows[-1]["global_step"] == 600, rows
assert best["metric"] == "loss" and best["value"] == min(r["loss"] for r in rows), (best, rows)
PY
run "$STRATA_BIN" train --eval-best-metric f1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--eval-best-metric: 'f1'"

case_begin "TF_CONFIG with chief, worker, ps and evaluator tasks"
D="$TEST_TMP/run3"
cluster='{"chief": ["localhost:2220"], "worker": ["localhost:2221"], "ps": ["localhost:2222"], "evaluator": ["localhost:2223"]}'
contexts=()
for task in "ps 0" "chief 0" "worker 0" "evaluator 0"; do
  set -- $task
  [ ${#contexts[@]} -gt 0 ] && contexts+=(:)
  contexts+=(-np 1 env "TF_CONFIG={\"cluster\": $cluster, \"task\": {\"type\": \"$1\", \"index\": $2}}"
             "$STRATA_BIN" train --model softmax --steps 100 --checkpoint-dir "$D" "${QUIET[@]}")
done
run "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" "${contexts[@]}"
expect_rc 0
check_eval "$D"

case_begin "the evaluator evaluates at a lower priority (STRATA_EVALUATOR_NICE, 10); its heartbeat thread keeps its own"
D="$TEST_TMP/run5"
marks="$TEST_TMP/marks5"
mkdir -p "$marks"
STRATA_TEST_PHASE_DIR="$marks" timeout 120 "$MPIEXEC" "${MPIEXEC_FLAGS[@]}" -np 4 "$STRATA_BIN" train \
  --jobs ps=1,worker=2,evaluator=1 --model softmax --steps 3000 --checkpoint-dir "$D" --save-every-steps 400 \
  "${QUIET[@]}" >"$OUT" 2>"$ERR" &
job=$!
# nice_of PID TID: field 19 of the thread's stat (after the "(comm)" field, which may hold spaces).
nice_of() { sed 's/.*) //' "/proc/$1/task/$2/stat" 2>/dev/null | awk '{print $17}'; }
bin=$(readlink -f "$STRATA_BIN")
main_nice="" other_nices="" pid=""
# The evaluator's process is found once, as soon as it exists (a scan of /proc takes a while on a
# loaded machine), and sampled every 0.1 s once it has marked its evaluate phase: the job lasts a
# few seconds only.
for _ in $(seq 300); do
  if [ -z "$pid" ]; then
    for p in /proc/[0-9]*; do
      [ "$(readlink -f "$p/exe" 2>/dev/null)" = "$bin" ] || continue
      grep -qxz 'OMPI_COMM_WORLD_RANK=3' "$p/environ" 2>/dev/null || continue
      grep -qxz "STRATA_TEST_PHASE_DIR=$marks" "$p/environ" 2>/dev/null || continue
      pid=${p#/proc/}
      break
    done
  fi
  if [ -n "$pid" ] && [ -e "$marks/3.evaluate" ]; then
    main_nice=$(nice_of "$pid" "$pid")
    other_nices=$(for t in /proc/"$pid"/task/*; do [ "${t##*/}" = "$pid" ] || nice_of "$pid" "${t##*/}"; done | sort -u | tr '\n' ' ')
  fi
  [ "$main_nice" = 10 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
wait "$job"
RC=$?
expect_rc 0
[ "$main_nice" = 10 ] || fail "the evaluator's main thread runs at nice '${main_nice:-not found}', expected 10"
[[ " $other_nices" == *" 0 "* ]] || fail "no thread of the evaluator kept nice 0 (threads: '$other_nices')"
echo "   evaluator threads: main at nice $main_nice, others at nice $other_nices"
run env STRATA_EVALUATOR_NICE=20 "$STRATA_BIN" train --steps 1
expect_rc 2; expect_one_stderr_line; expect_stderr_has "STRATA_EVALUATOR_NICE must be between 0 and 19"

case_begin "bad input: one line, exit status 2, never a hang"
start=$SECONDS
mpi 4 "$STRATA_BIN" train --jobs ps=1,worker=2,evaluator=1 --steps 10 "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line (no model_dir)"
expect_stderr_has "evaluator task but no model_dir (--checkpoint-dir)"
mpi 4 "$STRATA_BIN" train --jobs ps=1,worker=2,evaluator=1 --data "fashion-mnist:$TEST_TMP/nowhere" \
  --checkpoint-dir "$TEST_TMP/bad1" --steps 10 "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line (missing eval data)"
expect_stderr_has "$TEST_TMP/nowhere"
mpi 2 "$STRATA_BIN" train --jobs ps=1,evaluator=1 --checkpoint-dir "$TEST_TMP/bad2" --steps 10 "${QUIET[@]}"
expect_rc 2
[ "$(grep -c 'strata train: error' "$ERR")" = 1 ] || fail "expected one error line (no trainer)"
expect_stderr_has "evaluator task but no chief or worker task"
[ ! -e "$TEST_TMP/bad2/eval.jsonl" ] || fail "an evaluator without trainers wrote eval.jsonl"
run "$LAUNCH" --ps 1 --workers 2 --evaluator x -- true
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--evaluator: 'x'"
[ $((SECONDS - start)) -lt 90 ] || fail "bad input took $((SECONDS - start)) s"

finish
