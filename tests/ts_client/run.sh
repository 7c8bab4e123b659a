#!/usr/bin/env bash
# spindle's TypeScript client (runtime/clients/typescript) against
# `spindle serve`.
# usage: run.sh SPINDLE_BINARY SCRATCH_DIR
# Installs the client's pinned packages (its package.json and
# package-lock.json) into SCRATCH_DIR with Debian's npm, once. Then, in a
# copy of the repository's layout under SCRATCH_DIR/run: regenerates
# src/schema.d.ts with the client's `npm run generate` and fails unless it
# is the committed one; type-checks the client (tsc --noEmit, strict) and
# the test, whose event_types.ts holds the client's event types to the
# document's x-spindle-events; type-checks the console's modules against
# the generated types (tsc --checkJs); compiles the test; starts spindle on a free
# loopback port with a token and an in-memory store (stopped on every way
# out); and runs client_test.ts against it. One line per check.
set -euo pipefail
binary=$1
scratch=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
client=$repo/runtime/clients/typescript
. "$here/../npm_scratch.sh"
npm_scratch "$client" "$scratch"
for tool in python3 curl; do
  if ! command -v "$tool" >/dev/null; then
    echo "run.sh: $tool is missing: run .ci/install-deps" >&2
    exit 1
  fi
done
scratch=$(cd "$scratch" && pwd)
bin=$scratch/node_modules/.bin

# The copy: run/repo/{docs,runtime/clients/typescript,tests/ts_client}
# (node_modules is found in SCRATCH_DIR above it), compiled to run/out.
run=$scratch/run
copy=$run/repo
rm -rf "$run"
mkdir -p "$copy/docs" "$copy/runtime/clients/typescript" "$copy/tests/ts_client"
cp "$repo/docs/openapi.yaml" "$copy/docs/"
cp -R "$client/package.json" "$client/tsconfig.json" "$client/src" "$copy/runtime/clients/typescript/"
cp "$here"/*.ts "$here"/*.mjs "$here/tsconfig.json" "$here/console.jsconfig.json" "$copy/tests/ts_client/"
mkdir -p "$copy/runtime/console"
cp "$repo"/runtime/console/*.js "$copy/runtime/console/"
test_dir=$copy/tests/ts_client

# 1. The committed types are what the generator makes of the document.
rm "$copy/runtime/clients/typescript/src/schema.d.ts"
if ! (cd "$copy/runtime/clients/typescript" && npm run --silent generate) >"$run/generate.log" 2>&1; then
  cat "$run/generate.log"
  echo "FAIL types: npm run generate (openapi-typescript) cannot read docs/openapi.yaml"
  exit 1
fi
if ! cmp -s "$copy/runtime/clients/typescript/src/schema.d.ts" "$client/src/schema.d.ts"; then
  diff -u "$client/src/schema.d.ts" "$copy/runtime/clients/typescript/src/schema.d.ts" | head -40 || true
  echo "FAIL types: runtime/clients/typescript/src/schema.d.ts is not what openapi-typescript makes of docs/openapi.yaml (the difference above); regenerate it: cd runtime/clients/typescript && npm ci && npm run generate"
  exit 1
fi
echo "ok   types: src/schema.d.ts is what npm run generate makes of docs/openapi.yaml"

# 2. The document as JSON (the test checks every answer against it), and
#    its x-spindle-events as TypeScript (events.gen.d.ts).
python3 -c 'import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1], encoding="utf-8")), open(sys.argv[2], "w", encoding="utf-8"))' \
  "$repo/docs/openapi.yaml" "$test_dir/openapi.json"
node "$test_dir/extract_events.mjs" "$test_dir/openapi.json" "$test_dir/events.gen.d.ts"

# 3. Strict type checks; the test is compiled to run/out only when the
#    client, the test and the event types all check (noEmitOnError).
if ! "$bin/tsc" --noEmit -p "$copy/runtime/clients/typescript/tsconfig.json"; then
  echo "FAIL typecheck: the client (tsc --noEmit, strict)"
  exit 1
fi
echo "ok   typecheck: the client (tsc --noEmit, strict)"
if ! "$bin/tsc" -p "$test_dir/tsconfig.json"; then
  echo "FAIL typecheck: the test, or the client's event types are not the document's x-spindle-events (tsc, strict)"
  exit 1
fi
echo "ok   typecheck: the test (strict); the client's event types are the document's x-spindle-events"
# The console's modules (plain JavaScript, no build step) against the same
# types: JSDoc names each API answer's schema (api.js's `Schemas`), and
# tsc --checkJs fails on a field the document does not have.
if ! "$bin/tsc" -p "$test_dir/console.jsconfig.json"; then
  echo "FAIL typecheck: the console's modules against the generated types (tsc --checkJs)"
  exit 1
fi
echo "ok   typecheck: the console's modules against the generated types (tsc --checkJs)"

# 4. spindle on a free port (--port 0: its first line on stdout names it).
token=ts-client-$RANDOM$RANDOM
"$binary" serve --port 0 --bind 127.0.0.1 --token "$token" --data :memory: --shutdown-grace 1 \
  >"$run/spindle.out" 2>"$run/spindle.err" &
pid=$!
stop() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
trap stop EXIT
trap 'exit 143' TERM INT HUP
url=
for _ in $(seq 100); do
  url=$(sed -n 's#^spindle .* serving on \(http://[^ ]*\)$#\1#p' "$run/spindle.out" | head -1)
  if [ -n "$url" ] || ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.1
done
healthy=
if [ -n "$url" ]; then
  for _ in $(seq 100); do
    if curl -fsS -o /dev/null "$url/healthz" 2>/dev/null; then healthy=1; break; fi
    sleep 0.1
  done
fi
if [ -z "$healthy" ]; then
  cat "$run/spindle.out" "$run/spindle.err" >&2
  echo "FAIL server: spindle serve did not answer GET /healthz"
  exit 1
fi
echo "ok   server: spindle serve answers GET /healthz at $url"

# 5. The client against it.
status=0
node "$run/out/tests/ts_client/client_test.js" "$url" "$token" "$test_dir/openapi.json" || status=$?
if [ "$status" -ne 0 ]; then
  echo "spindle's log (last lines):" >&2
  tail -20 "$run/spindle.err" >&2
fi
exit "$status"
