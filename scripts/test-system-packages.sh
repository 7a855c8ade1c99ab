#!/usr/bin/env bash
# The system packages some tests need, installed where this machine lets us (root and apt-get): a PostgreSQL
# server (the job store's test starts its own) and Debian's chromium + chromium-driver (the dashboard and
# cross-site tests; Selenium then downloads nothing), and Slurm with munge (the job server's Slurm backend and
# `launch slurm` run against a real slurmctld and slurmd that a fixture starts on localhost). `make test` and
# .ci/run both call this, so the README's command is the same check as CI. Without root or apt, or when the install fails, nothing stops: those tests
# skip and say what to install.
set -uo pipefail

PACKAGES=(postgresql chromium chromium-driver slurmctld slurmd slurm-client munge)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: ${missing[*]} not installed and this is not a root shell with apt-get;" \
       "the tests that need them will skip (as root: apt-get install ${missing[*]})" >&2
  exit 0
fi

log="$(mktemp -t trainforge-apt.XXXXXX.log)"
echo "installing the tests' system packages: ${missing[*]} (log: $log)" >&2
if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
     >"$log" 2>&1; then
  echo "warning: apt-get install ${missing[*]} failed (see $log); the tests that need them will skip" >&2
fi
exit 0
