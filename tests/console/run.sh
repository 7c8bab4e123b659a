#!/usr/bin/env bash
# The browser console in a real Chromium (console_test.mjs, then
# tenants_test.mjs against a server with tenancy on), or its benchmark
# (bench/bench_console.mjs) with --bench.
# usage: run.sh [--bench] SPINDLE_BINARY SCRATCH_DIR [SCREENSHOT_DIR]
# Installs the pinned playwright-core (package-lock.json) into SCRATCH_DIR
# with Debian's npm, once, and drives Debian's chromium (/usr/bin/chromium,
# .ci/install-deps) headless. Screenshots go to SCREENSHOT_DIR (default
# SCRATCH_DIR/screenshots; docs/console/ to refresh the documentation's).
# SPINDLE_CONSOLE_FROM_DISK=runtime/console serves the console's files to
# the browser from there instead of the binary (harness.mjs), to work on
# the console without rebuilding spindle.
set -euo pipefail
script=console_test.mjs
if [ "${1:-}" = "--bench" ]; then
  script=bench_console.mjs
  shift
fi
binary=$(realpath "$1")
scratch=$2
shots=${3:-$scratch/screenshots}
here=$(cd "$(dirname "$0")" && pwd)
export SPINDLE_CHROMIUM=${SPINDLE_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$SPINDLE_CHROMIUM" ]; then
  echo "run.sh: $SPINDLE_CHROMIUM is missing: run .ci/install-deps (Debian's chromium)" >&2
  exit 1
fi
. "$here/../npm_scratch.sh"
npm_scratch "$here" "$scratch"
mkdir -p "$shots"
shots=$(cd "$shots" && pwd)
cp "$here/console_test.mjs" "$here/tenants_test.mjs" "$here/harness.mjs" \
   "$here/../../bench/bench_console.mjs" "$scratch/"
if [ -n "${SPINDLE_CONSOLE_FROM_DISK:-}" ]; then
  SPINDLE_CONSOLE_FROM_DISK=$(realpath "$SPINDLE_CONSOLE_FROM_DISK")
  export SPINDLE_CONSOLE_FROM_DISK
fi
cd "$scratch"
if [ "$script" = console_test.mjs ]; then
  node console_test.mjs "$binary" "$shots"
  script=tenants_test.mjs
fi
exec node "$script" "$binary" "$shots"
