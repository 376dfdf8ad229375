#!/usr/bin/env bash
# dynamic_big.sh WHERE STRATA_BIN SPEC DATA_DIR OUT_DIR -- not a test: one run of issue 22 item 5
# with one big id column (docs/DYNAMIC.md, "One table of millions of ids: 3 PS + 3 workers"),
# 3 PS + 3 workers, and a one-line report of what the section's table shows.
#
#   WHERE     host  : one host, plain mpirun, 6 ranks
#             nodes : three emulated nodes (run_on_cluster.sh 3), mapped by node, so each node
#                     runs one PS and one worker: every PS serves two workers on other nodes
#   DATA_DIR  the files of `strata data synth-ctr --out DATA_DIR/day.tsv --days 6 ...`: days 0..4
#             are trained in order (--streaming --shuffle-buffer 0 --shard data), day 5 evaluated
#   OUT_DIR   gets train.out / train.err (the job's output), rss.txt (each rank's peak RSS from
#             GNU time) and report.json (the figures below)
#
# The report: AUC on day 5, examples/s, the big column's (C1) table per PS (rows, admitted,
# evicted, bytes) and the other 25 tables' sums when the tables are dynamic, each rank's role,
# node and peak RSS. Environment: STRATA_NUM_PS (default 3), STRATA_BIG_RANKS (default 6),
# STRATA_CLUSTER_TIMEOUT (the nodes' run limit, default 1500 s).
set -uo pipefail

[[ $# -eq 5 && ($1 == host || $1 == nodes) ]] || {
  echo "usage: dynamic_big.sh host|nodes STRATA_BIN SPEC DATA_DIR OUT_DIR" >&2
  exit 2
}
abs() { echo "$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"; }
WHERE=$1 BIN=$(abs "$2") SPEC=$(abs "$3") DATA=$(cd "$4" && pwd -P) OUT=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[[ -x $BIN ]] || { echo "dynamic_big: not executable: $BIN" >&2; exit 2; }
[[ -f $SPEC ]] || { echo "dynamic_big: no spec file: $SPEC" >&2; exit 2; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P)
shopt -s nullglob
train=("$DATA"/day-0000[0-4]-of-00006.tsv)
eval_day=$DATA/day-00005-of-00006.tsv
[[ ${#train[@]} -eq 5 && -f $eval_day && -f $DATA/day.tsv.json ]] || {
  echo "dynamic_big: $DATA holds no 6-day synth-ctr set (day-0000[0-5]-of-00006.tsv and day.tsv.json)" >&2
  exit 2
}
TRAIN=$(IFS=,; echo "${train[*]}")
NUM_PS=${STRATA_NUM_PS:-3}
RANKS=${STRATA_BIG_RANKS:-6}
export STRATA_NUM_PS=$NUM_PS

# Each rank under GNU time, its line naming the rank and its node (hostname inside a node).
# shellcheck disable=SC2016  # expanded by the rank's own bash, not here
wrap=(bash -c '/usr/bin/time -o "$0/rss.$OMPI_COMM_WORLD_RANK" -f "rank $OMPI_COMM_WORLD_RANK host $(hostname) max_rss_kb %M" "$@"' "$OUT")
args=(train --model-spec "$SPEC" --data "csv:$TRAIN" --eval-data "csv:$eval_day" --streaming
  --shuffle-buffer 0 --shard data --log-every-secs 60)
rm -f "$OUT"/rss.*
start=$(date +%s)
if [[ $WHERE == host ]]; then
  root=()
  [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
  mpirun "${root[@]}" --oversubscribe -x STRATA_NUM_PS -np "$RANKS" "${wrap[@]}" "$BIN" "${args[@]}" \
    >"$OUT/train.out" 2>"$OUT/train.err"
  rc=$?
else
  per=$(((RANKS + 2) / 3))
  STRATA_CLUSTER_TIMEOUT=${STRATA_CLUSTER_TIMEOUT:-1500} "$here/run_on_cluster.sh" 3 \
    "$here/cluster_mpirun" --host "cn1:$per,cn2:$per,cn3:$per" --map-by node -np "$RANKS" \
    "${wrap[@]}" "$BIN" "${args[@]}" >"$OUT/train.out" 2>"$OUT/train.err"
  rc=$?
fi
echo "dynamic_big: $WHERE run ended with status $rc after $(($(date +%s) - start)) s" >&2
cat "$OUT"/rss.* >"$OUT/rss.txt" 2>/dev/null
[[ $rc -eq 0 ]] || { tail -n 20 "$OUT/train.err" >&2; exit "$rc"; }

/usr/bin/python3 - "$OUT" "$NUM_PS" "$DATA/day.tsv.json" "$WHERE" "$(basename "$SPEC")" <<'PY'
import json, re, sys
out, num_ps, gen_path, where, spec = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
summary = [l for l in open(out + "/train.out") if l.startswith("{") and '"global_step"' in l][-1]
j = json.loads(summary)
gen = json.load(open(gen_path))
transport = [l.strip() for l in open(out + "/train.out") if l.startswith("strata train: transport")]
# Distinct C1 ids of the training days: the new ids of days 0..4.
c1_train = sum(gen["per_day"][d]["new_per_field"][0] for d in range(5))
rep = {"where": where, "spec": spec, "auc": j.get("auc"), "examples_per_sec": j.get("examples_per_sec"),
       "wall_s": j.get("wall_s"), "global_step": j.get("global_step"), "ps": j.get("ps"),
       "workers": j.get("workers"), "transport": transport[0] if transport else None,
       "c1_distinct_train": c1_train, "c1_distinct_all_days": gen["distinct_ids"][0],
       "distinct_all_fields_train": sum(gen["per_day"][d]["new"] for d in range(5)),
       "staleness": j.get("update_staleness")}
d = j.get("dynamic", {})
c1 = d.get("dlrm/C1_embedding/embeddings")
if c1:
    rep["c1"] = {k: c1[k] for k in ("rows", "admitted", "evicted", "evicted_ttl", "evicted_capacity", "bytes",
                                    "rejected_full")}
    rep["c1"]["per_ps"] = c1["per_ps"]
    rest = [v for k, v in d.items() if k != "dlrm/C1_embedding/embeddings"]
    rep["others"] = {k: sum(v[k] for v in rest) for k in ("rows", "admitted", "evicted", "bytes")}
    rep["others"]["tables"] = len(rest)
rss = {}
for line in open(out + "/rss.txt"):
    m = re.match(r"rank (\d+) host (\S+) max_rss_kb (\d+)", line)
    if m:
        r = int(m.group(1))
        rss[r] = {"role": "ps" if r < num_ps else "worker", "host": m.group(2), "max_rss_mib": round(int(m.group(3)) / 1024)}
rep["ranks"] = [rss[r] for r in sorted(rss)]
print(json.dumps(rep))
open(out + "/report.json", "w").write(json.dumps(rep) + "\n")
PY
