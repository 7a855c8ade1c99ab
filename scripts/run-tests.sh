#!/usr/bin/env bash
# The whole suite on every core: `make test` and .ci/run run this. Extra arguments go to both pytest runs.
#
#   scripts/run-tests.sh                  # the tests not marked `serial` on N workers (pytest-xdist), then the
#                                         # `serial` ones in one process: they need the machine to themselves
#   WORKERS=1 scripts/run-tests.sh        # everything in one process, in file order (`make test WORKERS=1`)
#   scripts/run-tests.sh tests/data -x    # a part of the suite, the same way
#
# WORKERS defaults to the CPUs this process may use. Exit status: the first run's failure, else the second's; a
# run that selects nothing (pytest's 5, e.g. a folder without serial tests) counts as passed unless both do.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
WORKERS="${WORKERS:-$("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || nproc)}"

if [ "$WORKERS" -le 1 ]; then
  exec "$PY" -m pytest "$@"
fi

echo "== the tests not marked serial, on $WORKERS workers" >&2
"$PY" -m pytest -n "$WORKERS" --dist loadscope -m "not serial" "$@"
parallel=$?
echo "== the serial tests, one at a time" >&2
"$PY" -m pytest -p no:xdist -m serial "$@"
serial=$?

if [ $parallel -eq 5 ] && [ $serial -eq 5 ]; then exit 5; fi
[ $parallel -ne 0 ] && [ $parallel -ne 5 ] && exit $parallel
[ $serial -ne 0 ] && [ $serial -ne 5 ] && exit $serial
exit 0
