#!/usr/bin/env bash
# restart_cost.sh [--runs N] [--fault kill|stop] [--at-step G] [--baseline] [-- EXTRA TRAIN FLAGS]
#
# What one failure costs the quickstart job when restarts are on (docs/RELIABILITY.md,
# "Restarts inside the allocation"). Not a test: a measurement, run by hand on a quiet machine.
# Each run is the quickstart job (1 PS + 2 workers, MLP on Fashion-MNIST, default epochs) through
#   mpi_launch/strata-mpirun --ps 1 --workers 2 --max-restarts 1 -- strata train --model mlp
#       --data fashion-mnist --checkpoint-dir DIR --save-every-steps 500 --log-every 10 --log-every-secs 0
# and worker:1 (world rank 2) gets the fault once the chief logged global step G (default 1200,
# i.e. between the saves at 1000 and 1500): kill = SIGKILL, stop = SIGSTOP (found by strata's
# liveness monitor after --stall-timeout). Every line of the launcher's output is time-stamped,
# and each run prints one row:
#   detect_s   fault -> the launcher's restart line (the failed job is gone)
#   relaunch_s restart line -> the chief's "resuming at" line (mpirun, MPI, data, restore)
#   lost       global steps redone: the last global step logged before the fault minus the
#              restored checkpoint's step (a lower bound: up to 20 more steps may have run)
#   lost_s     lost / the restarted run's global steps per second
#   cost_s     detect_s + relaunch_s + lost_s
#   total_s    the launcher's wall time, to compare with an uninterrupted run (--baseline runs
#              the same command once without a fault first)
#   load       the 1-minute load average when the fault was injected (a busy machine slows all)
# Environment: STRATA_BIN (default build/bin/strata of this checkout); STRATA_KEEP_RUNS=1 keeps
# every run's time-stamped output.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd -P)
BIN=${STRATA_BIN:-$root/build/bin/strata}
runs=3 fault=kill at=1200 baseline=0
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --fault) fault=$2; shift 2 ;;
    --at-step) at=$2; shift 2 ;;
    --baseline) baseline=1; shift ;;
    --) shift; break ;;
    *) echo "restart_cost.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
case $fault in kill) sig=KILL ;; stop) sig=STOP ;; *) echo "restart_cost.sh: --fault kill|stop" >&2; exit 2 ;; esac
work=$(mktemp -d)
if [ "${STRATA_KEEP_RUNS:-0}" = 1 ]; then echo "runs kept in $work"; else trap 'rm -rf "$work"' EXIT; fi
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
stamp() { local line; while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
job() {  # job DIR: the measured command, time-stamped output in DIR/out and DIR/err
  local d=$1; shift
  "$root/mpi_launch/strata-mpirun" --ps 1 --workers 2 --max-restarts 1 -- \
    "$BIN" train --model mlp --data fashion-mnist --checkpoint-dir "$d/ck" --save-every-steps 500 \
    --log-every 10 --log-every-secs 0 "$@" > >(stamp >"$d/out") 2> >(stamp >"$d/err")
}

if [ "$baseline" = 1 ]; then
  mkdir "$work/base"
  t0=$EPOCHREALTIME
  job "$work/base" "$@"
  echo "baseline: status $? total_s $(python3 -c "print(round($EPOCHREALTIME - $t0, 1))")"
  sleep 1
fi
echo "run fault at_step ckpt_step lost detect_s relaunch_s lost_s cost_s total_s status load"
for ((i = 1; i <= runs; i++)); do
  d=$work/run$i
  mkdir "$d"
  t0=$EPOCHREALTIME
  job "$d" "$@" &
  launcher=$!
  # Wait (at most 300 s) for the chief's progress line at or past global step $at.
  for ((t = 0; t < 3000; t++)); do
    g=$(grep -oE ' global_step [0-9]+' "$d/out" 2>/dev/null | tail -n1 | awk '{print $2}')
    [ -n "$g" ] && [ "$g" -ge "$at" ] && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  victim=""
  for p in $(descendants "$launcher"); do
    grep -qxz OMPI_COMM_WORLD_RANK=2 "/proc/$p/environ" 2>/dev/null && victim=$p
  done
  if [ -z "$victim" ]; then
    echo "run $i: rank 2 not found (the job ended before global step $at?); its last lines:"
    kill "$launcher" 2>/dev/null; wait
    tail -n 12 "$d/out" "$d/err" | sed 's/^/    /'
    continue
  fi
  t_fault=$EPOCHREALTIME
  kill -s "$sig" "$victim"
  load=$(cut -d' ' -f1 /proc/loadavg)
  for ((t = 0; t < 3000; t++)); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  wait "$launcher"
  st=$?
  t_end=$EPOCHREALTIME
  python3 - "$d" "$t0" "$t_fault" "$t_end" "$i" "$fault" "$at" "$st" "$load" <<'EOF'
import json, re, sys
d, t0, t_fault, t_end, i, fault, at, st, load = sys.argv[1:]
t0, t_fault, t_end = float(t0), float(t_fault), float(t_end)
out = [l.rstrip("\n").split(" ", 1) for l in open(d + "/out")]
err = [l.rstrip("\n").split(" ", 1) for l in open(d + "/err")]
t_restart = next((float(t) for t, l in err if l.startswith("strata-mpirun: restart 1")), None)
t_resume = next((float(t) for t, l in out if l.startswith("resuming at")), None)
before = [int(m.group(1)) for t, l in out if float(t) < t_fault for m in [re.search(r" global_step (\d+)", l)] if m]
restored = next((int(m.group(1)) for t, l in out for m in [re.search(r"^checkpoint: restored .*\(global step (\d+)\)", l)] if m), None)
summ = [json.loads(l) for t, l in out if l.startswith("{")]
if None in (t_restart, t_resume, restored) or not before or not summ:
    print("run %s: incomplete (status %s; restart line %s, resume %s, restored %s, summary %d); its last lines:" % (
        i, st, t_restart, t_resume, restored, len(summ)))
    for t, l in (out[-3:] + err[-12:]):
        print("   ", l)
    sys.exit(0)
s = summ[-1]
lost = before[-1] - restored
# the restarted run's pace: it trained global_step - restored steps in train_s
gps = (s["global_step"] - restored) / max(s["train_s"], 1e-9)
detect, relaunch, lost_s = t_restart - t_fault, t_resume - t_restart, lost / gps
print("%s %s %s %d %d %.1f %.1f %.1f %.1f %.1f %s %s restarts=%s" % (i, fault, at, restored, lost, detect, relaunch, lost_s,
      detect + relaunch + lost_s, t_end - t0, st, load, s.get("restarts")))
EOF
  sleep 1
done
