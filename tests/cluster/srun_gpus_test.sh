#!/usr/bin/env bash
# srun_gpus_test.sh STRATA_BIN -- per-node GPU assignment of the slurm resolver across 3 nodes of a
# real multi-node Slurm, with uneven tasks per node (no GPU is needed: this checks the assignment,
# not CUDA).
#
# Run inside run_on_cluster.sh --slurm 3 (it provides SLURM_CONF):
#   tests/cluster/run_on_cluster.sh --slurm 3 tests/cluster/srun_gpus_test.sh build/bin/strata
#
# Each case is one `srun -N 3 -n 5 [LAYOUT] strata cluster --gpus-per-node G [--gpus-per-task T]`;
# every task prints where Slurm runs it (SLURMD_NODENAME, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE)
# next to strata's JSON. The expectation is computed here from those, with TensorFlow's
# SlurmClusterResolver rule (auto_set_gpu): GPUs per task T = G // the most tasks on any node
# (unless given), and the task with node-local index L gets CUDA_VISIBLE_DEVICES L*T..L*T+T-1 and
# num_accelerators {"GPU": T}; its address is its own node's, port 8888 + L.
#   gpn2        srun -N 3 -n 5 (block, 3,1,1), --gpus-per-node 2: T = 0, every task "" (TF's rule:
#               3 tasks share cn1's 2 GPUs, so none gets one; the same T on every node)
#   gpn4        the same with --gpus-per-node 4: T = 1, cn1 "0" "1" "2", cn2 "0", cn3 "0"
#   gpn6_gpt2   --gpus-per-node 6 --gpus-per-task 2: cn1 "0,1" "2,3" "4,5", cn2 "0,1", cn3 "0,1"
#   c2_block    srun -N 3 -n 5 -c 2 (2 CPUs per task on 4-CPU nodes: 2,2,1), --gpus-per-node 2:
#               T = 1, cn1 "0" "1", cn2 "0" "1", cn3 "0"
#   c2_cyclic   the same with -m cyclic and --mpi=none (no Slurm task map: strata lays the tasks
#               out from SLURM_DISTRIBUTION): tasks 0,3 on cn1, 1,4 on cn2, 2 on cn3; task 3 and
#               4 get "1", the others "0"
#   too_many    --gpus-per-node 4 --gpus-per-task 2 on 3,1,1: 3 x 2 > 4, every task exits 2 with
#               one line naming the counts
# Each case also checks that Slurm chose the uneven layout it is about. About 5 s + the cluster.
# Environment: STRATA_STEP_TIMEOUT (default 60 s) bounds each srun.
set -uo pipefail   # no -e: every assertion runs and reports, the summary decides

[[ $# -eq 1 ]] || { echo "usage: srun_gpus_test.sh STRATA_BIN" >&2; exit 2; }
[[ -x $1 ]] || { echo "FAIL: strata binary not found or not executable: $1" >&2; exit 1; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
[[ -n ${SLURM_CONF:-} ]] || { echo "srun_gpus_test: SLURM_CONF not set; run under tests/cluster/run_on_cluster.sh --slurm 3" >&2; exit 2; }
STEP_TIMEOUT=${STRATA_STEP_TIMEOUT:-60}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
case_failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); case_failed=1; }
dump() {
  [[ $case_failed -eq 1 ]] || return 0
  echo "---- $1: stdout ----"; cat "$work/$1.out"
  echo "---- $1: stderr ----"; cat "$work/$1.err"
  echo "---- end $1 ----"
}

# gpu_case NAME WANT_TPN GPT_OR_- SRUN-OPTIONS... -- STRATA-CLUSTER-FLAGS...
# GPT: the --gpus-per-task given, or - for TF's default (G // the most tasks on a node).
gpu_case() {
  local name=$1 want_tpn=$2 gpt=$3 srun_args=() flags=() rc check
  shift 3
  while [[ $1 != -- ]]; do srun_args+=("$1"); shift; done
  shift
  flags=("$@")
  case_failed=0
  echo "== $name: srun ${srun_args[*]} strata cluster ${flags[*]}"
  # shellcheck disable=SC2016  # expanded by the task's shell
  timeout --kill-after=10 "$STEP_TIMEOUT" srun "${srun_args[@]}" \
    sh -c 'out=$("$0" "$@" 2>&1); rc=$?; echo "TASK $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID $SLURM_STEP_TASKS_PER_NODE $rc $out"; exit $rc' \
    "$BIN" cluster "${flags[@]}" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then fail "$name: did not finish within ${STEP_TIMEOUT} s"; dump "$name"; return; fi
  if [[ $rc -eq 0 ]]; then pass "$name: exit status 0"; else fail "$name: exit status $rc, expected 0"; fi
  check=$(python3 - "$work/$name.out" "$want_tpn" "$gpt" "${flags[@]}" <<'EOF'
import json, re, sys
path, want_tpn, gpt_arg, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
gpn = int(flags[flags.index("--gpus-per-node") + 1])
tasks, bad = {}, []
for line in open(path).read().splitlines():
    if not line.startswith("TASK "):
        continue
    f = line.split(" ", 6)
    try:
        tasks[int(f[1])] = dict(node=f[2], local=int(f[3]), tpn=f[4], rc=int(f[5]), json=json.loads(f[6]))
    except Exception as e:  # noqa: BLE001
        bad.append("unreadable %r (%s)" % (line[:200], e))
if sorted(tasks) != list(range(5)):
    bad.append("tasks %s reported, expected 0-4" % sorted(tasks))
tpns = {t["tpn"] for t in tasks.values()}
if tpns != {want_tpn}:
    bad.append("SLURM_STEP_TASKS_PER_NODE %s, expected %s" % (sorted(tpns), want_tpn))
def expand(tpn):
    out = []
    for item in tpn.split(","):
        m = re.fullmatch(r"(\d+)\(x(\d+)\)", item)
        out += [int(m.group(1))] * int(m.group(2)) if m else [int(item)]
    return out
most = max(expand(want_tpn))
gpt = int(gpt_arg) if gpt_arg != "-" else gpn // most
seen = []
for p, t in sorted(tasks.items()):
    j, L = t["json"], t["local"]
    want_cvd = ",".join(str(g) for g in range(L * gpt, (L + 1) * gpt))
    got = (j["num_accelerators"]["GPU"], j["cuda_visible_devices"], j["master"])
    want = (gpt, want_cvd, "grpc://%s:%d" % (t["node"], 8888 + L))
    if got != want:
        bad.append("task %d (%s local %d): GPU %s, CUDA_VISIBLE_DEVICES %r, address %s; expected %s, %r, %s"
                   % ((p, t["node"], L) + got + want))
    seen.append("%d:%s/%d=%r" % (p, t["node"], L, j["cuda_visible_devices"]))
print("; ".join(bad) if bad else "ok %d GPU(s) per task: %s" % (gpt, " ".join(seen)))
EOF
)
  if [[ $check == ok* ]]; then pass "$name: every task's GPUs follow its node-local index: ${check#ok }"
  else fail "$name: $check"; fi
  dump "$name"
}

gpu_case gpn2 '3,1(x2)' - -N 3 -n 5 -- --gpus-per-node 2
gpu_case gpn4 '3,1(x2)' - -N 3 -n 5 -- --gpus-per-node 4
gpu_case gpn6_gpt2 '3,1(x2)' 2 -N 3 -n 5 -- --gpus-per-node 6 --gpus-per-task 2
gpu_case c2_block '2(x2),1' - -N 3 -n 5 -c 2 -- --gpus-per-node 2
gpu_case c2_cyclic '2(x2),1' - -N 3 -n 5 -c 2 -m cyclic --mpi=none -- --gpus-per-node 2

# More GPUs per task than a node's GPUs allow: a clear error on every task, nothing assigned.
name=too_many
case_failed=0
echo "== $name: srun -N 3 -n 5 strata cluster --gpus-per-node 4 --gpus-per-task 2"
timeout --kill-after=10 "$STEP_TIMEOUT" srun -N 3 -n 5 "$BIN" cluster --gpus-per-node 4 --gpus-per-task 2 \
  >"$work/$name.out" 2>"$work/$name.err"
rc=$?
[[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]] && pass "$name: exit status $rc (non-zero)" || fail "$name: exit status $rc, expected an error"
n=$(grep -c 'strata: error: 2 GPU(s) per task x 3 tasks on a node needs 6 GPUs but a node has 4' "$work/$name.err")
[[ $n == 5 ]] && pass "$name: each of the 5 tasks printed 'strata: error: 2 GPU(s) per task x 3 tasks on a node needs 6 GPUs but a node has 4 ...'" \
  || fail "$name: $n task(s) printed the GPU count error, expected 5"
[[ ! -s $work/$name.out ]] && pass "$name: no task printed a cluster" || fail "$name: a task printed a cluster"
dump "$name"

echo
if [[ $failed -eq 0 ]]; then echo "srun_gpus_test: all assertions passed"; exit 0; fi
echo "srun_gpus_test: $failed assertion(s) failed"
exit 1
