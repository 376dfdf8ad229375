#!/usr/bin/env bash
# A slow worker keeps being checkpointed after the chief finished (issue 19, item 3): 1 PS + 2
# workers, async, on Fashion-MNIST; worker:1 (rank 2) sleeps after each step (the test hook
# STRATA_TEST_STEP_DELAY_RANK), so the chief ends its epoch long before it. Saves are requested
# every 20 global steps and all kept: the committed checkpoints' global steps must show no gap
# wider than two intervals from the first to the final one (before, the chief stopped requesting
# saves when its own training ended, and the slow worker's remaining steps had none until the
# final save). About 10 s.
source "$(dirname "$0")/lib.sh"
FMNIST=/usr/share/datasets/fashion-mnist
if [ ! -r "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: $FMNIST missing (apt-get install dataset-fashion-mnist)"
  exit 77
fi

CK="$TEST_TMP/ck"
case_begin "slow worker: periodic saves continue after the chief finished"
STRATA_TEST_STEP_DELAY_RANK=2:0.03 mpi 3 "$STRATA_BIN" train --epochs 1 --global-batch 256 --checkpoint-dir "$CK" \
  --save-every-steps 20 --max-to-keep 0 --log-every 0 --log-every-secs 0
expect_rc 0
# 2 workers x floor(60000 / 2 / 256) steps.
want=$((2 * (60000 / 2 / 256)))
got=$(tail -1 "$OUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["global_step"])' 2>&1)
[ "$got" = "$want" ] || fail "global_step $got, expected $want"
steps=$(ls "$CK" | sed -nE 's/^ckpt-([0-9]+)\.h5$/\1/p' | sort -n | tr '\n' ' ')
echo "   committed checkpoints at global steps: $steps"
verdict=$(python3 -c '
import sys
steps = [int(s) for s in sys.argv[1].split()]
final = int(sys.argv[2])
if not steps or steps[-1] != final: print("the final checkpoint (step %d) is missing: %s" % (final, steps)); sys.exit()
gaps = [b - a for a, b in zip([0] + steps, steps)]
print("ok" if max(gaps) <= 40 and len(steps) >= final // 20 - 1 else
      "a gap of %d global steps (the interval is 20) among %s" % (max(gaps), steps))' "$steps" "$want" 2>&1)
[ "$verdict" = ok ] || fail "$verdict"

finish
