#!/usr/bin/env bash
# The whole suite on every core: `make test` and .ci/run run this. Extra arguments go to both pytest runs.
#
#   scripts/run-tests.sh                  # the tests not marked `serial` on N workers (pytest-xdist), then the
#                                         # `serial` ones in one process: they need the machine to themselves
#   WORKERS=1 scripts/run-tests.sh        # everything in one process, in file order (`make test WORKERS=1`)
#   scripts/run-tests.sh tests/data -x    # a part of the suite, the same way
#
# WORKERS defaults to the CPUs this process may use. TEST_REPORTS=DIR keeps both runs' JUnit XML there (every test's
# time: where the suite's minutes go). Exit status: the first run's failure, else the second's; a
# run that selects nothing (pytest's 5, e.g. a folder without serial tests) counts as passed unless both do.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
CPUS="$("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || nproc)"
# one worker a CPU: a third worker on 2 CPUs (measured on a clean clone, 2026-12-07) made the first phase longer
# (1,483 s against 1,451 s): it is CPU-bound, and the longest tests ran under three-way contention
WORKERS="${WORKERS:-$CPUS}"

if [ "$WORKERS" -le 1 ]; then
  exec "$PY" -m pytest "$@"
fi

if [ -n "${TEST_REPORTS:-}" ]; then
  reports="$TEST_REPORTS" && mkdir -p "$reports"
else
  reports="$(mktemp -d -t trainforge-tests.XXXXXX)"
  trap 'rm -rf "$reports"' EXIT
fi
# each worker's torch gets its share of the cores: left alone, every worker starts a thread per core, and on 2 cores two
# workers' 4 spinning OpenMP threads ran the segmentation and 3D modules 3.3x slower (338 s against 103 s)
THREADS=$(( CPUS / WORKERS > 0 ? CPUS / WORKERS : 1 ))
echo "== the tests not marked serial, on $WORKERS workers of $THREADS thread(s) each" >&2
OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-$THREADS}" "$PY" -m pytest -n "$WORKERS" --dist loadscope -m "not serial" --durations=15 --junit-xml="$reports/parallel.xml" "$@"
parallel=$?
echo "== the serial tests, one at a time" >&2
"$PY" -m pytest -p no:xdist -m serial --durations=15 --junit-xml="$reports/serial.xml" "$@"
serial=$?

# one closing line for both runs: the counts of the whole suite
"$PY" - "$reports"/*.xml <<'PY'
import sys
import xml.etree.ElementTree as ET
total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for key in total:
            total[key] += int(suite.get(key, 0))
failed = total["failures"] + total["errors"]
passed = total["tests"] - failed - total["skipped"]
print(f"suite: {passed} passed, {failed} failed, {total['skipped']} skipped")
PY

if [ $parallel -eq 5 ] && [ $serial -eq 5 ]; then exit 5; fi
[ $parallel -ne 0 ] && [ $parallel -ne 5 ] && exit $parallel
[ $serial -ne 0 ] && [ $serial -ne 5 ] && exit $serial
exit 0
