#!/usr/bin/env bash
# The official OpenAI Node client against spindle serve (sdk_test.mjs).
# usage: run.sh SPINDLE_BINARY SCRATCH_DIR
# Installs the pinned client (package-lock.json) into SCRATCH_DIR with
# Debian's npm, once, and runs the test there with Debian's nodejs.
set -euo pipefail
binary=$1
scratch=$2
here=$(cd "$(dirname "$0")" && pwd)
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "run.sh: $tool is missing: run .ci/install-deps (Debian's nodejs and npm)" >&2
    exit 1
  fi
done
mkdir -p "$scratch"
cp "$here/package.json" "$here/package-lock.json" "$here/sdk_test.mjs" "$scratch/"
# A fresh install when the lockfile changed since the last one.
if ! cmp -s "$here/package-lock.json" "$scratch/node_modules/.spindle-lock" 2>/dev/null; then
  (cd "$scratch" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$here/package-lock.json" "$scratch/node_modules/.spindle-lock"
fi
cd "$scratch"
exec node sdk_test.mjs "$binary"
