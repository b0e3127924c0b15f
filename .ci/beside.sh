#!/usr/bin/env bash
# Runs commands side by side (steps that each keep a core busy, or wait on
# downloads): the first in the foreground, each other one into a log that is
# printed when all are done. Fails when any failed.
#
#   bash .ci/beside.sh "make test-r" "make test-r-parity" "make test-python-jax"
set -uo pipefail
mkdir -p out
first="$1"
shift
others=("$@")
logs=()
pids=()
for command in "${others[@]}"; do
  log=$(mktemp out/beside.XXXXXX.log)
  bash -c "$command" >"$log" 2>&1 &
  pids+=("$!")
  logs+=("$log")
done
bash -c "$first"
status=$?
failed=0
[ "$status" -eq 0 ] || { echo "beside: '$first' failed ($status)" >&2; failed=1; }
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  status=$?
  echo "== ${others[$i]} (ran beside $first; exit $status)"
  cat "${logs[$i]}"
  rm -f "${logs[$i]}"
  [ "$status" -eq 0 ] || { echo "beside: '${others[$i]}' failed ($status)" >&2; failed=1; }
done
exit "$failed"
