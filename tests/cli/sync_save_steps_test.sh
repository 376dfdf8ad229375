#!/usr/bin/env bash
# Sync consistency: --save-every-steps saves land on deterministic global steps. Under sync the
# save at round c (every worker's c-th step of the job) holds exactly G0 + W * c global steps, and
# a save is due at the first round whose global step reaches the previous save's (or G0) plus N,
# no sooner than two rounds after it (checkpoint/README.md). Real mpirun, 1 PS + 2 workers,
# softmax on Fashion-MNIST, 20 steps per worker (40 global steps): each schedule is run twice and
# must commit exactly the expected list both times, with every worker's saved position at that
# round; then a job restored from a middle checkpoint saves on the steps its own G0 gives.
source "$(dirname "$0")/lib.sh"
require_fashion_mnist_training

TRAIN=(train --model softmax --consistency sync --global-batch 64 --steps 20 --max-to-keep 0
       --log-every 0 --log-every-secs 0)
# committed DIR: the global steps checkpoint.json lists, in order (one line, space-separated).
committed() {
  python3 -c "import json,sys; print(' '.join(str(c['global_step']) for c in json.load(open(sys.argv[1]))['checkpoints']))" \
    "$1/checkpoint.json" 2>&1
}
# files DIR: the steps of the ckpt-*.h5 files in DIR, ascending.
files() { (cd "$1" && ls -1 ckpt-*.h5 2>/dev/null | sed 's/^ckpt-\(.*\)\.h5$/\1/' | sort -n | tr '\n' ' ' | sed 's/ $//'); }
# check_saves DIR WANT: the committed list and the files are WANT, and in each checkpoint of global
# step G both workers' saved step count is G / 2 (each worker did half the steps; a resumed worker
# counts on from its restored step, and the restored G0 is twice that).
check_saves() {
  local dir=$1 want=$2 got g pos
  got=$(committed "$dir")
  [ "$got" = "$want" ] || { fail "committed global steps: got '$got', want '$want'"; return; }
  got=$(files "$dir")
  [ "$got" = "$want" ] || fail "ckpt-*.h5 files: got '$got', want '$want'"
  for g in $want; do
    pos=$("$STRATA_BIN" ckpt show --json "$dir/ckpt-$g.h5" 2>&1 |
          python3 -c "import json,sys; j=json.load(sys.stdin); print(j['global_step'], *[w['step'] for w in j['training_position']['workers']])" 2>&1)
    [ "$pos" = "$g $((g / 2)) $((g / 2))" ] ||
      fail "ckpt-$g.h5: global step and the workers' steps are '$pos', want '$g $((g / 2)) $((g / 2))'"
  done
}

# ---------------------------------------------------------------------------------------------
# N = 5 (not a multiple of W = 2): rounds 3, 6, 9, ... (the first reaching 5, 11, 17, ...), and
# the end, round 20 (global step 40). N = 4: every second round, the last one at round 20, so the
# final save finds step 40 saved already. N = 7: every fourth round, ending on round 20 (run once:
# the two others are the ones run twice).
for spec in "5|2|6 12 18 24 30 36 40" "4|2|4 8 12 16 20 24 28 32 36 40" "7|1|8 16 24 32 40"; do
  IFS='|' read -r n runs want <<< "$spec"
  for attempt in $(seq 1 "$runs"); do
    case_begin "sync, 2 workers, --save-every-steps $n (run $attempt): saves at global steps $want"
    D="$TEST_TMP/n$n-$attempt"
    mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --checkpoint-dir "$D" --save-every-steps "$n"
    expect_rc 0
    [ "$(summary_get 'j["global_step"]')" = 40 ] || fail "summary global_step: $(summary_get 'j["global_step"]') != 40"
    check_saves "$D" "$want"
  done
done

# ---------------------------------------------------------------------------------------------
# Resume from the middle checkpoint of the N = 5 run (global step 18, round 9 of each worker):
# the restored job's rounds start from G0 = 18, so with N = 5 it saves at 24, 30, 36 (the steps
# the uninterrupted run saved) and the final 40; with N = 4 at 22, 26, ..., 38 (its first save at
# its round 2, posted before its first step) and the final 40.
for spec in "5|24 30 36 40" "4|22 26 30 34 38 40"; do
  IFS='|' read -r n want <<< "$spec"
  case_begin "sync, resumed at global step 18, --save-every-steps $n: saves at $want"
  R="$TEST_TMP/resume-n$n"
  mpi 3 "$STRATA_BIN" "${TRAIN[@]}" --restore "$TEST_TMP/n5-1/ckpt-18.h5" --checkpoint-dir "$R" --save-every-steps "$n"
  expect_rc 0
  expect_stdout_has "(global step 18)"
  [ "$(summary_get 'j["global_step"]')" = 40 ] || fail "summary global_step: $(summary_get 'j["global_step"]') != 40"
  check_saves "$R" "$want"
done

finish
