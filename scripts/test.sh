#!/usr/bin/env bash
# The suite as `make test` (quick: everything not marked slow) and `make test-full` (everything) run it.
#
# Two pytest processes side by side on the machine's 2 cores:
#   - tests/unit (in-process), one xdist worker;
#   - tests/mp and tests/e2e (real multi-process launches), one xdist worker, so launches never overlap.
# Each runs under xdist so that a test stopped by its timeout (pytest-timeout's thread method ends the worker,
# the only method that also stops a hang inside hypothesis) is reported as failed and a new worker takes the
# rest. One worker per process: xdist's load scheduling does not run a crashed test again (its loadgroup and
# loadscope modes do, so a hang would repeat until the restart limit).
# Output: the launch tier live, the in-process tier's log after it; durations, logs and JUnit files under runs/.
#
# Usage: scripts/test.sh quick|full [extra pytest arguments, given to both processes]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-${ROOT}/.venv/bin/python}"
MODE="${1:-}"
case "$MODE" in
  quick) SELECT=(-m "not slow") ;;
  full) SELECT=() ;;
  *) echo "usage: scripts/test.sh quick|full [pytest arguments]" >&2; exit 2 ;;
esac
shift
mkdir -p runs
COMMON=(-p xdist -n 1 --max-worker-restart 10 --maxfail 10 --durations 25 "${SELECT[@]}")
t0=$(date +%s)
"$PY" -m pytest tests/unit "${COMMON[@]}" --junitxml runs/junit-unit.xml "$@" > runs/test-unit.log 2>&1 &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null' EXIT INT TERM
"$PY" -m pytest tests/mp tests/e2e "${COMMON[@]}" --junitxml runs/junit-launch.xml "$@" 2>&1 | tee runs/test-launch.log
launch_rc=${PIPESTATUS[0]}
wait "$unit_pid"
unit_rc=$?
trap - EXIT INT TERM
echo
echo "================ in-process tier (tests/unit), runs/test-unit.log ================"
cat runs/test-unit.log
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }  # 5: no test selected (a -k filter that matches one tier only)
echo
echo "scripts/test.sh ${MODE}: tests/unit exit ${unit_rc}, tests/mp + tests/e2e exit ${launch_rc}, $(( $(date +%s) - t0 )) s"
ok "$unit_rc" && ok "$launch_rc"
