#!/usr/bin/env bash
# slurm_down.sh DIR -- stop the private Slurm that slurm_up.sh started in DIR.
#
# Order: cancel jobs (their slurmstepd outlive slurmd), then SIGTERM
# slurmd, slurmctld and munged by the PIDs slurm_up.sh recorded in DIR/pids, SIGKILL
# whatever is still there after a few seconds, and finally sweep step daemons and job
# tasks of this cluster that survived (found by the STRATA_SLURM_DIR=DIR marker in their
# environment). Nothing is ever killed by name.
#
# Idempotent: a second call, or a call after slurm_up.sh failed halfway, finds no live
# process and returns 0. DIR itself is left in place (logs); the caller removes it.
#
# Environment: STRATA_SLURM_TERM_WAIT (default 3 s) before SIGKILL.
set -uo pipefail   # no -e: teardown must carry on past any single failure

prog=slurm_down
[[ $# -eq 1 ]] || { echo "usage: $prog DIR" >&2; exit 2; }
[[ -d "$1" ]] || exit 0            # nothing was ever started there
DIR=$(cd "$1" && pwd -P)
TERM_WAIT=${STRATA_SLURM_TERM_WAIT:-3}

now() { date +%s.%N; }
later() { awk -v t="$(now)" -v d="$1" 'BEGIN {printf "%.3f", t + d}'; }
before() { awk -v n="$(now)" -v d="$1" 'BEGIN {exit !(n < d)}'; }

# ours PID: the process is alive and its command line names DIR. This guards against a
# recycled PID: a daemon that died long ago may have left its number to someone else.
ours() {
  local pid=$1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/"
}

# --- 1. cancel jobs while slurmctld still runs ------------------------------------------
if [[ -f $DIR/slurm.conf && -f $DIR/pids/slurmctld.pid ]] && ours "$(cat "$DIR/pids/slurmctld.pid")"; then
  export SLURM_CONF=$DIR/slurm.conf
  jobs=$(timeout 5 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [[ -n ${jobs// /} ]]; then
    # shellcheck disable=SC2086  # job ids are plain numbers
    timeout 5 scancel $jobs 2>/dev/null
    # Give the step daemons KillWait (5 s) + a little to end the tasks the proper way.
    until_t=$(later 8)
    while before "$until_t"; do
      [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
fi

# --- 2. the daemons, by recorded PID --------------------------------------------------
# Every pid file in DIR/pids, slurmd(s) first: a layout with several slurmd (fake
# multi-node, slurmd-<node>.pid) is torn down the same way.
pids=()
for pf in "$DIR"/pids/slurmd*.pid "$DIR"/pids/slurmctld.pid "$DIR"/pids/munged.pid "$DIR"/pids/*.pid; do
  [[ -f $pf ]] || continue
  pid=$(cat "$pf")
  [[ " ${pids[*]} " == *" $pid "* ]] && continue     # the catch-all glob repeats files
  if ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  fi
done

# running PID: alive and not a zombie. The daemons were reparented to init when
# slurm_up.sh exited, and an init that reaps lazily leaves exited ones as zombies, which
# kill -0 still reports as present.
running() {
  local st
  kill -0 "$1" 2>/dev/null || return 1
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# wait_gone SECONDS PID...: poll until none of PIDs is running; print the survivors.
wait_gone() {
  local until_t left p
  until_t=$(later "$1"); shift
  while :; do
    left=()
    for p in "$@"; do running "$p" && left+=("$p"); done
    (( ${#left[@]} == 0 )) && return 0
    before "$until_t" || { echo "${left[*]}"; return 1; }
    sleep 0.1
  done
}

if (( ${#pids[@]} )); then
  # slurmctld once took about 5 s to honour SIGTERM (here usually < 0.5 s).
  # Its state is thrown away with DIR anyway, so SIGKILL after a short grace costs
  # nothing and bounds the teardown.
  if survivors=$(wait_gone "$TERM_WAIT" "${pids[@]}"); then :; else
    # shellcheck disable=SC2086
    kill -KILL $survivors 2>/dev/null
    # shellcheck disable=SC2086
    if still=$(wait_gone 3 $survivors); then :; else
      echo "$prog: processes $still did not exit after SIGKILL" >&2
    fi
  fi
fi

# --- 3. leftovers of this cluster ---------------------------------------------------------
# Found by environment, never by name: slurmstepd gets SLURM_CONF=DIR/slurm.conf from
# slurmd; batch scripts and tasks get STRATA_SLURM_DIR=DIR from the client environment
# (env.sh) together with SLURM_JOB_ID; slurmctld's helper slurmscriptd inherits the
# marker from slurmctld; client commands carry it from env.sh. Requiring SLURM_JOB_ID
# or a Slurm binary spares the shell that sourced env.sh and is now calling us; our
# own ancestors are skipped too.
ancestors=" $$ "
p=$$
while [[ $p -gt 1 ]]; do
  p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null) || break
  [[ -n $p ]] || break
  ancestors+="$p "
done
left=()
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [[ $ancestors == *" $pid "* ]] && continue
  exe=$(readlink "$d/exe" 2>/dev/null) || continue
  case $exe in
    */slurmstepd*)
      grep -qzxF "SLURM_CONF=$DIR/slurm.conf" "$d/environ" 2>/dev/null && left+=("$pid") ;;
    */slurmctld*|*/slurmd|*/slurmd-wlm|*/munged)
      grep -qzxF "STRATA_SLURM_DIR=$DIR" "$d/environ" 2>/dev/null && left+=("$pid") ;;
    # Clients of this cluster (from env.sh) are useless once it is gone, and an srun
    # whose controller died may wait forever. Only Slurm's client binaries: the shell
    # that sourced env.sh and whatever else it runs are not ours to stop.
    */bin/srun|*/bin/sbatch|*/bin/salloc|*/bin/sattach|*/bin/squeue|*/bin/scontrol|*/bin/sinfo|*/bin/scancel)
      grep -qzxF "STRATA_SLURM_DIR=$DIR" "$d/environ" 2>/dev/null && left+=("$pid") ;;
    *)
      grep -qzxF "STRATA_SLURM_DIR=$DIR" "$d/environ" 2>/dev/null \
        && grep -qz '^SLURM_JOB_ID=' "$d/environ" 2>/dev/null && left+=("$pid") ;;
  esac
done
if (( ${#left[@]} )); then
  echo "$prog: stopping ${#left[@]} leftover step/job process(es) of $DIR: ${left[*]}" >&2
  kill -TERM "${left[@]}" 2>/dev/null
  if survivors=$(wait_gone 2 "${left[@]}"); then :; else
    # shellcheck disable=SC2086
    kill -KILL $survivors 2>/dev/null
    # shellcheck disable=SC2086
    wait_gone 2 $survivors >/dev/null || echo "$prog: processes $survivors did not exit after SIGKILL" >&2
  fi
fi
exit 0
