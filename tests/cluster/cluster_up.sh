#!/usr/bin/env bash
# cluster_up.sh [--slurm] DIR N -- start N emulated nodes on this machine, for the cluster tier.
#
# Each node is a network namespace with an eth0 on a private Linux bridge, plus its own UTS and
# mount namespaces (host name cn<i>, its own /etc/hosts, /dev/shm, /tmp, /sys and boot id; see
# node_init for why each). Run commands in a node with `node_exec DIR cn<i> CMD...`, MPI jobs
# with `cluster_mpirun DIR --host cn1:2,cn2:1 ...`, and stop everything with cluster_down.sh DIR.
# With --slurm, also a real multi-node Slurm: munged and slurmctld in the root namespace (on the
# bridge address), one `slurmd -N cn<i>` inside each node; srun/sbatch/sinfo run from the root
# namespace after `source DIR/env.sh`.
#
# DIR must be a fresh directory the caller created (run_on_cluster.sh uses mktemp -d /tmp/...),
# with a short path: munge, PMIx and Open MPI put unix sockets below it (108-byte limit).
#
# Names, unique per run so that concurrent runs and leftovers of a crashed run never collide
# (ID is this script's PID, or a random number if that is taken):
#   network namespaces  strata-ID-n<i>          bridge   stbID (the "head" of the cluster)
#   host-side veths     stvIDn<i>               nodes    cn1..cnN (UTS host names, Slurm names)
#   subnet  10.213.K.0/24: K is picked under a lock among the /24s that no route on the host
#           covers yet (STRATA_CLUSTER_NET=A.B changes 10.213); the bridge is .1, node i is .(10+i)
#
# On success: DIR/env.sh (source it), DIR/hosts, DIR/nodes.txt (INDEX NAME ADDRESS NETNS
# HOLDER_PID NETNS_INODE per node) and one "cluster_up: ready ..." line on stdout.
# On failure: everything started is stopped again (cluster_down.sh), then ONE line
# "cluster_up: <reason>" on stderr, and exit status 77 if this machine cannot run emulated nodes
# at all (not root, tools or Slurm missing, namespaces refused), 1 for any other failure.
#
# Environment:
#   STRATA_CLUSTER_NET          first two octets of the node subnets (default 10.213)
#   STRATA_CLUSTER_UP_TIMEOUT   seconds for nodes (and Slurm) to come up (default 30)
#   STRATA_CLUSTER_SLURM_CPUS   CPUs each Slurm node declares (default 4, on 2 real cores)
#   STRATA_CLUSTER_SHARED_BOOT_ID=1  keep the host's boot id in the nodes, so UCX treats all
#                               nodes as one machine (shared memory between them); for
#                               experiments only (see README.md)
set -euo pipefail

prog=cluster_up
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
usage() { echo "usage: $prog [--slurm] DIR N" >&2; exit 2; }

slurm=0
args=()
for a in "$@"; do
  case $a in
    --slurm) slurm=1 ;;
    -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    -*) usage ;;
    *) args+=("$a") ;;
  esac
done
[[ ${#args[@]} -eq 2 ]] || usage
N=${args[1]}
if ! [[ $N =~ ^[0-9]+$ ]] || (( 10#$N < 1 || 10#$N > 200 )); then echo "$prog: N must be 1..200, got '$N'" >&2; exit 2; fi
N=$((10#$N))

DIR=""
# undo: tear down whatever was started so far. The locks are released first: cluster_down.sh
# (through slurm_down.sh) must not wait for a lock we hold.
undo() {
  exec 8>&- 9>&-
  if [[ -n $DIR && -f $DIR/cluster.env ]]; then
    "$here/cluster_down.sh" "$DIR" >/dev/null 2>&1 || true
  fi
}
# The reason line comes last, so a caller taking the last line of our output shows it.
skip() { undo; echo "$prog: cannot run emulated nodes here: $*" >&2; exit 77; }
fail() { undo; echo "$prog: $*" >&2; exit 1; }

# ---- can this machine do it at all? (exit 77) -----------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "must run as root (network namespaces, bridge, mounts)"
for bin in ip nsenter unshare mount umount mountpoint setsid flock awk stat sleep timeout; do
  command -v "$bin" >/dev/null 2>&1 || skip "$bin not found (install iproute2 util-linux coreutils)"
done
env -C / true 2>/dev/null || skip "env -C not supported (coreutils >= 8.28 needed)"
if (( slurm )); then
  for bin in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd sinfo srun squeue scontrol ss; do
    command -v "$bin" >/dev/null 2>&1 || skip "$bin not found (install munge slurm-wlm slurm-client iproute2)"
  done
fi

[[ -d ${args[0]} ]] || { echo "$prog: ${args[0]} is not a directory (create it first)" >&2; exit 1; }
dir=$(cd "${args[0]}" && pwd -P)
[[ ! -e $dir/cluster.env ]] || { echo "$prog: $dir already holds a cluster; use a fresh directory" >&2; exit 1; }
# The longest socket paths: Open MPI's PMIx sockets in DIR/tmp/ompi.cn1.0/jf.<n>/...
(( ${#dir} <= 48 )) || { echo "$prog: DIR path too long for unix sockets (${#dir} > 48 chars): $dir" >&2; exit 1; }
DIR=$dir
# Our PID, for run_on_cluster.sh's watchdog: if the caller is SIGKILLed while we are still
# starting, the watchdog stops us first and only then tears down, so that nothing is created
# after the teardown.
echo $$ >"$DIR/up.pid"
trap 'rm -f "$DIR/up.pid"' EXIT

t0=$(date +%s.%N)
now() { date +%s.%N; }
TIMEOUT_S=${STRATA_CLUSTER_UP_TIMEOUT:-30}
deadline=$(awk -v t="$(now)" -v d="$TIMEOUT_S" 'BEGIN {printf "%.3f", t + d}')
before_deadline() { awk -v n="$(now)" -v d="$deadline" 'BEGIN {exit !(n < d)}'; }

# ---- names ----------------------------------------------------------------------------------
# Our PID first: unique among running harnesses. A leftover of a crashed run with a recycled
# PID is possible, so anything already present under a candidate id moves us to a random one.
id_taken() {
  [[ -e /var/run/netns/strata-$1-n1 ]] || ip link show "stb$1" >/dev/null 2>&1 \
    || ip link show "stv$1n1" >/dev/null 2>&1
}
ID=$$
tries=0
while id_taken "$ID"; do
  (( ++tries < 50 )) || fail "could not find an unused cluster id (leftover strata-* namespaces?)"
  ID=$(( (RANDOM * 32768 + RANDOM) % 4000000 + 100000 ))
done
BR=stb$ID
NS_PREFIX=strata-$ID-n
VETH_PREFIX=stv${ID}n
NET=${STRATA_CLUSTER_NET:-10.213}
if ! [[ $NET =~ ^([0-9]{1,3})\.([0-9]{1,3})$ ]] || (( BASH_REMATCH[1] > 255 || BASH_REMATCH[2] > 255 )); then
  fail "STRATA_CLUSTER_NET must be two octets such as 10.213, got '$NET'"
fi

mkdir -p "$DIR/pids" "$DIR/log" "$DIR/nodes" "$DIR/tmp"
# Processes of every user may need to traverse DIR (munged checks every directory up to /).
chmod 755 "$DIR"
chmod 1777 "$DIR/tmp"
# Written before anything is created, so that cluster_down.sh can undo a half-finished start.
cat >"$DIR/cluster.env" <<EOF
# Generated by tests/cluster/cluster_up.sh; read by cluster_down.sh and node_exec.
STRATA_CLUSTER_ID=$ID
STRATA_CLUSTER_N=$N
STRATA_CLUSTER_BRIDGE=$BR
STRATA_CLUSTER_NETNS_PREFIX=$NS_PREFIX
STRATA_CLUSTER_VETH_PREFIX=$VETH_PREFIX
EOF

# ---- bridge and subnet (under a lock: two harnesses must not pick the same /24) -------------
# routed NET/24: some route of the host already covers or lies inside it (another run's bridge,
# a VPN, a docker network ...). The default route does not count.
routed() {
  [[ -n $(ip -4 route show root "$1" 2>/dev/null) ]] \
    || ip -4 route show match "$1" 2>/dev/null | grep -qv '^default'
}
LOCK=/tmp/strata-cluster-up.lock
exec 8>>"$LOCK"
flock -w 60 8 || fail "could not take $LOCK within 60 s (another cluster_up.sh stuck?)"
K=""
start=$(( ID % 250 + 1 ))
for off in $(seq 0 249); do
  k=$(( (start + off - 1) % 250 + 1 ))
  if ! routed "$NET.$k.0/24"; then K=$k; break; fi
done
[[ -n $K ]] || fail "no free /24 in $NET.0.0/16 (every $NET.K.0/24 is routed already)"
SUBNET=$NET.$K.0/24
HEAD_ADDR=$NET.$K.1
echo "STRATA_CLUSTER_SUBNET=$SUBNET" >>"$DIR/cluster.env"
if ! err=$(ip link add "$BR" type bridge 2>&1); then
  skip "cannot create a bridge ($err)"
fi
ip link set "$BR" up || fail "cannot bring bridge $BR up"
ip addr add "$HEAD_ADDR/24" dev "$BR" || fail "cannot add $HEAD_ADDR/24 to $BR"
flock -u 8
exec 8>&-

# ---- one network namespace per node ---------------------------------------------------------
node_name() { echo "cn$1"; }
node_addr() { echo "$NET.$K.$((10 + $1))"; }
for i in $(seq 1 "$N"); do
  ns=$NS_PREFIX$i
  if ! err=$(ip netns add "$ns" 2>&1); then
    (( i == 1 )) && skip "ip netns add failed ($err)"
    fail "ip netns add $ns failed: $err"
  fi
  # The node side is called eth0, as on a real machine.
  ip link add "$VETH_PREFIX$i" type veth peer name eth0 netns "$ns" || fail "cannot create veth $VETH_PREFIX$i"
  ip link set "$VETH_PREFIX$i" master "$BR" up || fail "cannot attach $VETH_PREFIX$i to $BR"
  ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0 || fail "cannot address eth0 in $ns"
  ip -n "$ns" link set eth0 up || fail "cannot bring eth0 up in $ns"
  ip -n "$ns" link set lo up || fail "cannot bring lo up in $ns"
done

# /etc/hosts of every node: the bridge host under the machine's own name (it runs slurmctld,
# SlurmctldHost names it) and strata-head, then every node.
HEAD_NAME=$(hostname -s)
{
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
  printf '%s\t%s strata-head\n' "$HEAD_ADDR" "$HEAD_NAME"
  for i in $(seq 1 "$N"); do printf '%s\t%s\n' "$(node_addr "$i")" "$(node_name "$i")"; done
} >"$DIR/hosts"
chmod 644 "$DIR/hosts"

# ---- holders: the processes that own each node's UTS and mount namespaces -------------------
for i in $(seq 1 "$N"); do
  name=$(node_name "$i")
  mkdir -p "$DIR/nodes/$name/tmp" "$DIR/nodes/$name/cgroup"
  chmod 1777 "$DIR/nodes/$name/tmp"
  # setsid: no controlling terminal, so a Ctrl-C at the caller's terminal reaches only the
  # caller, whose teardown then stops the node in order. Fds 8/9 (locks) are not inherited.
  setsid nsenter --net="/var/run/netns/$NS_PREFIX$i" -- \
    unshare --uts --mount --propagation private -- "$here/node_init" "$DIR" "$name" \
    </dev/null >"$DIR/log/node-$name.log" 2>&1 8>&- 9>&- &
  echo $! >"$DIR/pids/node-$name.pid"
  disown $!
done
node_log() { local l; l=$(tail -n1 "$DIR/log/node-$1.log" 2>/dev/null); echo "${l:-no output from node_init}"; }
: >"$DIR/nodes.txt.new"
for i in $(seq 1 "$N"); do
  name=$(node_name "$i")
  pid=$(cat "$DIR/pids/node-$name.pid")
  until [[ -e $DIR/nodes/$name/ready ]]; do
    kill -0 "$pid" 2>/dev/null || fail "node $name did not start: $(node_log "$name")"
    before_deadline || fail "node $name not ready within ${TIMEOUT_S} s: $(node_log "$name")"
    sleep 0.02
  done
  inode=$(stat -L -c %i "/var/run/netns/$NS_PREFIX$i")
  echo "$i $name $(node_addr "$i") $NS_PREFIX$i $pid $inode" >>"$DIR/nodes.txt.new"
done
mv "$DIR/nodes.txt.new" "$DIR/nodes.txt"

# ---- check: names, and the network from every node -----------------------------------------
# A TCP connect to a closed port answers "Connection refused" when the address is reachable
# and times out when it is not: a probe that needs no tool beyond bash.
reach() {  # reach NODE ADDR
  local out
  out=$("$here/node_exec" "$DIR" "$1" timeout 3 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
  [[ $out == *"Connection refused"* ]]
}
for i in $(seq 1 "$N"); do
  name=$(node_name "$i")
  got=$("$here/node_exec" "$DIR" "$name" hostname 2>&1) || fail "cannot run a command in node $name: $got"
  [[ $got == "$name" ]] || fail "node $name has host name '$got'"
  reach "$name" "$HEAD_ADDR" || fail "node $name cannot reach the bridge host $HEAD_ADDR"
  if (( N > 1 )); then
    j=$(( i % N + 1 ))
    reach "$name" "$(node_name "$j")" || fail "node $name cannot reach node $(node_name "$j") by name"
  fi
done

# ---- env.sh ---------------------------------------------------------------------------------
cat >"$DIR/env.sh" <<EOF
# Generated by tests/cluster/cluster_up.sh: source it to use the emulated cluster in $DIR.
export STRATA_CLUSTER_DIR=$DIR
export STRATA_CLUSTER_NODES="$(for i in $(seq 1 "$N"); do printf '%s ' "$(node_name "$i")"; done | sed 's/ $//')"
export STRATA_CLUSTER_SUBNET=$SUBNET
export STRATA_CLUSTER_HEAD_ADDR=$HEAD_ADDR
export STRATA_CLUSTER_TOOLS=$here
# Node-local scratch: DIR/tmp is each node's own directory inside the node (node_init).
export TMPDIR=$DIR/tmp
EOF

# ---- Slurm (--slurm) --------------------------------------------------------------------------
# Same recipe as tests/slurm/slurm_up.sh (tests/cluster/README.md, "Slurm"), with the state in DIR/slurm
# laid out as slurm_up.sh does, so that tests/slurm/slurm_down.sh DIR/slurm stops it:
# daemons in the foreground under setsid (so $! is the daemon), PIDs in DIR/slurm/pids, the
# marker STRATA_SLURM_DIR=DIR/slurm in every daemon's and client's environment.
start_slurm() {
  local SD=$DIR/slurm CPUS=${STRATA_CLUSTER_SLURM_CPUS:-4} MEM_MB i name
  MEM_MB=$(awk -v n="$N" '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9 / n}' /proc/meminfo)
  mkdir -p "$SD/munge" "$SD/state" "$SD/log" "$SD/run" "$SD/pids"
  for i in $(seq 1 "$N"); do mkdir -p "$SD/spool/$(node_name "$i")"; done
  chmod 755 "$SD" "$SD/munge"

  if ! mungekey --create --keyfile="$SD/munge/munge.key" >"$SD/log/mungekey.out" 2>&1; then
    dd if=/dev/urandom of="$SD/munge/munge.key" bs=1024 count=1 status=none \
      || fail "could not create a munge key: $(tail -n1 "$SD/log/mungekey.out")"
  fi
  chown root:root "$SD/munge/munge.key"
  chmod 400 "$SD/munge/munge.key"

  # slurmctld listens in the root namespace, where the single-node harness and other clusters
  # listen too: its port is probed under the lock tests/slurm/slurm_up.sh uses. slurmd listens
  # inside its node, where nothing else does, so its port needs no probe.
  local port_lock=/tmp/strata-slurm-up.lock CTLD_PORT SLURMD_PORT p
  exec 9>>"$port_lock"
  flock -w 60 9 || fail "could not take $port_lock within 60 s (another slurm_up.sh stuck?)"
  p=${STRATA_SLURMCTLD_PORT:-6817}
  while [[ -n $(ss -Htln "sport = :$p" 2>/dev/null) ]]; do
    (( ++p < 65000 )) || fail "no free port for slurmctld"
  done
  CTLD_PORT=$p
  SLURMD_PORT=$((CTLD_PORT + 1))
  # Job ids from a block of our own (see slurm_up.sh): Open MPI names files by job id.
  local FIRST_JOB_ID=$(( (CTLD_PORT % 500) * 100000 + RANDOM % 50000 + 1 ))

  {
    cat <<EOF
# Generated by tests/cluster/cluster_up.sh for an emulated $N-node cluster.
ClusterName=strata-cluster
# slurmctld refuses to start unless this is its own host name; it runs in the root
# namespace and the nodes reach it on the bridge.
SlurmctldHost=$HEAD_NAME($HEAD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SD/munge/munge.socket
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$SD/state
SlurmdSpoolDir=$SD/spool/%n
SlurmctldPidFile=$SD/run/slurmctld.pid
SlurmdPidFile=$SD/run/slurmd-%n.pid
SlurmctldLogFile=$SD/log/slurmctld.log
SlurmdLogFile=$SD/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# The same path on every node, but node-local: node_init bind-mounts each node's own
# directory over DIR/tmp. pmix step directories are named by job id only, so a shared TmpFS
# breaks multi-node steps ("Cannot create directory ... File exists").
TmpFS=$DIR/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
KillWait=5
MinJobAge=${STRATA_SLURM_MIN_JOB_AGE:-5}
FirstJobId=$FIRST_JOB_ID
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
EOF
    for i in $(seq 1 "$N"); do
      echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$SD/slurm.conf"

  cat >>"$DIR/env.sh" <<EOF
# Slurm (cluster_up.sh --slurm). Variables of an outer allocation would make srun attach to a
# job id that does not exist in this cluster, so they are dropped.
for __strata_v in \$(compgen -e); do
  case \$__strata_v in SLURM_*|SBATCH_*|SALLOC_*|SRUN_*) unset "\$__strata_v" ;; esac
done
unset __strata_v
export SLURM_CONF=$SD/slurm.conf
export STRATA_SLURM_DIR=$SD
export MUNGE_SOCKET=$SD/munge/munge.socket
EOF

  # start NAME [node_exec DIR NODE] CMD...: a daemon in the foreground, detached; $! is it.
  start() {
    local name=$1; shift
    STRATA_SLURM_DIR=$SD SLURM_CONF=$SD/slurm.conf TMPDIR=$DIR/tmp \
      setsid "$@" </dev/null >"$SD/log/$name.out" 2>&1 8>&- 9>&- &
    echo $! >"$SD/pids/$name.pid"
    disown $!
  }
  alive() { local pid; pid=$(cat "$SD/pids/$1.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; }
  last_line() {
    local f line=""
    for f in "$@"; do
      [[ -s $f ]] || continue
      line=$(grep -Ei 'error|fatal' "$f" | grep -v 'No such file or directory.*state' | tail -n1 || true)
      [[ -n $line ]] || line=$(tail -n1 "$f")
    done
    echo "${line:-no log output}"
  }

  start munged /usr/sbin/munged --foreground --key-file="$SD/munge/munge.key" \
    --socket="$SD/munge/munge.socket" --pid-file="$SD/run/munged.pid" --seed-file="$SD/munge/munged.seed"
  until [[ -S $SD/munge/munge.socket ]]; do
    alive munged || fail "munged did not start: $(last_line "$SD/log/munged.out")"
    before_deadline || fail "munged did not create its socket within ${TIMEOUT_S} s"
    sleep 0.05
  done
  start slurmctld /usr/sbin/slurmctld -D -c -f "$SD/slurm.conf"
  for i in $(seq 1 "$N"); do
    name=$(node_name "$i")
    start "slurmd-$name" "$here/node_exec" "$DIR" "$name" /usr/sbin/slurmd -D -f "$SD/slurm.conf" -N "$name"
  done

  local want got
  want=$(for i in $(seq 1 "$N"); do printf '%s idle\n' "$(node_name "$i")"; done | sort)
  while :; do
    alive slurmctld || fail "slurmctld did not start: $(last_line "$SD/log/slurmctld.out" "$SD/log/slurmctld.log")"
    for i in $(seq 1 "$N"); do
      name=$(node_name "$i")
      alive "slurmd-$name" || fail "slurmd on $name did not start: $(last_line "$SD/log/slurmd-$name.out" "$SD/log/slurmd-$name.log")"
    done
    if ss -Htlnp "sport = :$CTLD_PORT" 2>/dev/null | grep -q "pid=$(cat "$SD/pids/slurmctld.pid"),"; then
      got=$(SLURM_CONF=$SD/slurm.conf timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
      [[ $got == "$want" ]] && break
    fi
    before_deadline || fail "Slurm nodes not all idle within ${TIMEOUT_S} s (sinfo: $(echo "${got:-no answer}" | tr '\n' ' ')): $(last_line "$SD/log/slurmctld.log")"
    sleep 0.1
  done
  flock -u 9
  exec 9>&-
  slurm_msg=", Slurm: slurmctld on $HEAD_ADDR:$CTLD_PORT, slurmd on every node"
}
slurm_msg=""
(( slurm )) && start_slurm

t1=$(now)
echo "$prog: ready in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s: $N nodes" \
  "cn1..cn$N on $SUBNET (bridge $BR at $HEAD_ADDR, netns $NS_PREFIX<i>)$slurm_msg; source $DIR/env.sh"
