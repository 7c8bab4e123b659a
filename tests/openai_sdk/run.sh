#!/usr/bin/env bash
# The official OpenAI Node client against spindle serve (sdk_test.mjs).
# usage: run.sh SPINDLE_BINARY SCRATCH_DIR
# Installs the pinned client (package-lock.json) into SCRATCH_DIR with
# Debian's npm, once, and runs the test there with Debian's nodejs.
set -euo pipefail
binary=$1
scratch=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../npm_scratch.sh"
npm_scratch "$here" "$scratch"
cp "$here/sdk_test.mjs" "$scratch/"
cd "$scratch"
exec node sdk_test.mjs "$binary"
