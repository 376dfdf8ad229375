#!/usr/bin/env bash
# The sanitize tier (label `sanitize`): the unit and inproc tiers built once more with
# AddressSanitizer and UndefinedBehaviorSanitizer, in a second build tree, and run there; the
# inproc tier with ThreadSanitizer in a third. Passes only when every one of those tests passes
# and no sanitizer wrote a report. The mpi tier can be run the same way by hand (phase mpi, or
# all); CTest runs the unit and inproc tiers, where the PS protocol, the dynamic tables and the
# strategy run as thread ranks (tests/ranks/).
#
# usage: sanitize_tier.sh SOURCE_DIR BUILD_DIR
# Environment (set by the ctest registration in tests/CMakeLists.txt; all optional):
#   STRATA_SANITIZE_C_COMPILER, STRATA_SANITIZE_CXX_COMPILER, STRATA_SANITIZE_LAUNCHER (e.g. ccache),
#   STRATA_SANITIZE_BUILD_TYPE (default RelWithDebInfo), STRATA_SANITIZE_JOBS (default 2),
#   STRATA_SANITIZE_CTEST_ARGS (extra ctest arguments, e.g. "-R transport" while investigating).
#
# What is built: only the unit and inproc test binaries and what they link (target
# strata_tier_sanitize; phases mpi and all add the mpi tier's, strata_tier_mpi), without CUDA/NCCL (nvcc takes no -fsanitize, and no GPU runs here), without
# examples and without the strata tool (the two unit tests that run the tool, hostlist_vs_scontrol
# and dynamic_ckpt_tool, run in the plain tree only). In this tree the unit binary is one test that
# runs every unit test in one process (a sanitized process costs ~0.4 s to start and leak-check).
#
# By hand, from a configured plain tree:
#   bash tests/sanitize/sanitize_tier.sh . build/sanitize        # unit, inproc and mpi
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

# Phases: `build` (configure and build the tree), `unit` and `mpi` (run that tier in the built
# tree and check for reports), or `all` (the three in order; the default). CTest runs them as three
# tests (sanitize.build is the fixture of the other two), so the build runs beside the other tiers
# and its tests start as soon as it is done. STRATA_SANITIZE_NICE (CTest sets 19) lowers the
# build's priority: on cores it shares with the other tiers' tests it takes only what they leave
# idle, so their timing-bound cases see the machine as when they run alone.
# STRATA_SANITIZERS (default address,undefined) and STRATA_SANITIZE_TARGET (targets, space
# separated; default strata_tier_sanitize, plus strata_tier_mpi for phase all) choose the tree: sanitize.thread_build builds the inproc tier with
# ThreadSanitizer (STRATA_SANITIZERS=thread, target strata_inproc_tests) in a third tree, and the
# `inproc` phase runs it there (a data race is a report, and fails the phase).
phase=all
case ${1:-} in build|unit|mpi|inproc|all) phase=$1; shift ;; esac
[[ $# -eq 2 ]] || { echo "usage: sanitize_tier.sh [build|unit|mpi|inproc|all] SOURCE_DIR BUILD_DIR" >&2; exit 2; }
src=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && build=$(cd "$2" && pwd) || exit 2
start=$SECONDS

sanitizers=${STRATA_SANITIZERS:-address,undefined}
configure=(-S "$src" -B "$build" -DSTRATA_SANITIZE="$sanitizers"
           -DCMAKE_BUILD_TYPE="${STRATA_SANITIZE_BUILD_TYPE:-RelWithDebInfo}"
           # -Og and line tables: reports keep file:line and no access is optimised away, the
           # instrumented code runs near -O1's speed, and the instrumentation (ASan + UBSan
           # checks) costs the optimiser far less compile time than under -O1.
           -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG"
           -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_WITH_CUDA=OFF -DSTRATA_WITH_NCCL=OFF)
# The ThreadSanitizer tree leaves UCX out: its libucm hooks madvise() for every thread stack freed
# and takes an uninstrumented lock there, where TSan's runtime crashes at a thread's exit; the
# inproc tier never uses UCX.
[[ $sanitizers == *thread* ]] && configure+=(-DSTRATA_WITH_UCX=OFF)
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
# ThreadSanitizer (the thread tree): every report to a file, and a race fails the process.
export TSAN_OPTIONS="halt_on_error=1:abort_on_error=0:print_stacktrace=1:symbolize=1:log_path=$reports/tsan"

logs=$build/sanitizer-logs

if [[ $phase == build || $phase == all ]]; then
  echo "== sanitize tier: configure $build"
  nice_cmd=()
  [[ -n ${STRATA_SANITIZE_NICE:-} ]] && nice_cmd=(nice -n "$STRATA_SANITIZE_NICE")
  "${nice_cmd[@]}" cmake "${configure[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
  echo "== sanitize tier: build ($((SECONDS - start)) s)"
  default_targets=strata_tier_sanitize
  [[ $phase == all ]] && default_targets="strata_tier_sanitize strata_tier_mpi"
  read -r -a targets <<< "${STRATA_SANITIZE_TARGET:-$default_targets}"
  "${nice_cmd[@]}" cmake --build "$build" -j"${STRATA_SANITIZE_JOBS:-2}" --target "${targets[@]}" || exit 1
  rm -rf "$reports" "$logs"
  echo "== sanitize tier: built in $((SECONDS - start)) s"
  [[ $phase == build ]] && exit 0
fi
mkdir -p "$reports" "$logs"
[[ -f $build/CTestTestfile.cmake ]] || { echo "sanitize tier: $build is not built (run the build phase first)" >&2; exit 1; }

status=0
cd "$build" || exit 1
read -r -a extra <<< "${STRATA_SANITIZE_CTEST_ARGS:-}"
# Each phase looks only at what its own tests wrote: reports are named by pid, so a phase
# remembers which were there before it ran.
shopt -s nullglob
before=("$reports"/*)
# As in tests/run: a failed test runs once more, and tests/run lists those that needed it.
if [[ $phase == unit || $phase == all ]]; then
  echo "== sanitize tier: unit tests, leaks checked ($((SECONDS - start)) s)"
  ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=0/detect_leaks=1}" \
    ctest --output-on-failure --timeout 600 --repeat until-pass:2 -L 'unit|inproc' "${extra[@]}" 2>&1 | tee "$logs/ctest-unit.log" || status=1
  cp Testing/Temporary/LastTest.log "$logs/unit.log"
fi
if [[ $phase == inproc ]]; then
  echo "== sanitize tier: inproc tests ($sanitizers, $((SECONDS - start)) s)"
  ctest --output-on-failure --timeout 600 --repeat until-pass:2 -L inproc "${extra[@]}" 2>&1 | tee "$logs/ctest-inproc.log" || status=1
  cp Testing/Temporary/LastTest.log "$logs/inproc.log"
fi
if [[ $phase == mpi || $phase == all ]]; then
  echo "== sanitize tier: mpi tests ($((SECONDS - start)) s)"
  ctest --output-on-failure --timeout 600 --repeat until-pass:2 -L mpi -LE unit "${extra[@]}" 2>&1 | tee "$logs/ctest-mpi.log" || status=1
  cp Testing/Temporary/LastTest.log "$logs/mpi.log"
fi

banner='runtime error:|==[0-9]+==(ERROR|WARNING): [A-Za-z]+Sanitizer|WARNING: ThreadSanitizer'
tiers=(unit mpi)
[[ $phase != all ]] && tiers=("$phase")
for tier in "${tiers[@]}"; do
  log=$logs/$tier.log
  if [[ -f $log ]] && grep -Eq "$banner" "$log"; then
    status=1
    echo "== sanitize tier: sanitizer output in the $tier tests:"
    grep -En -B2 -A25 "$banner" "$log" | head -n 120
  fi
done
found=()
for f in "$reports"/*; do
  [[ " ${before[*]} " == *" $f "* ]] || found+=("$f")
done
if (( ${#found[@]} > 0 )); then
  status=1
  echo "== sanitize tier: ${#found[@]} sanitizer report(s)"
  for f in "${found[@]}"; do
    echo "---- $f"
    head -n 60 "$f"
  done
fi
echo "== sanitize tier ($phase): $([[ $status = 0 ]] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit "$status"
