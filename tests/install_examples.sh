#!/usr/bin/env bash
# Installs spindle from BUILD_DIR into a temporary prefix, checks that the
# installed headers are exactly those docs/embedding.md lists as public,
# then configures, builds (warnings as errors) and runs docs/examples/ against
# the prefix alone: an example that includes a header that is not
# installed fails to build.
# Usage: install_examples.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir="$1"
source_dir="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/lib/cmake/spindle/spindleConfig.cmake"
test -x "$work/prefix/bin/spindle"

# The public headers: installed == listed in docs/embedding.md ("What is
# public": one `spindle/...hpp` per table row).
(cd "$work/prefix/include" && find spindle -name '*.hpp' | sort) \
  > "$work/installed"
sed -n '/^## What is public/,/^## /p' "$source_dir/docs/embedding.md" \
  | grep -o '^| `spindle/[a-z_/]*\.hpp`' | sed 's/^| `//; s/`$//' | sort \
  > "$work/documented"
if ! diff -u "$work/documented" "$work/installed"; then
  echo "installed headers differ from docs/embedding.md's list (- listed, + installed)" >&2
  exit 1
fi
echo "$(wc -l < "$work/installed") public headers, as documented"

cmake -S "$source_dir/docs/examples" -B "$work/build" \
      -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
      -DSPINDLE_EXAMPLES_WERROR=ON >/dev/null
cmake --build "$work/build" -j2 >/dev/null

version=$("$work/prefix/bin/spindle" --version | cut -d' ' -f2)
out=$("$work/build/embedded_server")
echo "$out"
[ "$(echo "$out" | head -1)" = "spindle $version" ]
echo "$out" | grep -qx "embedded_server: 160 messages on 8 threads, blocking and async, all stored in order"
out=$("$work/build/worker")
echo "$out"
[ "$out" = "worker: 17 tasks completed by 3 workers, every parent after its children" ]
out=$("$work/build/custom_provider")
echo "$out"
echo "$out" | grep -qx "YOU SAID: HELLO THERE"
echo "$out" | grep -qx "custom_provider: replies streamed and stored"
