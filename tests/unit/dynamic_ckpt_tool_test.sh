#!/bin/bash
# `strata ckpt ls` and `strata ckpt verify` on dynamic-table files (checkpoint/FORMAT.md section
# 10): tables and chains listed, a damaged delta reported with the state a restore falls back to,
# a broken chain without a base, and the exit statuses.
# Usage: dynamic_ckpt_tool_test.sh STRATA_BIN DYNAMIC_CKPT_SIZE_TOOL
set -u
strata=$1
make_files=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
expect() {  # expect RC PATTERN OUTPUT-FILE WHAT
  [ "$rc" = "$1" ] || { cat "$3"; fail "$4: exit status $rc, expected $1"; }
  grep -qF -- "$2" "$3" || { cat "$3"; fail "$4: no line with '$2'"; }
}

# A full save of 2000 rows (step 2) and a delta with 10% of them updated and 2% evicted (step 3).
"$make_files" "$tmp" 2000 4 0.10 0.02 > "$tmp/make.txt" 2>&1 || { cat "$tmp/make.txt"; fail "the tool failed"; }
grep -qF "equals the live table: yes" "$tmp/make.txt" || fail "the tool's restore differs from the live table"

"$strata" ckpt ls "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 0 "emb full 2000 rows" "$tmp/out" "ls"
expect 0 "emb delta of step 2: 200 rows changed, 40 evicted, 1960 rows after" "$tmp/out" "ls"
expect 0 "restore emb: step 3 from dynamic-2.h5 <- dynamic-3.h5" "$tmp/out" "ls"
"$strata" ckpt verify "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 0 "2 dynamic file(s): 2 OK" "$tmp/out" "verify"
# The chain restores bit for bit to the live table (saved full by the tool under live/).
"$strata" ckpt diff "$tmp/dynamic-3.h5" "$tmp/live/dynamic-3.h5" > "$tmp/out" 2>&1; rc=$?
expect 0 "identical" "$tmp/out" "diff chain vs live"
"$strata" ckpt diff "$tmp/dynamic-2.h5" "$tmp/dynamic-3.h5" > "$tmp/out" 2>&1; rc=$?
expect 1 "row(s) differ" "$tmp/out" "diff step 2 vs step 3"
expect 1 "id(s) only in A" "$tmp/out" "diff step 2 vs step 3"
"$strata" ckpt verify "$tmp/dynamic-3.h5" > "$tmp/out" 2>&1; rc=$?
expect 0 "dynamic-3.h5: OK (step 3, dynamic: emb delta of step 2" "$tmp/out" "verify FILE"

# One byte of the delta changed: listed as corrupt, the restore falls back to step 2.
/usr/bin/python3 - "$tmp/dynamic-3.h5" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) * 7 // 10] ^= 0x5A
open(path, "wb").write(data)
PY
"$strata" ckpt ls --verify "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 1 "CORRUPT" "$tmp/out" "ls --verify, damaged delta"
expect 1 "restore emb: step 2 from dynamic-2.h5" "$tmp/out" "ls --verify, damaged delta"
expect 1 "the newest complete state; skipped: step 3: dynamic checkpoint" "$tmp/out" "ls --verify, damaged delta"
"$strata" ckpt ls "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 0 "CORRUPT" "$tmp/out" "ls without --verify reports, exits 0"
"$strata" ckpt ls --json "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 0 '"restore":[{"chain":["dynamic-2.h5"],"step":2,"table":"emb"' "$tmp/out" "ls --json"
"$strata" ckpt verify "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 1 "dynamic-3.h5: FAILED: dynamic checkpoint" "$tmp/out" "verify, damaged delta"
"$strata" ckpt verify "$tmp/dynamic-3.h5" > "$tmp/out" 2>&1; rc=$?
expect 1 "file checksum mismatch" "$tmp/out" "verify FILE, damaged delta"
"$strata" ckpt diff "$tmp/dynamic-3.h5" "$tmp/live/dynamic-3.h5" > "$tmp/out" 2>&1; rc=$?
expect 1 "file checksum mismatch" "$tmp/out" "diff of a damaged file"

# An intact delta without its base: nothing restores.
rm -rf "$tmp"/dynamic-*.h5 "$tmp/live"
"$make_files" "$tmp" 2000 4 0.10 0.02 > "$tmp/make.txt" 2>&1 || { cat "$tmp/make.txt"; fail "the tool failed"; }
rm "$tmp/dynamic-2.h5"
"$strata" ckpt verify "$tmp" > "$tmp/out" 2>&1; rc=$?
expect 1 "dynamic table emb: no complete state" "$tmp/out" "verify, no base"
expect 1 "dynamic-3.h5 links to dynamic-2.h5, which is missing" "$tmp/out" "verify, no base"
echo "PASS"
