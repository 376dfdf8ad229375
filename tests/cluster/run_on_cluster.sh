#!/usr/bin/env bash
# run_on_cluster.sh [--slurm] N CMD... -- run CMD against N emulated nodes, for CTest.
#
# Starts a cluster in a fresh temp directory (cluster_up.sh; with --slurm also a multi-node
# Slurm), sources its env.sh (STRATA_CLUSTER_DIR, STRATA_CLUSTER_SUBNET, TMPDIR, and SLURM_CONF
# with --slurm), runs CMD under `timeout` in the root namespace, and always tears the cluster
# down (cluster_down.sh) and removes the directory, also after Ctrl-C, SIGTERM or a timeout.
# CMD reaches the nodes through tests/cluster/cluster_mpirun, node_exec, or srun/sbatch.
#
# Exit status: CMD's; 124 if CMD ran past the time limit (137 if it then ignored SIGTERM for
# 10 s more); 77 with a "SKIP: <reason>" line if this machine cannot run emulated nodes (not
# root, namespaces refused, Slurm not installed), so register with SKIP_RETURN_CODE 77; 1 if
# the cluster should have started and did not (the reason is printed). A CMD that itself
# exits 77 is reported as skipped as well.
#
# Environment:
#   STRATA_CLUSTER_TIMEOUT    seconds CMD may run (default 120). Keep CTest's TIMEOUT above
#                             this plus about 20 s, so that the cluster is torn down by us and
#                             not abandoned by a SIGKILL from CTest (a watchdog still cleans up
#                             after a SIGKILL, but later).
#   STRATA_KEEP_CLUSTER_DIR   1: keep the cluster directory (hosts, logs) for a look.
# shellcheck disable=SC2317  # functions below are reached through traps
set -uo pipefail   # no -e: CMD's status is collected and returned, not fatal here

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
up_args=()
if [[ ${1:-} == --slurm ]]; then up_args+=(--slurm); shift; fi
[[ $# -ge 2 && $1 =~ ^[0-9]+$ ]] || { echo "usage: run_on_cluster.sh [--slurm] N CMD..." >&2; exit 2; }
n=$1
shift
limit=${STRATA_CLUSTER_TIMEOUT:-120}

# /tmp, not a CTest build directory: sockets live below it (108-byte limit).
dir=$(mktemp -d /tmp/strata-cluster.XXXXXX) || { echo "SKIP: emulated cluster could not start: mktemp failed"; exit 77; }
watchdog=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  # The watchdog would tear down too; stop it first so that the two never race.
  [[ -n $watchdog ]] && kill "$watchdog" 2>/dev/null
  "$here/cluster_down.sh" "$dir" || echo "run_on_cluster: teardown left something behind (see above)" >&2
  if [[ ${STRATA_KEEP_CLUSTER_DIR:-0} == 1 ]]; then
    echo "run_on_cluster: cluster directory kept: $dir" >&2
  else
    rm -rf "$dir"
  fi
  exit "$rc"
}
trap cleanup EXIT
# A signal (CTest, Ctrl-C) is passed on to CMD and then ends the run through the EXIT trap,
# i.e. with a teardown. CMD runs in the background with `wait` below because bash runs traps
# only between commands: a foreground `timeout` would hold the trap back until CMD ended.
cmd_pid=""
on_signal() {
  if [[ -n $cmd_pid ]]; then
    kill -TERM "$cmd_pid" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$cmd_pid" 2>/dev/null || break; sleep 0.5; done
  fi
  exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT
trap 'on_signal 129' HUP

# A SIGKILL (CTest's own timeout) skips every trap and would leave namespaces, a bridge and
# daemons behind. This watchdog lives in its own session, so it survives a kill of our process
# group, and tears down once we are gone. Its output goes nowhere: an inherited stdout would
# keep CTest waiting for EOF on our pipe.
# A cluster_up.sh still starting is stopped first (it would go on creating nodes after the
# teardown). CMD itself (`timeout` and its process group, in the root namespace) is stopped too,
# by the PID we recorded: an mpirun or srun would end with its nodes anyway, anything else not.
# shellcheck disable=SC2016  # $1.. belong to the inner bash
setsid bash -c '
  while kill -0 "$1" 2>/dev/null; do sleep 1; done
  if pid=$(cat "$3/up.pid" 2>/dev/null) && [[ $(tr "\0" " " <"/proc/$pid/cmdline" 2>/dev/null) == *cluster_up.sh* ]]; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if pid=$(cat "$3/cmd.pid" 2>/dev/null) && [[ $(tr "\0" " " <"/proc/$pid/cmdline" 2>/dev/null) == timeout\ * ]]; then
    kill -TERM -- "-$pid" 2>/dev/null
  fi
  "$2/cluster_down.sh" "$3"
  [[ ${STRATA_KEEP_CLUSTER_DIR:-0} == 1 ]] || rm -rf "$3"
' strata-cluster-watchdog "$$" "$here" "$dir" </dev/null >/dev/null 2>&1 &
watchdog=$!

# cluster_up.sh prints one line either way: "ready ..." on success, the reason on failure.
up_msg=$("$here/cluster_up.sh" "${up_args[@]}" "$dir" "$n" 2>&1)
up_rc=$?
if [[ $up_rc -ne 0 ]]; then
  reason=$(printf '%s\n' "$up_msg" | grep '^cluster_up: ' | tail -n1)
  [[ -n $reason ]] || reason=$(printf '%s\n' "$up_msg" | tail -n1)
  if [[ $up_rc -eq 77 ]]; then
    echo "SKIP: emulated cluster could not start: ${reason#cluster_up: }"
    exit 77
  fi
  echo "run_on_cluster: the emulated cluster did not start: ${reason#cluster_up: }" >&2
  exit 1
fi
echo "run_on_cluster: ${up_msg#cluster_up: }" >&2

# shellcheck source=/dev/null  # generated by cluster_up.sh
source "$dir/env.sh"

# --kill-after: a CMD that ignores SIGTERM must not hold the cluster (and CTest) forever.
# stdin is kept explicitly: a background command would otherwise read /dev/null.
# timeout makes itself a process group leader (CMD is in its group): the watchdog stops the group.
timeout --kill-after=10 "$limit" "$@" <&0 &
cmd_pid=$!
echo "$cmd_pid" >"$dir/cmd.pid"
wait "$cmd_pid"
rc=$?
cmd_pid=""
if [[ $rc -eq 124 ]]; then
  echo "run_on_cluster: '$*' did not finish within ${limit} s (STRATA_CLUSTER_TIMEOUT)" >&2
elif [[ $rc -eq 137 ]]; then
  echo "run_on_cluster: '$*' was killed (SIGKILL: ignored SIGTERM at the ${limit} s limit, or killed by someone else)" >&2
fi
exit "$rc"
