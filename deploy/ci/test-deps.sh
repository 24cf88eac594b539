#!/usr/bin/env bash
# The Debian packages some tests need, installed when missing, as one step of `make test` (not of CI only):
# promtool (Debian's prometheus) for the Prometheus config/rule tests of deploy/prometheus, chromium and
# chromedriver for the status page's browser tests (tests/integration/api/test_ui.py, via Selenium).
# Installing needs root and apt-get; without them this says in one line what to install, and those
# tests skip, saying why. SOURCE_BACKFILL_SKIP_TEST_DEPS=1 skips the step.
set -uo pipefail
[ "${SOURCE_BACKFILL_SKIP_TEST_DEPS:-0}" = 1 ] && exit 0
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test-deps: installing ${missing[*]} (Debian packages some tests need)" >&2
  if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null); then
    echo "test-deps: installing ${missing[*]} failed; the tests that need them will skip" >&2
  fi
else
  echo "test-deps: install ${missing[*]} (apt-get, as root) or the tests that need them skip" >&2
fi
exit 0
