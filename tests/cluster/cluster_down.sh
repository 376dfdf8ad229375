#!/usr/bin/env bash
# cluster_down.sh DIR -- stop the emulated cluster that cluster_up.sh started in DIR.
#
# Order:
#   1. Slurm, if there is one: tests/slurm/slurm_down.sh DIR/slurm (cancel jobs, then slurmd,
#      slurmctld and munged by their recorded PIDs, then step daemons and clients of this
#      cluster found by the STRATA_SLURM_DIR marker in their environment).
#   2. Every process still inside one of this run's network namespaces (`ip netns pids`: the
#      node holders, orted and ranks of mpirun jobs, anything node_exec started): SIGTERM,
#      then SIGKILL after STRATA_CLUSTER_TERM_WAIT seconds (default 3).
#   3. The namespaces, the host-side veths and the bridge, by the names in DIR/cluster.env.
# Nothing is ever killed by process name, and no namespace or link of another run is touched:
# every name carries this run's id.
#
# Idempotent: a second call, or a call after cluster_up.sh failed halfway, finds nothing left
# and returns 0. Prints one line per leftover it could not remove (and then exits 1). DIR
# itself is left in place (logs); the caller removes it.
set -uo pipefail   # no -e: teardown must carry on past any single failure

prog=cluster_down
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[[ $# -eq 1 ]] || { echo "usage: $prog DIR" >&2; exit 2; }
[[ -f $1/cluster.env ]] || exit 0     # nothing was ever started there
DIR=$(cd "$1" && pwd -P)
TERM_WAIT=${STRATA_CLUSTER_TERM_WAIT:-3}

# Our own file, written by cluster_up.sh; read as data, not sourced.
conf() { sed -n "s/^$1=//p" "$DIR/cluster.env" | tail -n1; }
ID=$(conf STRATA_CLUSTER_ID)
N=$(conf STRATA_CLUSTER_N)
BR=$(conf STRATA_CLUSTER_BRIDGE)
NS_PREFIX=$(conf STRATA_CLUSTER_NETNS_PREFIX)
VETH_PREFIX=$(conf STRATA_CLUSTER_VETH_PREFIX)
# Never act on names that do not carry a run id: a damaged cluster.env must not make us
# delete "strata--n1" patterns that could match someone else's.
[[ $ID =~ ^[0-9]+$ && $N =~ ^[0-9]+$ && $BR == "stb$ID" && $NS_PREFIX == "strata-$ID-n" && $VETH_PREFIX == "stv${ID}n" ]] \
  || { echo "$prog: $DIR/cluster.env is damaged; not touching anything" >&2; exit 1; }

now() { date +%s.%N; }
later() { awk -v t="$(now)" -v d="$1" 'BEGIN {printf "%.3f", t + d}'; }
before() { awk -v n="$(now)" -v d="$1" 'BEGIN {exit !(n < d)}'; }
# running PID: alive and not a zombie (an exited process whose parent has not reaped it yet is
# still "there" for kill -0 but holds no namespace any more).
running() {
  local st
  kill -0 "$1" 2>/dev/null || return 1
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# ---- 1. Slurm ---------------------------------------------------------------------------------
if [[ -d $DIR/slurm ]]; then
  "$here/../slurm/slurm_down.sh" "$DIR/slurm"
fi

# ---- 2. every process inside our namespaces -------------------------------------------------
namespaces=()
for i in $(seq 1 "$N"); do
  [[ -e /var/run/netns/$NS_PREFIX$i ]] && namespaces+=("$NS_PREFIX$i")
done
ns_pids() {
  local ns
  for ns in "${namespaces[@]}"; do ip netns pids "$ns" 2>/dev/null; done | sort -un | tr '\n' ' '
}
if (( ${#namespaces[@]} )); then
  pids=$(ns_pids)
  if [[ -n ${pids// /} ]]; then
    # shellcheck disable=SC2086  # plain numbers
    kill -TERM $pids 2>/dev/null
    until_t=$(later "$TERM_WAIT")
    while :; do
      left=""
      for p in $(ns_pids); do running "$p" && left+="$p "; done
      [[ -z $left ]] && break
      if ! before "$until_t"; then
        # shellcheck disable=SC2086
        kill -KILL $left 2>/dev/null
        sleep 0.2
        left=""
        for p in $(ns_pids); do running "$p" && left+="$p "; done
        [[ -z $left ]] || echo "$prog: processes $left still inside the namespaces after SIGKILL" >&2
        break
      fi
      sleep 0.1
    done
  fi
fi

# ---- 3. namespaces, veths, bridge ---------------------------------------------------------------
for ns in "${namespaces[@]}"; do
  ip netns del "$ns" 2>/dev/null || echo "$prog: could not delete netns $ns" >&2
done
for i in $(seq 1 "$N"); do
  # Usually gone with its peer's namespace already; deleting one end deletes both.
  ip link show "$VETH_PREFIX$i" >/dev/null 2>&1 && ip link del "$VETH_PREFIX$i" 2>/dev/null
done
if ip link show "$BR" >/dev/null 2>&1; then
  ip link del "$BR" 2>/dev/null || echo "$prog: could not delete bridge $BR" >&2
fi

# ---- verify ---------------------------------------------------------------------------------------
rc=0
left_ns=$(ip netns list 2>/dev/null | awk -v p="$NS_PREFIX" 'index($1, p) == 1 {printf "%s ", $1}')
[[ -z $left_ns ]] || { echo "$prog: namespaces left: $left_ns" >&2; rc=1; }
left_links=$(ip -o link show 2>/dev/null | awk -F': ' -v b="$BR" -v v="$VETH_PREFIX" \
  '{sub(/@.*/, "", $2)} $2 == b || index($2, v) == 1 {printf "%s ", $2}')
[[ -z $left_links ]] || { echo "$prog: links left: $left_links" >&2; rc=1; }
exit "$rc"
