#!/usr/bin/env bash
# Lints docs/openapi.yaml with Redocly's CLI (pinned by package-lock.json
# beside this script, installed once into SCRATCH_DIR with Debian's npm):
# no errors and no warnings under tests/openapi/redocly.yaml.
# usage: lint.sh SCRATCH_DIR
set -euo pipefail
scratch=$1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/../npm_scratch.sh"
npm_scratch "$here" "$scratch"
cd "$scratch"
out=$(./node_modules/.bin/redocly lint --format stylish \
        --config "$here/redocly.yaml" "$repo/docs/openapi.yaml" 2>&1) || {
  echo "$out"
  exit 1
}
echo "$out"
# Warnings do not fail redocly's exit code; they fail this test.
if echo "$out" | grep -qiE "warning"; then
  echo "lint.sh: the document has warnings" >&2
  exit 1
fi
