#!/usr/bin/env bash
# Installs spindle from BUILD_DIR into a temporary prefix, then configures,
# builds and runs a tiny consumer project that uses find_package(spindle)
# and links spindle::spindle.
# Usage: install_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir="$1"
source_dir="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/spindle/runtime/runtime.hpp"
test -f "$work/prefix/include/spindle/version.hpp"
test -f "$work/prefix/lib/cmake/spindle/spindleConfig.cmake"
test -x "$work/prefix/bin/spindle"

cmake -S "$source_dir/tests/consumer" -B "$work/build" \
      -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j2 >/dev/null
out=$("$work/build/consumer")
echo "$out"
[ "$out" = "consumer got ctx-1 and 0001_t1 from spindle $("$work/prefix/bin/spindle" --version | cut -d' ' -f2)" ]
