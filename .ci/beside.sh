#!/usr/bin/env bash
# Runs two commands side by side (for steps that each keep one core busy, or
# wait on downloads): the second's output goes to a log, printed when both
# are done. Fails when either failed.
#
#   bash .ci/beside.sh "make test-r" "make test-r-parity"
set -uo pipefail
mkdir -p out
log=$(mktemp out/beside.XXXXXX.log)
bash -c "$2" >"$log" 2>&1 &
second=$!
bash -c "$1"
first_status=$?
wait "$second"
second_status=$?
echo "== $2 (ran beside $1; exit $second_status)"
cat "$log"
rm -f "$log"
[ "$first_status" -eq 0 ] || echo "beside: '$1' failed ($first_status)" >&2
[ "$second_status" -eq 0 ] || echo "beside: '$2' failed ($second_status)" >&2
[ "$first_status" -eq 0 ] && [ "$second_status" -eq 0 ]
