#!/usr/bin/env bash
# The reference tokenizer for the token-count tests and benchmark: installs
# the pinned `tiktoken` npm package (package-lock.json) into SCRATCH with
# npm, once (again only when the lockfile changed), and copies the scripts
# beside it. Safe to run from several tests at once (flock).
# usage: setup.sh SCRATCH
set -euo pipefail
scratch=$1
here=$(cd "$(dirname "$0")" && pwd)
for tool in node npm flock; do
  if ! command -v "$tool" >/dev/null; then
    echo "setup.sh: $tool is missing: run .ci/install-deps (Debian's nodejs and npm)" >&2
    exit 1
  fi
done
mkdir -p "$scratch"
exec 9>"$scratch/.setup.lock"
flock 9
cp "$here/package.json" "$here/package-lock.json" "$here"/*.mjs "$scratch/"
if ! cmp -s "$here/package-lock.json" "$scratch/node_modules/.spindle-lock" 2>/dev/null; then
  (cd "$scratch" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$here/package-lock.json" "$scratch/node_modules/.spindle-lock"
fi
