#!/usr/bin/env bash
# CTest's fixture for the store suites' PostgreSQL run (tests/CMakeLists.txt):
#   postgres_fixture.sh start DIR   a throwaway cluster in DIR (.ci/postgres),
#                                   after stopping one an aborted run left
#   postgres_fixture.sh stop DIR    stops it and removes DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:?usage: postgres_fixture.sh start|stop DIR}"
dir="${2:?usage: postgres_fixture.sh start|stop DIR}"
case "$what" in
  start)
    if [[ -e "$dir" ]]; then
      "$root/.ci/postgres" stop "$dir" >/dev/null 2>&1 || rm -rf "$dir"
    fi
    "$root/.ci/postgres" start "$dir"
    ;;
  stop)
    "$root/.ci/postgres" stop "$dir"
    ;;
  *)
    echo "usage: postgres_fixture.sh start|stop DIR" >&2
    exit 2
    ;;
esac
