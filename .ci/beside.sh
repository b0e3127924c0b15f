#!/usr/bin/env bash
# Runs commands side by side (steps that each keep a core busy, or wait on
# downloads): the first in the foreground, each other one into a log that is
# printed when all are done. Fails when any failed. Ends with each
# command's wall time and the CPU time it and its child processes used, so
# a log shows which step to make cheaper (on a busy machine, CPU time is
# what a step costs the others).
#
#   bash .ci/beside.sh "make test-r" "make test-r-parity" "make test-python-jax"
set -uo pipefail
mkdir -p out
first="$1"
shift
others=("$@")
logs=()
pids=()
timings=()

# Runs $1, exits with its status and writes "<exit> <wall s> <CPU s>" to $2: bash's `times` in the
# subshell that ran it counts every waited-for descendant.
timed() {
  (
    start=$SECONDS
    bash -c "$1"
    status=$?
    # (a redirection, not a pipe: `times` must run in this subshell)
    times >"$2"
    cpu=$(awk 'NR == 2 {
      s = 0
      for (i = 1; i <= 2; i++) { split($i, p, "m"); s += p[1] * 60 + p[2] }
      printf "%.0f", s }' "$2")
    echo "$status $((SECONDS - start)) $cpu" >"$2"
    exit "$status"
  )
}

# One line of the closing report, from a `timed` file: wall, CPU, exit, $2.
report_line() {
  local status wall cpu
  read -r status wall cpu <"$1"
  printf '%6s s %6s s  exit %s  %s' "$wall" "$cpu" "$status" "$2"
}

for command in "${others[@]}"; do
  log=$(mktemp out/beside.XXXXXX.log)
  timing=$(mktemp out/beside.XXXXXX.time)
  timed "$command" "$timing" >"$log" 2>&1 &
  pids+=("$!")
  logs+=("$log")
  timings+=("$timing")
done
first_timing=$(mktemp out/beside.XXXXXX.time)
timed "$first" "$first_timing"
status=$?
failed=0
report=()
[ "$status" -eq 0 ] || { echo "beside: '$first' failed ($status)" >&2; failed=1; }
report+=("$(report_line "$first_timing" "$first")")
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  status=$?
  echo "== ${others[$i]} (ran beside $first; exit $status)"
  cat "${logs[$i]}"
  report+=("$(report_line "${timings[$i]}" "${others[$i]}")")
  [ "$status" -eq 0 ] || { echo "beside: '${others[$i]}' failed ($status)" >&2; failed=1; }
done
rm -f "${logs[@]}" "${timings[@]}" "$first_timing"
echo "== beside: wall, CPU (with child processes), exit, command"
printf '%s\n' "${report[@]}"
exit "$failed"
