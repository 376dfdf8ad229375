#!/usr/bin/env bash
# strata data synth-ctr end to end: the JSON line and FILE.json, the Criteo layout on disk (plain
# and gzip, one file and several), the same bytes for the same seed, and bad options as one line
# with exit status 2. No MPI.
source "$(dirname "$0")/lib.sh"

case_begin "defaults: one JSON line, FILE.json, 40 columns, oracle AUC in (0.7, 0.9)"
run "$STRATA_BIN" data synth-ctr --out "$TEST_TMP/a.tsv" --rows 20000 --header
expect_rc 0
[ "$(wc -l < "$OUT")" = 1 ] || fail "expected one line on stdout"
expect_json 'j["rows"]' 20000
expect_json '0.7 < j["oracle_auc"] < 0.9' True
expect_json '0.15 < j["positive_rate"] < 0.4' True
expect_json 'j["files"]' "['$TEST_TMP/a.tsv']"
cmp -s <(cat "$OUT") "$TEST_TMP/a.tsv.json" || fail "FILE.json differs from the printed line"
[ "$(wc -l < "$TEST_TMP/a.tsv")" = 20001 ] || fail "expected a header and 20000 rows"
head -1 "$TEST_TMP/a.tsv" | grep -qP '^label\tI1\t.*\tI13\tC1\t.*\tC26$' || fail "header line: $(head -1 "$TEST_TMP/a.tsv")"
bad=$(awk -F'\t' 'NR > 1 && (NF != 40 || $1 !~ /^[01]$/) { n++ } END { print n + 0 }' "$TEST_TMP/a.tsv")
[ "$bad" = 0 ] || fail "$bad rows are not 40 columns with a 0/1 label"
bad=$(awk -F'\t' 'NR > 1 { for (i = 15; i <= 40; i++) if ($i != "" && (length($i) != 8 || $i !~ /^[0-9a-f]+$/)) n++ } END { print n + 0 }' "$TEST_TMP/a.tsv")
[ "$bad" = 0 ] || fail "$bad categorical values are not 8 hex digits"

case_begin "same seed, same bytes; gzip shards concatenate to the single file"
run "$STRATA_BIN" data synth-ctr --out "$TEST_TMP/b.tsv" --rows 5000 --seed 42
expect_rc 0
run "$STRATA_BIN" data synth-ctr --out "$TEST_TMP/c.tsv" --rows 5000 --seed 42
expect_rc 0
cmp -s "$TEST_TMP/b.tsv" "$TEST_TMP/c.tsv" || fail "two runs with seed 42 differ"
run "$STRATA_BIN" data synth-ctr --out "$TEST_TMP/d.tsv.gz" --rows 5000 --seed 42 --files 3
expect_rc 0
expect_json 'len(j["files"])' 3
cat "$TEST_TMP"/d-0000{0,1,2}-of-00003.tsv.gz | gzip -dc | cmp -s - "$TEST_TMP/b.tsv" \
  || fail "the gzip shards do not concatenate to the single file"
run "$STRATA_BIN" data synth-ctr --out "$TEST_TMP/e.tsv" --rows 5000 --seed 43
cmp -s "$TEST_TMP/b.tsv" "$TEST_TMP/e.tsv" && fail "seeds 42 and 43 wrote the same data"

case_begin "bad options: one line, exit 2"
for args in "--rows 0" "--rows x" "--files 0" "--vocab 0" "--vocab 1,2" "--zipf -1" "--missing 1"; do
  # shellcheck disable=SC2086
  run "$STRATA_BIN" data synth-ctr --out "$TEST_TMP/bad.tsv" $args
  expect_rc 2; expect_one_stderr_line; expect_stderr_has "${args%% *}"
done
run "$STRATA_BIN" data synth-ctr --out /nonexistent_strata_dir/x.tsv
expect_rc 2; expect_one_stderr_line; expect_stderr_has "does not exist"
run "$STRATA_BIN" data synth-ctr --rows 10
expect_rc 2; expect_one_stderr_line; expect_stderr_has "--out"
run "$STRATA_BIN" data
expect_rc 2; expect_one_stderr_line
[ -e "$TEST_TMP/bad.tsv" ] && fail "a refused run wrote its output"

finish
