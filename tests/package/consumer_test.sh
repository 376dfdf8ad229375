#!/usr/bin/env bash
# Installs strata into a temporary prefix, builds examples/consumer against it with
# find_package(strata), and runs the result on 3 MPI ranks.
# Usage: consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$src/examples/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" -j2 > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }

flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags=(--allow-run-as-root "${flags[@]}")
out=$(timeout 120 mpirun "${flags[@]}" -np 3 "$tmp/consumer/whoami" 1 | sort)
echo "$out"
expected_tasks="ps:0 worker:0 worker:1"
got_tasks=$(echo "$out" | awk '{print $6}' | tr '\n' ' ' | sed 's/ $//')
if [ "$got_tasks" != "$expected_tasks" ]; then
  echo "FAIL: expected tasks '$expected_tasks', got '$got_tasks'"
  exit 1
fi
grep -q "is worker:0 on .* (chief: yes)" <<<"$out" || { echo "FAIL: worker:0 should be the chief"; exit 1; }
# A user's own model, written against the public strategy API only: 1 PS + 2 workers, each with 2
# CPU replicas; it exits non-zero unless the loss at least halves.
out=$(timeout 120 mpirun "${flags[@]}" -np 3 "$tmp/consumer/custom_model") || { echo "FAIL: custom_model: $out"; exit 1; }
echo "$out"
[ "$(echo "$out" | grep -c 'loss .* -> ')" = 2 ] || { echo "FAIL: expected a loss line from each worker"; exit 1; }

# The package says which instruction set its libraries were built for (STRATA_ARCH; a package for
# other machines is built with -DSTRATA_ARCH=portable), the same in the CMake config and config.h,
# and hands no -march to its users.
cfg_arch=$(sed -n 's/^set(strata_ARCH "\(.*\)")$/\1/p' "$tmp"/prefix/lib*/cmake/strata/strataConfig.cmake)
hdr_arch=$(sed -n 's/^#define STRATA_BUILD_ARCH "\(.*\)"$/\1/p' "$tmp/prefix/include/strata/config.h")
[ -n "$cfg_arch" ] && [ "$cfg_arch" = "$hdr_arch" ] ||
  { echo "FAIL: strata_ARCH '$cfg_arch' in strataConfig.cmake, STRATA_BUILD_ARCH '$hdr_arch' in config.h"; exit 1; }
if grep -rq -e '-march=' -e 'ffp-contract' "$tmp"/prefix/lib*/cmake/strata/; then
  echo "FAIL: the installed targets pass code-generation flags on to consumers"; exit 1
fi

# Public headers must not drag in CUDA, NCCL, UCX or HDF5.
if grep -rEn '#include *<(cuda|nccl|ucp|uct|ucs|hdf5|H5)' "$tmp/prefix/include/strata"; then
  echo "FAIL: a public header includes a GPU/UCX/HDF5 header"
  exit 1
fi
# The same user model through train_and_evaluate's checkpoints: SIGKILL of a worker in the middle
# ends the job; run again, it resumes from its last committed checkpoint and finishes, and an
# evaluator task (STRATA_JOBS, as strata-mpirun --evaluator sets it) evaluates the final checkpoint.
dir="$tmp/model"
timeout 120 mpirun "${flags[@]}" -np 3 "$tmp/consumer/custom_model" "$dir" 6000 > "$tmp/run1.log" 2>&1 &
launcher=$!
for _ in $(seq 1 600); do
  [ -f "$dir/checkpoint.json" ] && break
  sleep 0.05
done
[ -f "$dir/checkpoint.json" ] || { echo "FAIL: no checkpoint committed before the kill"; cat "$tmp/run1.log"; exit 1; }
mpirun_pid=$(pgrep -P "$launcher" | head -1)
victim=$(pgrep -P "$mpirun_pid" | tail -1)   # the last rank: worker:1
[ -n "$victim" ] || { echo "FAIL: no rank to kill"; exit 1; }
kill -9 "$victim"
rc1=0; wait "$launcher" || rc1=$?
[ "$rc1" != 0 ] || { echo "FAIL: the job survived the SIGKILL of a worker (or ended before it)"; cat "$tmp/run1.log"; exit 1; }
out=$(timeout 120 mpirun "${flags[@]}" -x STRATA_JOBS=ps=1,worker=2,evaluator=1 -np 4 \
      env STRATA_JOBS=ps=1,worker=2,evaluator=1 "$tmp/consumer/custom_model" "$dir" 6000 2>&1) ||
  { echo "FAIL: the resumed job: $out"; exit 1; }
echo "$out" | grep -v auto-shard | grep -v '^{' | tail -8
grep -q "^resuming at epoch" <<<"$out" || { echo "FAIL: the job did not resume"; exit 1; }
[ "$(echo "$out" | grep -c 'loss .* -> ')" = 2 ] || { echo "FAIL: expected a loss line from each worker"; exit 1; }
python3 - "$dir/eval.jsonl" <<'PY' || { echo "FAIL: the evaluator did not evaluate the final checkpoint"; exit 1; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows and rows[-1]["global_step"] == 12000 and rows[-1]["accuracy"] > 0.9, rows
PY
echo "package test passed"
