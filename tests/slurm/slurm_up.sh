#!/usr/bin/env bash
# slurm_up.sh DIR -- start a private single-node Slurm (munged + slurmctld + slurmd from
# Debian, no systemd) whose whole state lives under DIR, for the real-Slurm tests.
#
# DIR must be a fresh directory the caller created (run_with_slurm.sh uses mktemp -d).
# On success: DIR/slurm.conf, DIR/env.sh (source it before srun/sbatch/squeue), the
# node is idle, and one "slurm_up: ready ..." line is printed on stdout.
# On failure: ONE "slurm_up: <reason>" line on stderr, everything started is stopped
# again (slurm_down.sh), exit status 1.
#
# Why the choices below (Debian 12's Slurm 22.05, started without systemd):
# - The daemons run in the foreground (-D / -F) under setsid in the background, so $! IS
#   the daemon: we know every PID we started at once, with no window in which a forked
#   daemon exists but its pid file does not. slurm_down.sh kills by these PIDs only.
# - Ports are probed and chosen under a lock held until the daemons listen, so two
#   harnesses starting at the same moment (or a leftover daemon) never share a port.
# - TmpFS and TMPDIR point into DIR because pmix step daemons and Open MPI create
#   per-job directories there named only by job id: two private clusters running job 1
#   at once would otherwise collide in /tmp ("Cannot create directory ... File exists").
# - A fresh munge key per cluster: nothing depends on /etc/munge or on a system munged.
# - STRATA_SLURM_DIR=DIR is put in the daemons' and clients' environment as a marker, so
#   slurm_down.sh can find step daemons and job tasks of THIS cluster that outlived it.
set -euo pipefail

prog=slurm_up
fail() {
  # Undo whatever was started, then the one reason line, last, so that a caller taking
  # the last line of our output (run_with_slurm.sh) shows the reason.
  if [[ -n "${DIR:-}" && -d "${DIR:-}/pids" ]]; then
    exec 9>&-   # slurm_down.sh must not run while we hold the start lock
    "$(dirname "$0")/slurm_down.sh" "$DIR" >/dev/null 2>&1 || true
  fi
  echo "$prog: $*" >&2
  exit 1
}

[[ $# -eq 1 ]] || { echo "usage: $prog DIR" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$prog: must run as root (slurmd/munged run as root here; SlurmUser=root)" >&2; exit 1; }
[[ -d "$1" ]] || { echo "$prog: $1 is not a directory (create it first)" >&2; exit 1; }
DIR=$(cd "$1" && pwd -P)
[[ ! -e "$DIR/slurm.conf" ]] || { echo "$prog: $DIR already holds a cluster (slurm.conf exists); use a fresh directory" >&2; exit 1; }

for bin in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd sinfo ss flock; do
  command -v "$bin" >/dev/null 2>&1 || { echo "$prog: $bin not found (install munge slurm-wlm slurm-client iproute2 util-linux)" >&2; exit 1; }
done

# Unix socket paths are limited to 108 bytes; munged's socket is the longest fixed one.
(( ${#DIR} <= 80 )) || { echo "$prog: DIR path too long for unix sockets (${#DIR} > 80 chars): $DIR" >&2; exit 1; }

t0=$(date +%s.%N)
HOST=$(hostname -s)
CPUS=${STRATA_SLURM_CPUS:-8}
# Memory as the kernel reports it: declaring more than exists would drain the node
# without config_overrides, and --mem requests should see a realistic limit.
MEM_MB=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
TIMEOUT_S=${STRATA_SLURM_UP_TIMEOUT:-30}

mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool/$HOST" "$DIR/log" "$DIR/run" "$DIR/pids" "$DIR/tmp"
# munged refuses a socket path that others cannot traverse, checking every directory up
# to /, DIR included (mktemp -d makes it 700), and a key readable by anyone but its
# owner.
chmod 755 "$DIR" "$DIR/munge"
chmod 1777 "$DIR/tmp"

# --- munge key -------------------------------------------------------------------------
if ! mungekey --create --keyfile="$DIR/munge/munge.key" >"$DIR/log/mungekey.out" 2>&1; then
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none \
    || fail "could not create a munge key: $(tail -n1 "$DIR/log/mungekey.out")"
fi
chown root:root "$DIR/munge/munge.key"
chmod 400 "$DIR/munge/munge.key"

# --- ports -----------------------------------------------------------------------------
port_in_use() {
  # Listening sockets only: Slurm sets SO_REUSEADDR, so TIME_WAIT leftovers are harmless.
  [[ -n "$(ss -Htln "sport = :$1" 2>/dev/null)" ]]
}
# listening_pid PORT PID: PORT is listened on by process PID.
listening_pid() { ss -Htlnp "sport = :$1" 2>/dev/null | grep -q "pid=$2,"; }
# port_owner PORT: ", port taken by NAME (pid N)" when a process listens on PORT.
port_owner() {
  local who
  who=$(ss -Htlnp "sport = :$1" 2>/dev/null | grep -o 'users:(([^)]*))' | head -n1)
  [[ -z $who ]] || echo ", port $1 taken by ${who#users:}"
}
pick_port() {
  local p=$1 taken=$2
  while (( p < 65000 )); do
    if [[ $p != "$taken" ]] && ! port_in_use "$p"; then echo "$p"; return 0; fi
    p=$((p + 1))
  done
  return 1
}

# Serialise "probe ports .. daemons listening" across concurrent harnesses. fd 9 is
# closed for every daemon (9>&-): a daemon inheriting it would hold the lock forever.
LOCK=/tmp/strata-slurm-up.lock
exec 9>>"$LOCK"
flock -w 60 9 || fail "could not take $LOCK within 60 s (another slurm_up.sh stuck?)"

CTLD_PORT=$(pick_port "${STRATA_SLURMCTLD_PORT:-6817}" 0) || fail "no free port for slurmctld"
SLURMD_PORT=$(pick_port "${STRATA_SLURMD_PORT:-$((CTLD_PORT + 1))}" "$CTLD_PORT") || fail "no free port for slurmd"

# Job ids name files outside DIR that we cannot redirect: Open MPI's shared-memory
# segments in /dev/shm are keyed by the PMIx namespace "slurm.pmix.<job>.<step>", so two
# clusters both running job 1 break each other's MPI_Init ("A system call failed during
# shared memory initialization"). Each cluster therefore numbers its jobs from its own
# block: the block follows the slurmctld port (unique among running clusters), the
# random offset keeps a rerun clear of segments a crashed run left behind.
FIRST_JOB_ID=$(( (CTLD_PORT % 500) * 100000 + RANDOM % 50000 + 1 ))

# --- slurm.conf --------------------------------------------------------------------------
cat >"$DIR/slurm.conf" <<EOF
# Generated by tests/slurm/slurm_up.sh for a private single-node test cluster.
ClusterName=strata-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Private scratch for pmix/step directories named by job id (see the header).
TmpFS=$DIR/tmp
# No cgroups in a container: plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
# Debian's Open MPI only forms a world over PMIx (pmi2 and none fail).
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Declare CPUS=$CPUS on a smaller box: the node registers with the declared count.
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
KillWait=5
# sbatch --wait polls at 2 s and multiplies its interval by 4 while it is below
# MinJobAge/2 (2, 10, 42 s ... with the default 300): 5 keeps it polling every 2 s, so a
# 3 s job is seen done after 4 s, not 10 s. Finished jobs leave squeue/scontrol after
# about 5 s (more on a loaded controller); tests read job output files, not job records.
MinJobAge=${STRATA_SLURM_MIN_JOB_AGE:-5}
FirstJobId=$FIRST_JOB_ID
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

# env.sh is sourced by bash test scripts (compgen is bash). Variables of an outer
# allocation (a CI job that itself runs under Slurm) would make srun attach to a job id
# that does not exist in this cluster, so they are dropped.
cat >"$DIR/env.sh" <<EOF
# Generated by tests/slurm/slurm_up.sh: source before using the private cluster in $DIR.
for __strata_v in \$(compgen -e); do
  case \$__strata_v in SLURM_*|SBATCH_*|SALLOC_*|SRUN_*) unset "\$__strata_v" ;; esac
done
unset __strata_v
export SLURM_CONF=$DIR/slurm.conf
export STRATA_SLURM_DIR=$DIR
export STRATA_SLURM_NODE=$HOST
export TMPDIR=$DIR/tmp
# For munge by hand: munge -S "\$MUNGE_SOCKET" -n | unmunge -S "\$MUNGE_SOCKET"
export MUNGE_SOCKET=$DIR/munge/munge.socket
EOF

# --- start the daemons -----------------------------------------------------------------
# start NAME CMD...: run CMD detached in the foreground mode of the daemon; the pid file
# is written by us before the daemon can do anything, so teardown always finds it.
start() {
  local name=$1; shift
  STRATA_SLURM_DIR=$DIR SLURM_CONF=$DIR/slurm.conf TMPDIR=$DIR/tmp \
    setsid "$@" </dev/null >"$DIR/log/$name.out" 2>&1 9>&- &
  echo $! >"$DIR/pids/$name.pid"
  # No "Killed" job notice from this shell if teardown has to SIGKILL the daemon.
  disown $!
}
alive() { local pid; pid=$(cat "$DIR/pids/$1.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; }
last_line() {
  # The most telling line of a daemon's logs: the last error/fatal, else the last line.
  local f line=""
  for f in "$@"; do
    [[ -s $f ]] || continue
    line=$(grep -Ei 'error|fatal' "$f" | grep -v 'No such file or directory.*state' | tail -n1 || true)
    [[ -n $line ]] || line=$(tail -n1 "$f")
  done
  echo "${line:-no log output}"
}
now() { date +%s.%N; }
deadline=$(awk -v t="$(now)" -v d="$TIMEOUT_S" 'BEGIN {printf "%.3f", t + d}')
before_deadline() { awk -v n="$(now)" -v d="$deadline" 'BEGIN {exit !(n < d)}'; }

# In the foreground munged logs to stderr, i.e. to log/munged.out.
start munged /usr/sbin/munged --foreground --key-file="$DIR/munge/munge.key" \
  --socket="$DIR/munge/munge.socket" --pid-file="$DIR/run/munged.pid" \
  --seed-file="$DIR/munge/munged.seed"
# slurmctld and slurmd authenticate every RPC through the socket: wait for it first.
until [[ -S $DIR/munge/munge.socket ]]; do
  alive munged || fail "munged did not start: $(last_line "$DIR/log/munged.out")"
  before_deadline || fail "munged did not create its socket within ${TIMEOUT_S} s: $(last_line "$DIR/log/munged.out")"
  sleep 0.05
done

# -c: a fresh cluster, no state to recover (the "No such file" state errors are harmless).
start slurmctld /usr/sbin/slurmctld -D -c -f "$DIR/slurm.conf"
start slurmd /usr/sbin/slurmd -D -f "$DIR/slurm.conf" -N "$HOST"

# --- wait until the node is idle ---------------------------------------------------------
state=""
while :; do
  alive slurmctld || fail "slurmctld did not start: $(last_line "$DIR/log/slurmctld.out" "$DIR/log/slurmctld.log")"
  alive slurmd || fail "slurmd did not start: $(last_line "$DIR/log/slurmd.out" "$DIR/log/slurmd-$HOST.log")"
  alive munged || fail "munged died: $(last_line "$DIR/log/munged.out")"
  # Ask only once OUR slurmctld listens: a client that finds no listener retries after
  # a fixed 1 s sleep (doubling the start-up time), and a port taken by someone else
  # between the probe and the bind must fail here, not send our clients elsewhere.
  if ! listening_pid "$CTLD_PORT" "$(cat "$DIR/pids/slurmctld.pid")"; then
    before_deadline || fail "slurmctld not listening on port $CTLD_PORT within ${TIMEOUT_S} s$(port_owner "$CTLD_PORT"): $(last_line "$DIR/log/slurmctld.log")"
    sleep 0.05
    continue
  fi
  state=$(SLURM_CONF=$DIR/slurm.conf timeout 5 sinfo -h -N -n "$HOST" -o '%t' 2>/dev/null || true)
  [[ $state == idle ]] && break
  if ! before_deadline; then
    reason=$(SLURM_CONF=$DIR/slurm.conf timeout 5 sinfo -h -N -n "$HOST" -o '%E' 2>/dev/null || true)
    listening_pid "$SLURMD_PORT" "$(cat "$DIR/pids/slurmd.pid")" \
      || fail "slurmd not listening on port $SLURMD_PORT$(port_owner "$SLURMD_PORT"): $(last_line "$DIR/log/slurmd-$HOST.log")"
    fail "node $HOST not idle within ${TIMEOUT_S} s (state '${state:-no answer from slurmctld}'${reason:+, reason: $reason}): $(last_line "$DIR/log/slurmd-$HOST.log" "$DIR/log/slurmctld.log")"
  fi
  sleep 0.1
done
flock -u 9
exec 9>&-

t1=$(now)
echo "$prog: ready in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s: node $HOST idle," \
  "CPUs=$CPUS, SlurmctldPort=$CTLD_PORT SlurmdPort=$SLURMD_PORT, source $DIR/env.sh"
