#!/usr/bin/env python3
"""The cost of authentication and authorization with tenancy on.

What it measures
----------------
Two `spindle serve` servers, each with a data directory of its own in a
temporary directory (the default settings: --sync full, group commit),
the offline provider (instant replies):

- off: no --admin-token and no --token, as spindle runs without tenancy;
- on: `--admin-token` (docs/tenants.md) with 1,000 tenants ("bench-0" ..
  "bench-999") and 10 keys each, 10,000 keys in all, created over HTTP
  before the first measured point.

Each tenant holds 4 threads, bench-0 .. bench-3, each created by one
message sent with one of the tenant's keys; the off server holds as many
threads, t0-bench-0 .. t999-bench-3, so both stores hold the same data.
Then one GET with each key fills the on server's cache of keys in use, as
a server that has been up for a while holds it.

Every request of the on server picks one of the 10,000 keys at random and
one of its tenant's 4 threads, and sends the key as `Authorization: Bearer`;
the off server gets the same choices in the same order (the same random
seed in each wrk thread) as the path /v1/threads/tN-bench-J, with no
header. Two routes:

1. GET /v1/threads/{id}: the thread object, a read.
2. POST /v1/threads/{id}/messages with a short varied message (JSON body):
   an exchange, both turns stored.

At 8 and 64 connections, each route is measured in five rounds (one in a
quick run), the two servers one right after the other, the order
alternating from round to round (off first in even rounds); on / off is
the median of the rounds' requests per second ratios, the other columns
each server's median round. Target (the tenancy issue): on / off at least
0.97x for both routes at 8 and 64 connections.

Every point is `wrk -t2 -cN -dSs --latency --timeout 10s` with a Lua
script; the tables give requests/sec, p50 and p99 latency and any socket
errors or non-2xx replies (a point with errors is flagged: its figure is
not a valid measurement). wrk and both servers share the machine's
cores; each server runs its default of one event-loop thread per core.

At the end the on server's `spindle_key_authentications` (GET /metrics
with the admin token) tells how many requests were authenticated from the
cache of keys in use and how many read their key from the store: over the
measured points every key is already cached, so the store count should
not move.

Usage
-----
    python3 bench/bench_tenants.py --quick            # ~1 minute
    python3 bench/bench_tenants.py --json out.json    # full run, ~6 minutes

Options:
    --pin             both servers on the first core, wrk and this script
                      on the second: the same conditions for both
    --build-dir DIR   where the spindle executable is (default: build)
    --quick           2 s per point, one round, 100 tenants and 1,000
                      keys (the full run: 8 s per point, five rounds, 1,000
                      tenants and 10,000 keys)
    --duration S      seconds per point, overriding the above
    --rounds N        rounds per point (default 5, 1 with --quick)
    --json PATH       write the tables as JSON in the benchmark report's
                      format ({"benchmark": "tenants", "machine",
                      "tables"}, see bench/make_report.py), with every raw
                      figure and the run's settings beside them under
                      "figures"

Needs wrk (.ci/install-deps installs it). The servers and the key file run
from a temporary directory that is removed at the end; both servers are
stopped on exit, failure and Ctrl-C. Python 3 standard library only;
shares bench_http.py's servers, wrk runner and parser.
"""

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import platform
import re
import resource
import subprocess
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_http as bh  # noqa: E402  (servers, wrk and its parser, tables)

TENANTS = 1000
KEYS_PER_TENANT = 10
THREADS_PER_TENANT = 4
TARGET = 0.97           # tenancy on / off, requests per second
CONNECTIONS = (8, 64)
POPULATE_CLIENTS = 32   # concurrent Python connections while populating
ROUTES = (("get", "GET /v1/threads/{id}"),
          ("post", "POST /v1/threads/{id}/messages"))


def fail(msg):
    raise SystemExit("bench_tenants: " + msg)


# ---------------------------------------------------------------- servers

def start_spindle(exe, tmp, name, data, extra, stack):
    """bench_http.start_spindle with more flags: a server on a free port,
    stopped when `stack` unwinds; (Server, URL)."""
    out = os.path.join(tmp, name + ".out")
    err = os.path.join(tmp, name + ".err")
    srv = bh.Server(f"spindle ({name})",
                    [exe, "serve", "--port", "0", "--data", data,
                     "--llm", "offline", "--log-level", "warn", *extra],
                    out, err, cwd=tmp)
    stack.callback(srv.stop)
    deadline = time.monotonic() + 30
    pattern = re.compile(r"serving on (http://[0-9.]+:(\d+))")
    while time.monotonic() < deadline:
        try:
            with open(out, errors="replace") as f:
                m = pattern.search(f.readline())
        except OSError:
            m = None
        if m:
            url = m.group(1)
            status, _ = bh.http_get(url + "/healthz")
            if status != 200:
                fail(f"spindle ({name}) answered {status} on /healthz")
            return srv, url
        if not srv.alive():
            fail(f"spindle ({name}) exited with {srv.proc.returncode}:\n"
                 + bh.tail(out) + bh.tail(err))
        time.sleep(0.05)
    fail(f"spindle ({name}) printed no address in 30 s:\n"
         + bh.tail(out) + bh.tail(err))


class Client:
    """Keep-alive HTTP/1.1 connections to one server, one per Python
    thread, for populating it concurrently."""

    def __init__(self, url, name):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.name = name
        self.local = threading.local()
        self.lock = threading.Lock()
        self.conns = []

    def request(self, method, path, body=None, token=None):
        """(status, parsed JSON answer or its text). A broken connection
        is not retried: a POST sent twice would create twice."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port,
                                              timeout=60)
            self.local.conn = conn
            with self.lock:
                self.conns.append(conn)
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token:
            headers["Authorization"] = "Bearer " + token
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            text = r.read().decode("utf-8", "replace")
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            self.local.conn = None
            fail(f"{method} {path} on the {self.name} server: {e!r}")
        if (r.getheader("Connection") or "").lower() == "close":
            conn.close()
            self.local.conn = None
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def expect(self, want, method, path, body=None, token=None):
        status, answer = self.request(method, path, body, token)
        if status != want:
            fail(f"{method} {path} on the {self.name} server answered "
                 f"{status} (expected {want}): {answer}")
        return answer

    def close(self):
        with self.lock:
            for c in self.conns:
                c.close()
            self.conns = []


def populate(on_url, off_url, admin, tenants, log):
    """Tenants, keys and threads on the on server, the same threads on
    the off server, and one request with every key; the keys by tenant."""
    on = Client(on_url, "on")
    off = Client(off_url, "off")
    texts = bh.MESSAGES
    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(POPULATE_CLIENTS) as ex:
            def run(fn, items):
                return list(ex.map(fn, items))

            ids = run(lambda i: on.expect(201, "POST", "/v1/tenants",
                                          {"name": f"bench-{i}"}, admin)["id"],
                      range(tenants))
            t_tenants = time.monotonic()
            keys = run(lambda ik: on.expect(
                201, "POST", f"/v1/tenants/{ids[ik[0]]}/keys", {},
                admin)["key"],
                [(i, k) for i in range(tenants)
                 for k in range(KEYS_PER_TENANT)])
            keys = [keys[i * KEYS_PER_TENANT:(i + 1) * KEYS_PER_TENANT]
                    for i in range(tenants)]
            t_keys = time.monotonic()
            log(f"  on: {tenants:,} tenants in {t_tenants - started:.1f} s, "
                f"{tenants * KEYS_PER_TENANT:,} keys in "
                f"{t_keys - t_tenants:.1f} s")

            pairs = [(i, j) for i in range(tenants)
                     for j in range(THREADS_PER_TENANT)]

            def content(i, j):
                return {"content": texts[(i * THREADS_PER_TENANT + j)
                                         % len(texts)]}

            # Thread J of tenant I is created with the tenant's key J.
            run(lambda p: on.expect(
                200, "POST", f"/v1/threads/bench-{p[1]}/messages",
                content(*p), keys[p[0]][p[1]]), pairs)
            run(lambda p: off.expect(
                200, "POST", f"/v1/threads/t{p[0]}-bench-{p[1]}/messages",
                content(*p)), pairs)
            t_threads = time.monotonic()
            log(f"  {len(pairs):,} threads on each server in "
                f"{t_threads - t_keys:.1f} s")
            # Every other key once: the cache of keys in use holds them all.
            rest = [(i, k) for i in range(tenants)
                    for k in range(THREADS_PER_TENANT, KEYS_PER_TENANT)]
            run(lambda ik: on.expect(
                200, "GET",
                f"/v1/threads/bench-{ik[1] % THREADS_PER_TENANT}",
                None, keys[ik[0]][ik[1]]), rest)
            log(f"  one request with each of the other {len(rest):,} keys "
                f"in {time.monotonic() - t_threads:.1f} s")
    finally:
        on.close()
        off.close()
    return keys, time.monotonic() - started


def admin_get(url, path, admin, timeout=10.0):
    req = urllib.request.Request(url + path, headers={
        "Authorization": "Bearer " + admin})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def key_authentications(url, admin):
    """{"cache": N, "store": N} from the on server's /metrics."""
    out = {}
    text = admin_get(url, "/metrics", admin)
    for source, value in re.findall(
            r'^spindle_key_authentications\{source="(\w+)"\}\s+'
            r'([0-9.eE+-]+)$', text, re.M):
        out[source] = int(float(value))
    return out


def answers_by_status(url, admin=None):
    """spindle_http_requests_total by route and status."""
    if admin:
        text = admin_get(url, "/metrics", admin)
    else:
        _, text = bh.http_get(url + "/metrics", timeout=10)
    out = {}
    # The route label holds braces itself ("GET /v1/threads/{id}").
    for labels, value in re.findall(
            r'^spindle_http_requests_total\{(.*)\}\s+([0-9.eE+-]+)$',
            text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{lab.get('route', '?')} {lab.get('status', '?')}"
        out[key] = out.get(key, 0) + int(float(value))
    return out


# ---------------------------------------------------------------- wrk

LUA = """-- {what}: a random key of {key_count} ({keys_per_tenant} per
-- tenant) and one of its tenant's {threads} threads per request; with
-- tenancy off, the same choices as the path /v1/threads/tN-bench-J.
local tenancy = {tenancy}
local method = "{method}"
local key_count = {key_count}
local keys_per_tenant = {keys_per_tenant}
local threads_per_tenant = {threads}
local items = {{
{items}
}}
local keys = {{}}
local counter = 0
local headers = {{}}
if method == "POST" then
  headers["Content-Type"] = "application/json"
end

-- Each wrk thread its own seed, the same in both servers' scripts: both
-- get the same requests in the same order.
local wrk_threads = {{}}
function setup(thread)
  thread:set("index", #wrk_threads)
  table.insert(wrk_threads, thread)
end

function init(args)
  local i = index or 0
  counter = i * 7919
  math.randomseed(12345 + i)
  if tenancy then
    for line in io.lines("{keys_path}") do
      if #line > 0 then
        keys[#keys + 1] = line
      end
    end
    if #keys ~= key_count then
      error("{keys_path}: " .. #keys .. " keys, expected " .. key_count)
    end
  end
end

function request()
  local r = math.random(key_count)
  local tenant = math.floor((r - 1) / keys_per_tenant)
  local j = math.random(0, threads_per_tenant - 1)
  local path
  if tenancy then
    headers["Authorization"] = "Bearer " .. keys[r]
    path = "/v1/threads/bench-" .. j
  else
    path = "/v1/threads/t" .. tenant .. "-bench-" .. j
  end
  if method == "POST" then
    local body = items[(counter % #items) + 1]
    counter = counter + 1
    return wrk.format("POST", path .. "/messages", headers, body)
  end
  return wrk.format("GET", path, headers)
end
"""


def write_lua(tmp, route, tenancy, keys_path, key_count):
    lines = []
    for t in bh.MESSAGES:
        item = json.dumps({"content": t}, ensure_ascii=False)
        assert "]==]" not in item
        lines.append(f"  [==[{item}]==],")
    assert '"' not in keys_path and "\\" not in keys_path
    path = os.path.join(tmp, f"{route}-{'on' if tenancy else 'off'}.lua")
    with open(path, "w", encoding="utf-8") as f:
        f.write(LUA.format(
            what=dict(ROUTES)[route], tenancy="true" if tenancy else "false",
            method="GET" if route == "get" else "POST",
            key_count=key_count, keys_per_tenant=KEYS_PER_TENANT,
            threads=THREADS_PER_TENANT, items="\n".join(lines),
            keys_path=keys_path))
    return path


def cpu_seconds(pid):
    """User and system CPU time the process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(url, c, seconds, script, pid):
    """One wrk point, with the server's CPU time per request: the cost of
    a request the server pays whatever else runs on the machine, so it
    compares two servers more steadily than requests per second on a
    shared machine, where one round's ratio moves by 2x."""
    before = cpu_seconds(pid)
    r = bh.run_wrk(url, c, seconds, script)
    used = cpu_seconds(pid) - before
    n = r.get("requests") or 0
    r["cpu_us_per_request"] = used * 1e6 / n if n else float("nan")
    return r


def bench_route(route, urls, scripts, conns, seconds, rounds, log, pids):
    """Like bench_http's /healthz: `rounds` rounds per connection count,
    the two servers one right after the other, the order alternating;
    the ratio is the median of the rounds' ratios, each server's figures
    its median round's. `cpu_ratio` is off's CPU time per request over
    on's, the median of the rounds': the capacity tenancy leaves."""
    points = []
    for c in conns:
        runs = []
        for r in range(rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            got = {name: measured(urls[name], c, seconds, scripts[name],
                                  pids[name])
                   for name in order}
            got["ratio"] = (got["on"]["requests_per_sec"]
                            / got["off"]["requests_per_sec"])
            got["cpu_ratio"] = (got["off"]["cpu_us_per_request"]
                                / got["on"]["cpu_us_per_request"])
            runs.append(got)

        def median_run(name):
            by = sorted(runs, key=lambda g: g[name]["requests_per_sec"])
            return by[len(by) // 2][name]

        p = {"connections": c, "off": median_run("off"),
             "on": median_run("on"),
             "ratio": statistics.median(g["ratio"] for g in runs),
             "round_ratios": [g["ratio"] for g in runs],
             "cpu_ratio": statistics.median(g["cpu_ratio"] for g in runs),
             "cpu_us": {name: statistics.median(g[name]["cpu_us_per_request"]
                                                for g in runs)
                        for name in ("off", "on")}}
        log(f"  {route} c={c}: on {p['on']['requests_per_sec']:,.0f}/s, "
            f"off {p['off']['requests_per_sec']:,.0f}/s, rounds "
            + " ".join(f"{x:.2f}x" for x in p["round_ratios"])
            + f", median {p['ratio']:.2f}x; CPU per request off "
            f"{p['cpu_us']['off']:.0f} us, on {p['cpu_us']['on']:.0f} us, "
            f"{p['cpu_ratio']:.2f}x")
        points.append(p)
    return points


# ---------------------------------------------------------------- tables

def met(p):
    return p["ratio"] >= TARGET


def route_table(points):
    rows = []
    for p in points:
        on, off = p["on"], p["off"]
        rows.append([p["connections"], bh.fmt_rps(off), bh.fmt_rps(on),
                     f"{p['ratio']:.2f}x",
                     " ".join(f"{x:.2f}" for x in p["round_ratios"]),
                     "yes" if met(p) else "**no**",
                     bh.lat(off, "p50"), bh.lat(on, "p50"),
                     bh.lat(off, "p99"), bh.lat(on, "p99"),
                     f"{p['cpu_us']['off']:.0f} µs",
                     f"{p['cpu_us']['on']:.0f} µs",
                     f"{p['cpu_ratio']:.2f}x"])
    return bh.table(["connections", "off req/s", "on req/s", "on/off",
                     "rounds", f"≥ {TARGET}x", "off p50", "on p50",
                     "off p99", "on p99", "off CPU/req", "on CPU/req",
                     "CPU off/on"], rows)


def route_report_table(route, points, seconds, tenants):
    rows = []
    for p in points:
        on, off = p["on"], p["off"]
        rows.append([p["connections"], round(off["requests_per_sec"]),
                     round(on["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     " ".join(f"{x:.2f}x" for x in p["round_ratios"]),
                     "yes" if met(p) else "no",
                     bh.ms_cell(off, "p50"), bh.ms_cell(on, "p50"),
                     bh.ms_cell(off, "p99"), bh.ms_cell(on, "p99"),
                     on["errors"] + off["errors"]])
    what = dict(ROUTES)[route]
    n_rounds = len(points[0]["round_ratios"]) if points else 0
    notes = [
        f"on: `--admin-token`, {tenants:,} tenants with "
        f"{KEYS_PER_TENANT} keys each ({tenants * KEYS_PER_TENANT:,} "
        f"keys), each request with a random key and one of its tenant's "
        f"{THREADS_PER_TENANT} threads; off: no token, the same choices "
        f"of thread ({tenants * THREADS_PER_TENANT:,} threads on each "
        f"server). Both durable (a data directory, default settings), "
        f"offline provider.",
        f"`wrk -t2 -cN -d{seconds}s --latency --timeout 10s` against each "
        f"server in turn, after a warm-up of both, in {n_rounds} round(s) "
        f"whose order of the servers alternates; on / off is the median "
        f"of the rounds' ratios, the other columns each server's median "
        f"round.",
        "errors: socket errors and non-2xx replies of both servers over "
        "the point.",
    ]
    bad = [f"{p['connections']} connections ({name}: {p[name]['errors']})"
           for p in points for name in ("off", "on") if p[name]["errors"]]
    if bad:
        notes.append("Points with socket errors or non-2xx replies, not "
                     "valid measurements: " + ", ".join(bad) + ".")
    notes.append(f"Target: on / off at least {TARGET}x at "
                 f"{' and '.join(map(str, CONNECTIONS))} connections.")
    return {
        "title": f"{what} with tenancy on beside the same server with "
                 f"tenancy off, keep-alive connections",
        "columns": ["connections", "off req/s", "on req/s", "on / off",
                    "rounds", f"target met (≥ {TARGET}x)", "off p50 ms",
                    "on p50 ms", "off p99 ms", "on p99 ms", "errors"],
        "rows": rows,
        "notes": notes,
    }


def auth_rows(auth):
    before, after = auth["before"], auth["after"]
    rows = []
    for label, a, b in (
            ("populating, warm-up", {}, before),
            ("measured points", before, after),
            ("total", {}, after)):
        rows.append([label, b.get("cache", 0) - a.get("cache", 0),
                     b.get("store", 0) - a.get("store", 0)])
    return rows


def auth_report_table(auth):
    return {
        "title": "Requests authenticated by a tenant's key on the tenancy-"
                 "on server, by where the key was found",
        "columns": ["requests", "from the cache", "from the store"],
        "rows": auth_rows(auth),
        "notes": [
            "spindle_key_authentications{source=\"cache\"} and "
            "{source=\"store\"} from the on server's /metrics (with the "
            "admin token) before the first measured point and at the end. "
            "A key's first use in the process reads it from the store (on "
            "a worker thread); every later request is answered from the "
            "cache of keys in use, on the connection's event loop. Every "
            "key was used once before the measured points.",
        ],
    }


def report_document(result, seconds):
    tables = [route_report_table(route, result[route], seconds,
                                 result["settings"]["tenants"])
              for route, _ in ROUTES if route in result]
    if "key_authentications" in result:
        tables.append(auth_report_table(result["key_authentications"]))
    return {"benchmark": "tenants", "machine": bh.machine(),
            "tables": tables, "figures": result}


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(
        description="The cost of authentication with tenancy on, with wrk "
                    "(see the module docstring).")
    ap.add_argument("--build-dir", default="build",
                    help="directory holding the spindle executable "
                         "(default: build)")
    ap.add_argument("--quick", action="store_true",
                    help="2 s per point, one round")
    ap.add_argument("--duration", type=int, metavar="S",
                    help="seconds per point (default: 2 with --quick, else 8)")
    ap.add_argument("--rounds", type=int, metavar="N",
                    help="rounds per point, the servers' order alternating "
                         "(default: 1 with --quick, else 5); the ratio is "
                         "the rounds' median")
    ap.add_argument("--json", metavar="PATH",
                    help="write every figure to this JSON file")
    ap.add_argument("--pin", action="store_true",
                    help="run both servers on the first core and wrk (and "
                         "this script) on the second, so that the two "
                         "servers are measured in the same conditions")
    args = ap.parse_args()

    exe = os.path.abspath(os.path.join(args.build_dir, "spindle"))
    if not os.access(exe, os.X_OK):
        fail(f"{exe} not found: build spindle first, or pass --build-dir")
    if not shutil.which("wrk"):
        fail("wrk not found: install it (.ci/install-deps)")
    seconds = args.duration or (2 if args.quick else 8)
    if seconds < 1:
        fail("--duration must be at least 1")
    if args.rounds is not None and args.rounds < 1:
        fail("--rounds must be at least 1")
    rounds = args.rounds or (1 if args.quick else 5)
    conns = list(CONNECTIONS)
    # A quick run (the suite's check of the report) populates a tenth: 100
    # tenants, 1,000 keys; the target is measured by the full run only.
    tenants = TENANTS // 10 if args.quick else TENANTS
    bh.raise_fd_limit()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C does, so both servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    result = {
        "settings": {
            "quick": args.quick, "seconds_per_point": seconds,
            "rounds": rounds, "connections": conns, "tenants": tenants,
            "keys_per_tenant": KEYS_PER_TENANT,
            "threads_per_tenant": THREADS_PER_TENANT,
            "message_texts": len(bh.MESSAGES),
            "target": {"on_over_off": TARGET, "at_connections": conns},
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)},
        "versions": {k: v for k, v in bh.versions(exe).items()
                     if k != "nginx"},
    }
    admin = "adm_" + secrets.token_urlsafe(30)

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench_tenants-"))
        log(f"bench_tenants: {seconds} s per point, {rounds} round(s), "
            f"temp dir {tmp}")
        off_srv, off_url = start_spindle(exe, tmp, "off",
                                         os.path.join(tmp, "off"), [], stack)
        on_srv, on_url = start_spindle(exe, tmp, "on",
                                       os.path.join(tmp, "on"),
                                       ["--admin-token", admin], stack)
        pids = {"off": off_srv.proc.pid, "on": on_srv.proc.pid}
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                fail("--pin needs two cores")
            for pid in pids.values():
                # Every thread of the server, not only its first.
                subprocess.run(["taskset", "-a", "-p", "-c", str(cpus[0]),
                                str(pid)], check=True,
                               stdout=subprocess.DEVNULL)
            os.sched_setaffinity(0, {cpus[1]})
            result["pinned"] = {"servers": cpus[0], "wrk": cpus[1]}
            log(f"  servers pinned to CPU {cpus[0]}, wrk to CPU {cpus[1]}")
        log(f"  spindle (tenancy off) at {off_url}, "
            f"(tenancy on) at {on_url}")
        keys, took = populate(on_url, off_url, admin, tenants, log)
        result["populate_seconds"] = took
        keys_path = os.path.join(tmp, "keys.txt")
        with open(keys_path, "w") as f:
            for tenant_keys in keys:
                for k in tenant_keys:
                    f.write(k + "\n")
        key_count = tenants * KEYS_PER_TENANT
        urls = {"off": off_url, "on": on_url}
        scripts = {route: {name: write_lua(tmp, route, name == "on",
                                           keys_path, key_count)
                           for name in urls}
                   for route, _ in ROUTES}
        # Warm both up (connections, allocators, caches) on both routes.
        for route, _ in ROUTES:
            for name, url in urls.items():
                bh.run_wrk(url, 8, 1, scripts[route][name])
        before = key_authentications(on_url, admin)
        for route, _ in ROUTES:
            result[route] = bench_route(route, urls, scripts[route], conns,
                                        seconds, rounds, log, pids)
        after = key_authentications(on_url, admin)
        result["key_authentications"] = {"before": before, "after": after}
        result["answers"] = {"off": answers_by_status(off_url),
                             "on": answers_by_status(on_url, admin)}

    cpus = os.cpu_count()
    print(f"\n## Tenancy on beside tenancy off (wrk, {seconds} s per point, "
          f"{rounds} round(s), {cpus} CPUs shared by client and servers)\n")
    v = result["versions"]
    print(f"{v['spindle']}; {v['wrk']}\n")
    print(f"on: --admin-token, {tenants:,} tenants x {KEYS_PER_TENANT} keys "
          f"= {tenants * KEYS_PER_TENANT:,} keys, a random key per request; "
          f"off: no token. {tenants * THREADS_PER_TENANT:,} threads on "
          f"each, durable, offline provider; populated in "
          f"{result['populate_seconds']:.1f} s.\n")
    for route, what in ROUTES:
        print(f"### {what}\n")
        print(route_table(result[route]))
        print()
    print(f"Target: on/off ≥ {TARGET}x at "
          f"{' and '.join(map(str, CONNECTIONS))} connections, both routes "
          f"(the median of {rounds} round(s) in alternating order).")
    points = [p for route, _ in ROUTES for p in result[route]]
    print("Target met." if all(met(p) for p in points)
          else "Target NOT met: " + ", ".join(
              f"{route} c={p['connections']} {p['ratio']:.2f}x"
              for route, _ in ROUTES for p in result[route] if not met(p))
          + ".")
    print("\n### spindle_key_authentications of the tenancy-on server\n")
    print(bh.table(["requests", "from the cache", "from the store"],
                   [[r[0], f"{r[1]:,}", f"{r[2]:,}"]
                    for r in auth_rows(result["key_authentications"])]))
    print()
    bad = [f"{route} c={p['connections']} {name} ({p[name]['errors']})"
           for route, _ in ROUTES for p in result[route]
           for name in ("off", "on") if p[name]["errors"]]
    if bad:
        print("Points with socket errors or non-2xx replies (not valid "
              "measurements): " + ", ".join(bad))
        for name, counts in result["answers"].items():
            odd = {k: n for k, n in counts.items()
                   if not re.search(r" 2\d\d$", k)}
            if odd:
                print(f"  {name} server's answers other than 2xx: "
                      + ", ".join(f"{k}: {n}" for k, n in sorted(odd.items())))
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report_document(result, seconds), f, indent=2,
                      ensure_ascii=False)
            f.write("\n")
        log(f"bench_tenants: figures written to {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("bench_tenants: interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
