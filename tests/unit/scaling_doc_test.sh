#!/usr/bin/env bash
# docs/SCALING.md section 3 must be exactly what docs/scaling_model.py prints (the tables are the
# model's output, not hand-edited figures), and the model must obey its own equations at the
# edges: one worker has zero staleness; SGD needs no PS ranks for the optimizer.
set -euo pipefail
root=$1
model=$root/docs/scaling_model.py
doc=$root/docs/SCALING.md
out=$(python3 "$model")
missing=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  grep -qxF -- "$line" "$doc" || { echo "FAIL: SCALING.md lacks the model's line: $line"; missing=1; }
done <<<"$out"
[ "$missing" = 0 ] || { echo "regenerate section 3 with: python3 docs/scaling_model.py"; exit 1; }
row=$(python3 "$model" --params 1e6 --step-ms 10 --workers 1 | tail -1)
[[ $row == "| 1 | 1 | "*" | 0 |" ]] || { echo "FAIL: one worker should see staleness 0: $row"; exit 1; }
row=$(python3 "$model" --params 1e6 --step-ms 10 --optimizer sgd --workers 64 | tail -1)
[[ $row == "| 64 | "*" | 0 | "* ]] || { echo "FAIL: SGD should need no optimizer PS ranks: $row"; exit 1; }
echo "ok: SCALING.md matches scaling_model.py"
