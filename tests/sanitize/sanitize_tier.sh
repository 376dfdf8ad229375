#!/usr/bin/env bash
# The sanitize tier (label `sanitize`): the unit and mpi tiers built once more with
# AddressSanitizer and UndefinedBehaviorSanitizer, in a second build tree, and run there. Passes
# only when every one of those tests passes and no sanitizer wrote a report.
#
# usage: sanitize_tier.sh SOURCE_DIR BUILD_DIR
# Environment (set by the ctest registration in tests/CMakeLists.txt; all optional):
#   STRATA_SANITIZE_C_COMPILER, STRATA_SANITIZE_CXX_COMPILER, STRATA_SANITIZE_LAUNCHER (e.g. ccache),
#   STRATA_SANITIZE_BUILD_TYPE (default RelWithDebInfo), STRATA_SANITIZE_JOBS (default 2),
#   STRATA_SANITIZE_CTEST_ARGS (extra ctest arguments, e.g. "-R transport" while investigating).
#
# What is built: only the unit and mpi test binaries and what they link (target
# strata_tier_unit_mpi), without CUDA/NCCL (nvcc takes no -fsanitize, and no GPU runs here), without
# examples and without the strata tool (the two unit tests that run the tool, hostlist_vs_scontrol
# and dynamic_ckpt_tool, run in the plain tree only). In this tree the unit binary is one test that
# runs every unit test in one process (a sanitized process costs ~0.4 s to start and leak-check).
#
# By hand, from a configured plain tree:
#   bash tests/sanitize/sanitize_tier.sh . build/sanitize
#   STRATA_SANITIZE_CTEST_ARGS="-R transport" bash tests/sanitize/sanitize_tier.sh . build/sanitize
#
# Reports: ASan (and LeakSanitizer) write to BUILD_DIR/sanitizer-reports/asan.<pid> (log_path)
# rather than to stderr, so a report from a process whose failure a test expected, or from a rank
# whose exit mpirun folded into another message, is still seen. UBSan, linked beside ASan, runs as
# its plugin and ignores log_path (GCC 12: its reports always go to stderr), so the output of every
# test (CTest's LastTest.log, kept as BUILD_DIR/sanitizer-logs/<tier>.log) is searched for
# "runtime error:" and sanitizer banners as well. Any report fails the tier and is printed.
#
# Leaks: LeakSanitizer runs for the unit tier (single process, no MPI started; HDF5 frees its
# caches in an atexit handler that runs before the leak check), with no suppressions. It is off for
# the mpi tier: Open MPI, PMIx and UCX allocate at MPI_Init and never free, and Open MPI dlclose()s
# its components in MPI_Finalize, so those allocations' stacks end in "<unknown module>", where no
# suppressions file can name them (measured: a bare MPI_Init/MPI_Finalize program reports ~120 KB
# in ~3,400 allocations).
set -uo pipefail

[[ $# -eq 2 ]] || { echo "usage: sanitize_tier.sh SOURCE_DIR BUILD_DIR" >&2; exit 2; }
src=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && build=$(cd "$2" && pwd) || exit 2
start=$SECONDS

configure=(-S "$src" -B "$build" -DSTRATA_SANITIZE=address,undefined
           -DCMAKE_BUILD_TYPE="${STRATA_SANITIZE_BUILD_TYPE:-RelWithDebInfo}"
           # -O1 (what the sanitizers' documentation suggests) and line tables: reports keep
           # file:line, and the tree builds in about half the time of -O2 -g.
           -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
           -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_WITH_CUDA=OFF -DSTRATA_WITH_NCCL=OFF)
[[ -n ${STRATA_SANITIZE_C_COMPILER:-} ]] && configure+=(-DCMAKE_C_COMPILER="$STRATA_SANITIZE_C_COMPILER")
[[ -n ${STRATA_SANITIZE_CXX_COMPILER:-} ]] && configure+=(-DCMAKE_CXX_COMPILER="$STRATA_SANITIZE_CXX_COMPILER")
if [[ -n ${STRATA_SANITIZE_LAUNCHER:-} ]]; then
  configure+=(-DCMAKE_C_COMPILER_LAUNCHER="$STRATA_SANITIZE_LAUNCHER" -DCMAKE_CXX_COMPILER_LAUNCHER="$STRATA_SANITIZE_LAUNCHER")
fi

reports=$build/sanitizer-reports
common="halt_on_error=1:abort_on_error=0:print_stacktrace=1:symbolize=1"
# Set before the build too: gtest_discover_tests runs the unit binary to list its tests.
export ASAN_OPTIONS="$common:detect_leaks=0:log_path=$reports/asan:check_initialization_order=1"
export UBSAN_OPTIONS="$common"

echo "== sanitize tier: configure $build"
cmake "${configure[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
echo "== sanitize tier: build ($((SECONDS - start)) s)"
cmake --build "$build" -j"${STRATA_SANITIZE_JOBS:-2}" --target strata_tier_unit_mpi || exit 1
logs=$build/sanitizer-logs
rm -rf "$reports" "$logs"
mkdir -p "$reports" "$logs"

status=0
cd "$build" || exit 1
read -r -a extra <<< "${STRATA_SANITIZE_CTEST_ARGS:-}"
echo "== sanitize tier: unit tests, leaks checked ($((SECONDS - start)) s)"
# As in tests/run: a failed test runs once more, and tests/run lists those that needed it.
ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=0/detect_leaks=1}" \
  ctest --output-on-failure --timeout 600 --repeat until-pass:2 -L unit "${extra[@]}" 2>&1 | tee "$logs/ctest-unit.log" || status=1
cp Testing/Temporary/LastTest.log "$logs/unit.log"
echo "== sanitize tier: mpi tests ($((SECONDS - start)) s)"
ctest --output-on-failure --timeout 600 --repeat until-pass:2 -L mpi -LE unit "${extra[@]}" 2>&1 | tee "$logs/ctest-mpi.log" || status=1
cp Testing/Temporary/LastTest.log "$logs/mpi.log"

shopt -s nullglob
banner='runtime error:|==[0-9]+==(ERROR|WARNING): [A-Za-z]+Sanitizer'
for log in "$logs"/*.log; do
  if grep -Eq "$banner" "$log"; then
    status=1
    echo "== sanitize tier: sanitizer output in the $(basename "$log" .log) tests:"
    grep -En -B2 -A25 "$banner" "$log" | head -n 120
  fi
done
found=("$reports"/*)
if (( ${#found[@]} > 0 )); then
  status=1
  echo "== sanitize tier: ${#found[@]} sanitizer report(s)"
  for f in "${found[@]}"; do
    echo "---- $f"
    head -n 60 "$f"
  done
fi
echo "== sanitize tier: $([[ $status = 0 ]] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit "$status"
