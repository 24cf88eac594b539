#!/usr/bin/env bash
# make test on a busy machine, as a newcomer's laptop or a shared CI runner is: `stress-ng --cpu 1` (one
# core kept busy, Debian's package, installed here when missing as deploy/ci/test-deps.sh does) beside
# RUNS runs of make test, one after the other. Prints each run's wall time, pytest's own time and its
# result line, and exits non-zero when a run failed: the suite must pass there, not only on a quiet
# machine (docs/testing.md, "A busy machine"). Logs: var/test-busy/run-<n>.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
runs="${RUNS:-3}"
if ! command -v stress-ng >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test-busy: installing stress-ng (Debian's package)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends stress-ng >/dev/null) || true
  fi
  command -v stress-ng >/dev/null || { echo "test-busy: stress-ng is needed (apt-get install stress-ng)" >&2; exit 2; }
fi
mkdir -p var/test-busy
stress-ng --cpu 1 --quiet &
stress=$!
trap 'kill "$stress" 2>/dev/null; wait "$stress" 2>/dev/null' EXIT
failed=0
for n in $(seq 1 "$runs"); do
  log="var/test-busy/run-$n.log"
  t0=$(date +%s)
  make test >"$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - t0 ))
  result=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$log" | tail -1 | tr -d '=' | sed 's/^ *//')
  echo "test-busy: run $n of $runs: exit $rc, ${took} s in all; pytest: ${result:-no result line} ($log)"
  [ "$rc" = 0 ] || failed=1
done
exit "$failed"
