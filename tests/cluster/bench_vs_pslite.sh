#!/usr/bin/env bash
# bench_vs_pslite.sh STRATA_BIN PSLITE_BUILD_DIR [ROUNDS] -- strata against ps-lite (ZeroMQ)
# between two emulated nodes, on the same link in the same run: the comparison of issue 11
# ("ahead of ps-lite on the same link at every size"), reported in docs/PERFORMANCE.md
# "Between nodes". Not a test: it checks only that every result is correct.
#
#   tests/cluster/run_on_cluster.sh 3 tests/cluster/bench_vs_pslite.sh build/bin/strata /work/pslite/build 3
#
# PSLITE_BUILD_DIR is a CMake build of https://github.com/dmlc/ps-lite (libpslite.a; its
# CMakeCache.txt names the source tree with the headers), built against the system's libzmq and
# protobuf. ps-lite is not packaged for Debian and strata never vendors it: when the directory
# is missing, or the driver does not compile against it, the script prints one "SKIP: <reason>"
# line and exits 77.
#
# Layout, the same for both: the server (PS) on cn1, one worker on cn2; ps-lite's scheduler also
# on cn1. Sizes 1 KiB, 4 KiB, 1 MiB, 16 MiB; a push is S bytes added into the server's tensor
# (strata: the SGD accumulate) answered by an ack, a pull is a request answered by S bytes; each
# operation completes before the next (strata bench flushes each, ps-lite waits on each).
# Iterations: 200 below 64 KiB, 20 above, after 5 warm-up operations, for both.
# Every round runs, in this order: strata bench --op link (raw TCP request/response with blocking
# sockets, and the same pull shape over Open MPI's MPI_Send/MPI_Recv), strata --op pull, strata
# --op push, ps-lite (tests/cluster/pslite_bench.cc, compiled here against PSLITE_BUILD_DIR).
# The last lines are the medians over the rounds (time per operation in us, and strata's speedup
# = ps-lite's time / strata's time, > 1 means strata is ahead).
# Environment: TRANSPORT (default auto) is passed to strata as --transport.
set -uo pipefail

[[ $# -ge 2 ]] || { echo "usage: bench_vs_pslite.sh STRATA_BIN PSLITE_BUILD_DIR [ROUNDS]" >&2; exit 2; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
PSL=$2
ROUNDS=${3:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[[ -n ${STRATA_CLUSTER_DIR:-} ]] || { echo "run under tests/cluster/run_on_cluster.sh 3 (or 2)" >&2; exit 2; }
D=$STRATA_CLUSTER_DIR
T=${TRANSPORT:-auto}

# ---- ps-lite: find it, build the driver against it -------------------------------------------
[[ -f $PSL/libpslite.a ]] || { echo "SKIP: no ps-lite build at '$PSL' (no libpslite.a; build https://github.com/dmlc/ps-lite with CMake against libzmq3-dev and libprotobuf-dev)"; exit 77; }
PSL=$(cd "$PSL" && pwd -P)
src=$(sed -n 's/^pslite_SOURCE_DIR:STATIC=//p' "$PSL/CMakeCache.txt" 2>/dev/null)
[[ -n $src && -f $src/include/ps/ps.h ]] || { echo "SKIP: '$PSL' is not a ps-lite CMake build (its CMakeCache.txt names no source tree with include/ps/ps.h)"; exit 77; }
driver=$D/pslite_bench
if ! err=$(g++ -O2 -std=c++14 -I"$src/include" "$here/pslite_bench.cc" "$PSL/libpslite.a" -lzmq -lprotobuf -pthread \
  -o "$driver" 2>&1); then
  echo "SKIP: the ps-lite driver does not build against '$PSL': $(grep -m1 -E 'error|cannot find' <<<"$err")"
  exit 77
fi
cn1_addr=$(awk '$2 == "cn1" {print $3}' "$D/nodes.txt")
[[ -n $cn1_addr ]] || { echo "bench_vs_pslite: no node cn1 in $D/nodes.txt" >&2; exit 2; }

M=("$here/cluster_mpirun" "$D")
rec=$D/vs_pslite.records   # ROUND SYSTEM OP BYTES US
: >"$rec"
status=0

strata() {  # strata ROUND OP ARGS...: one strata bench run; records time_us per size
  local round=$1 op=$2
  shift 2
  local out rc
  out=$(STRATA_NUM_PS=1 timeout 300 "${M[@]}" --host cn1,cn2 -np 2 "$BIN" bench --transport "$T" --op "$op" "$@" 2>&1)
  rc=$?
  grep -E '^# transport:' <<<"$out" | head -1 | sed "s/^/strata-$op /"
  grep -E '^ +[0-9]+ ' <<<"$out" | sed "s/^/strata-$op /"
  if [[ $rc -ne 0 ]]; then echo "strata-$op: exit status $rc"; tail -5 <<<"$out"; status=1; return; fi
  if [[ $op == link ]]; then  # size pull_us pull_GBps push_us push_GBps mpi_us mpi_GBps
    awk -v r="$round" '/^ +[0-9]+ / {print r, "tcp", "pull", $1, $2; print r, "tcp", "push", $1, $4;
      print r, "mpi", "pull", $1, $6}' <<<"$out" >>"$rec"
  else                        # size count dtype time_us algbw #wrong ...
    awk -v r="$round" -v op="$op" '/^ +[0-9]+ / {print r, "strata", op, $1, $4}' <<<"$out" >>"$rec"
  fi
}

pslite() {  # pslite ROUND: scheduler + server on cn1, worker on cn2
  local round=$1 port=$((9100 + RANDOM % 800)) pids=() rc
  local env=(env DMLC_PS_ROOT_URI="$cn1_addr" DMLC_PS_ROOT_PORT="$port" DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1
    DMLC_INTERFACE=eth0)
  "$here/node_exec" "$D" cn1 "${env[@]}" DMLC_ROLE=scheduler timeout 300 "$driver" >"$D/pslite.sched.log" 2>&1 &
  pids+=($!)
  "$here/node_exec" "$D" cn1 "${env[@]}" DMLC_ROLE=server timeout 300 "$driver" >"$D/pslite.server.log" 2>&1 &
  pids+=($!)
  local out
  out=$("$here/node_exec" "$D" cn2 "${env[@]}" DMLC_ROLE=worker timeout 300 "$driver" -w 5 -n 20 -s 200 \
    1024 4096 1048576 16777216 2>&1)
  rc=$?
  grep -E '^pslite ' <<<"$out"
  if [[ $rc -ne 0 ]] || grep -qE 'wrong [1-9]' <<<"$out"; then
    echo "pslite: worker exit status $rc"; tail -5 <<<"$out"; status=1
    kill "${pids[@]}" 2>/dev/null   # only what this function started
  fi
  wait "${pids[@]}"
  awk -v r="$round" '/^pslite / {print r, "pslite", "push", $2, $4; print r, "pslite", "pull", $2, $6}' <<<"$out" >>"$rec"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "### round $round ($(uptime | sed 's/.*load/load/'))"
  strata "$round" link -b 1K -e 4K -f 4 -n 200
  strata "$round" link -b 1M -e 16M -f 16 -n 20
  strata "$round" pull -b 1K -e 4K -f 4 -n 200
  strata "$round" pull -b 1M -e 16M -f 16 -n 20
  strata "$round" push -b 1K -e 4K -f 4 -n 200
  strata "$round" push -b 1M -e 16M -f 16 -n 20
  pslite "$round"
done

echo "### medians over $ROUNDS round(s): us per operation (GB/s); speedup = ps-lite us / strata us"
awk '
  { k = $3 " " $4 " " $2; v[k] = v[k] " " $5; sizes[$4] = 1; ops[$3] = 1 }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " "); if (n == 0) return 0
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function cell(op, s, sys,   m) { m = median(v[op " " s " " sys]); return m > 0 ? sprintf("%.1f (%.3f)", m, s / m / 1e3) : "-" }
  END {
    printf "%-5s %10s %18s %18s %18s %18s %8s\n", "op", "bytes", "strata", "ps-lite", "raw tcp", "mpi", "speedup"
    n = 0; for (s in sizes) list[++n] = s + 0
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (list[j] < list[i]) { t = list[i]; list[i] = list[j]; list[j] = t }
    split("pull push", o, " ")
    for (p = 1; p <= 2; p++) for (i = 1; i <= n; i++) {
      s = list[i]; a = median(v[o[p] " " s " strata"]); b = median(v[o[p] " " s " pslite"])
      printf "%-5s %10d %18s %18s %18s %18s %8s\n", o[p], s, cell(o[p], s, "strata"), cell(o[p], s, "pslite"),
        cell(o[p], s, "tcp"), cell(o[p], s, "mpi"), (a > 0 && b > 0) ? sprintf("%.2f", b / a) : "-"
    }
  }' "$rec"
exit $status
