#!/usr/bin/env bash
# usage: retried_tests.sh CTEST_OUTPUT...
# Lists the tests of a `ctest --repeat until-pass:N` run that failed and then passed, each with the
# "FAIL [...]" and error lines of its failed run (from --output-on-failure), so that a flaky test
# shows at the end of a long log. Prints nothing when no test needed a second run.
set -uo pipefail
for log in "$@"; do
[ -r "$log" ] || continue
# "  Test #12: name ....   Passed" (a run that is not the last) and "12/760 Test #12: name ... ***Failed"
mapfile -t failed < <(grep -E 'Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)' "$log" |
                      sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/' | sort -u)
retried=()
for name in "${failed[@]}"; do
  grep -qE "Test +#[0-9]+: $name \.+ +Passed" "$log" && retried+=("$name")
done
(( ${#retried[@]} == 0 )) && continue
echo
echo "== ${#retried[@]} test(s) failed once and passed when run again (flaky: mend them; $log):"
for name in "${retried[@]}"; do
  echo "-- $name"
  # The failed run's output follows its status line up to the next test's start.
  awk -v n="$name" '
    $0 ~ ("Test +#[0-9]+: " n " ") && /\*\*\*/ {on = 1; next}
    on && /^ *Start +[0-9]+:|Test +#[0-9]+: / {on = 0}
    on' "$log" | grep -E 'FAIL|rror|expected|stalled|Timeout|timed out|strata:' | head -n 20
done
done
