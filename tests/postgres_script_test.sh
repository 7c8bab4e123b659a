#!/usr/bin/env bash
# .ci/postgres: starts a throwaway PostgreSQL that answers on its URL,
# restarts it as a crash would with its data kept, and stops it without
# leaving a server or its directory behind.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d /tmp/spindle-pg-test.XXXXXX)"
rmdir "$dir"
cleanup() { "$root/.ci/postgres" stop "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT
url="$("$root/.ci/postgres" start "$dir")"
[[ "$url" =~ ^postgres://postgres@127\.0\.0\.1:[0-9]+/spindle$ ]] \
  || { echo "unexpected URL: $url"; exit 1; }
[[ "$("$root/.ci/postgres" url "$dir")" == "$url" ]] \
  || { echo "url does not repeat start's URL"; exit 1; }
got="$(psql "$url" -tAc "CREATE TABLE t(x int); INSERT INTO t VALUES (41); SELECT x + 1 FROM t;")"
[[ "$got" == *42 ]] || { echo "the server answered '$got'"; exit 1; }
# A restart as by a crash keeps the port and the data.
"$root/.ci/postgres" restart "$dir" immediate 0.2
got="$(psql "$url" -tAc "SELECT x FROM t;")"
[[ "$got" == *41 ]] || { echo "after a restart the server answered '$got'"; exit 1; }
# A second start in the same directory is refused.
if "$root/.ci/postgres" start "$dir" 2>/dev/null; then
  echo "a second start in $dir was accepted"; exit 1
fi
pid="$(head -1 "$dir/data/postmaster.pid")"
"$root/.ci/postgres" stop "$dir"
trap - EXIT
[[ ! -e "$dir" ]] || { echo "$dir is still there"; exit 1; }
if kill -0 "$pid" 2>/dev/null; then echo "the server ($pid) still runs"; exit 1; fi
# Bad use: a clear error and exit code 2.
set +e
"$root/.ci/postgres" stop /nonexistent/spindle-pg 2>/dev/null; rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "stop of nothing exited $rc, not 2"; exit 1; }
echo "ok"
