#!/usr/bin/env bash
# The test suite beside a CPU load: busy-loop processes (two by default; a
# 2-core machine then has a load average of 4 or more, as a shared CI runner
# often does) run for as long as the README's test command does. Prints
# pytest's summary, the wall time and the load average at the end.
#
#   bench/suite_under_load.sh              # the README's test command
#   bench/suite_under_load.sh --busy 3     # beside three busy loops
#   bench/suite_under_load.sh -m slow      # pytest arguments are passed on
set -u
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
count=2
if [ "${1:-}" = "--busy" ]; then
  count=$2
  shift 2
fi
busy=()
for _ in $(seq "${count}"); do
  python3 -c "while True: pass" &
  busy+=($!)
done
trap 'kill "${busy[@]}" 2>/dev/null' EXIT
started=$(date +%s)
python -m pytest -q "$@"
status=$?
echo "suite_under_load: exit status ${status}, wall time $(( $(date +%s) - started )) s," \
  "${count} busy loops beside it, load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit "${status}"
