#!/usr/bin/env bash
# The browser console in a real Chromium (console_test.mjs), or its
# benchmark (bench/bench_console.mjs) with --bench.
# usage: run.sh [--bench] SPINDLE_BINARY SCRATCH_DIR [SCREENSHOT_DIR]
# Installs the pinned playwright-core (package-lock.json) into SCRATCH_DIR
# with Debian's npm, once, and drives Debian's chromium (/usr/bin/chromium,
# .ci/install-deps) headless. Screenshots go to SCREENSHOT_DIR (default
# SCRATCH_DIR/screenshots; docs/console/ to refresh the documentation's).
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
cp "$here/console_test.mjs" "$here/harness.mjs" \
   "$here/../../bench/bench_console.mjs" "$scratch/"
cd "$scratch"
exec node "$script" "$binary" "$shots"
