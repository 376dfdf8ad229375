#!/usr/bin/env bash
# bench_between_nodes.sh STRATA_BIN [ROUNDS] -- the figures of docs/PERFORMANCE.md "Between nodes":
# strata's data plane between emulated nodes against raw TCP request/response measured in the
# same run (the vs_link column of strata bench). Not a test: it asserts only that every result is
# correct, and prints the ratios. Run it on a quiet machine:
#
#   tests/cluster/run_on_cluster.sh 3 tests/cluster/bench_between_nodes.sh build/bin/strata 3
#
# Rows (PS on cn1; one worker on cn2, or two workers on cn2 and cn3 for the aggregate):
#   link     strata bench --op link: the raw baseline alone (4 KiB to 16 MiB)
#   pull     dense pull at 4 KiB, 1 MiB and 16 MiB
#   push     SGD push (accumulate) at 1 MiB and 16 MiB
#   update   Adam and Adagrad updates through the PS inbox at 1 MiB and 16 MiB
#   sparse   4096 random rows of 256 B (64 floats) from a 1M-row table
#   aggregate  2 workers on two other nodes pulling 16 MiB from one PS: busbw against the link
#   dynamic  lookups and updates by id: batches of 4096 Zipf ids (about 2,000 distinct), 16 floats
# Each row is printed ROUNDS times (default 3); the document quotes the median ratio.
# Environment: TRANSPORT (default auto) is passed as --transport.
set -uo pipefail

[[ $# -ge 1 ]] || { echo "usage: bench_between_nodes.sh STRATA_BIN [ROUNDS]" >&2; exit 2; }
BIN=$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")
ROUNDS=${2:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[[ -n ${STRATA_CLUSTER_DIR:-} ]] || { echo "run under tests/cluster/run_on_cluster.sh 3" >&2; exit 2; }
M=("$here/cluster_mpirun" "$STRATA_CLUSTER_DIR")
T=${TRANSPORT:-auto}
status=0

run() {  # run LABEL HOSTS NP ARGS...: prints the table rows prefixed with LABEL
  local label=$1 hosts=$2 np=$3
  shift 3
  local out
  out=$(STRATA_NUM_PS=1 timeout 300 "${M[@]}" --host "$hosts" -np "$np" "$BIN" bench --transport "$T" "$@" 2>&1)
  local rc=$?
  grep -E '^# transport:' <<<"$out" | head -1 | sed "s/^/$label /"
  grep -E '^ +([0-9]+|insert|lookup|update) ' <<<"$out" | sed "s/^/$label /"
  if [[ $rc -ne 0 ]]; then echo "$label: exit status $rc"; echo "$out" | tail -5; status=1; fi
}

for round in $(seq 1 "$ROUNDS"); do
  echo "### round $round"
  run link cn1,cn2 2 --op link -b 4K -e 16M -f 16 -n 20
  run pull cn1,cn2 2 --op pull -b 4K -e 4K -n 200
  run pull cn1,cn2 2 --op pull -b 1M -e 16M -f 16 -n 20
  run push cn1,cn2 2 --op push -b 1M -e 16M -f 16 -n 20
  run update_adam cn1,cn2 2 --op update --optimizer adam -b 1M -e 16M -f 16 -n 10
  run update_adagrad cn1,cn2 2 --op update --optimizer adagrad -b 1M -e 16M -f 16 -n 10
  run sparse cn1,cn2 2 --op sparse -b 4096 --rows 1M --row-elems 64 -n 20
  run aggregate cn1,cn2,cn3 3 --op pull -b 16M -e 16M -n 20
  run dynamic cn1,cn2 2 --op dynamic -n 64
done
exit $status
