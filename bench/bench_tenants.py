#!/usr/bin/env python3
"""The cost of authentication and authorization with tenancy on.

What it measures
----------------
Two `spindle serve` servers, each with a data directory of its own in a
temporary directory (the default settings: --sync full, group commit, but
for --max-resident 20000 and --idle-timeout 0, see below), the offline
provider (instant replies):

- off: no --admin-token and no --token, as spindle runs without tenancy;
- on: `--admin-token` (docs/tenants.md) with 1,000 tenants ("bench-0" ..
  "bench-999"), 10 keys each, 10,000 keys in all, and 10 end users each
  (u0 .. u9), 10,000 end users in all: each tenant accepts the HS256 JWTs
  of an issuer of its own (`PUT /v1/tenants/{id}/auth` with issuer
  https://bench-N.example and a secret of its own), and each end user has
  one token (claims iss, sub "uK", exp 6 hours ahead) signed by this
  script. All created over HTTP before the first measured point.

The data: each tenant holds 4 threads, bench-0 .. bench-3, each created by
one message sent with one of the tenant's keys; each end user holds 1
thread of its own, bench-0 (stored apart from its tenant's bench-0 and
from the other users'), created by one message sent with the user's token:
14,000 threads on the on server. The off server holds as many,
t0-bench-0 .. t999-bench-3 and t0-u0-bench-0 .. t999-u9-bench-0, so both
stores hold the same threads. Then one GET with each key the threads did
not use fills the on server's cache of keys in use, as a server that has
been up for a while holds it, and one GET with each token (a second use:
its thread's message was the first, but the server drops a tenant's
verified tokens when it applies the change of the tenant's settings, up to
500 ms after it) fills its cache of verified tokens. Both servers
run with --max-resident 20000 and --idle-timeout 0, so that all 14,000
threads stay in memory through the run on both (the default cap of 10,000
would make the on server passivate and reload threads as the measurement
moves between keys and end users, and the idle timeout would passivate
the off server's unused threads in the middle of a point).

Four configurations, each request of each picking its choices at random
with the same seed in each wrk thread, so the same sequence of choices:

- on, keys: one of the 10,000 keys and one of its tenant's 4 threads, the
  key sent as `Authorization: Bearer`, the path /v1/threads/bench-J;
- on, end users: one of the 10,000 end users' tokens (the same index as
  the key, so a user of the same tenant) and that user's thread, the token
  sent as `Authorization: Bearer`, the path /v1/threads/bench-0;
- off: the same choices as the keys, as the path /v1/threads/tN-bench-J,
  with no header: the denominator of on / off;
- off, end users' threads: the same choices as the end users, as the path
  /v1/threads/tN-uK-bench-0, with no header: the denominator of end users
  / off. The end users' requests spread over 10,000 threads, the keys'
  over 4,000, so each is compared with the off server reading the same
  threads, spread over memory alike (a thread of an end user also grows
  more slowly under POST).

Two routes:

1. GET /v1/threads/{id}: the thread object, a read.
2. POST /v1/threads/{id}/messages with a short varied message (JSON body):
   an exchange, both turns stored.

At 8 and 64 connections, each route is measured in five rounds (one in a
quick run), the four configurations one right after the other (keys and
end users against the same on server), each pair compared back to back,
the order changing from round to round (off, keys, off with the end
users' threads, end users in the first); on / off and end users / off
are the medians of the rounds' requests per second ratios, the other
columns each configuration's median round. Target (the tenancy issue):
on / off and end users / off at least 0.97x for both routes at 8 and 64
connections.

Every point is `wrk -t2 -cN -dSs --latency --timeout 10s` with a Lua
script; the tables give requests/sec, p50 and p99 latency, the server's
CPU time per request (from /proc) and any socket errors or non-2xx
replies (a point with errors is flagged: its figure is not a valid
measurement). wrk and both servers share the machine's cores; each server
runs its default of one event-loop thread per core.

At the end the on server's `spindle_key_authentications` (GET /metrics
with the admin token) tells how many requests were authenticated from the
cache of keys in use and how many read their key from the store, and
`spindle_end_user_authentications` how many tokens had their signature
verified and how many were found verified in the cache: over the measured
points every key and every token is already cached, so the store and
verified counts should not move.

Usage
-----
    python3 bench/bench_tenants.py --quick            # ~1 minute
    python3 bench/bench_tenants.py --json out.json    # full run, ~10 minutes

Options:
    --pin             both servers on the first core, wrk and this script
                      on the second: the same conditions for both
    --build-dir DIR   where the spindle executable is (default: build)
    --quick           2 s per point, one round, 100 tenants, 1,000 keys and
                      1,000 end users (the full run: 8 s per point, five
                      rounds, 1,000 tenants, 10,000 keys and 10,000 end
                      users)
    --duration S      seconds per point, overriding the above
    --rounds N        rounds per point (default 5, 1 with --quick)
    --json PATH       write the tables as JSON in the benchmark report's
                      format ({"benchmark": "tenants", "machine",
                      "tables"}, see bench/make_report.py), with every raw
                      figure and the run's settings beside them under
                      "figures"

Needs wrk (.ci/install-deps installs it). The servers, the key file and
the token file run from a temporary directory that is removed at the end;
both servers are stopped on exit, failure and Ctrl-C. Python 3 standard
library only; shares bench_http.py's servers, wrk runner and parser.
"""

import argparse
import base64
import concurrent.futures
import contextlib
import hashlib
import hmac
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
USERS_PER_TENANT = 10   # end users, one token each: as many as the keys
THREADS_PER_USER = 1    # bench-0 of each end user
TOKEN_LIFETIME_S = 6 * 3600
# Every thread of both servers in memory (14,000 each in the full run).
MAX_RESIDENT = 20000
TARGET = 0.97           # tenancy on / off, requests per second
CONNECTIONS = (8, 64)
POPULATE_CLIENTS = 32   # concurrent Python connections while populating
ROUTES = (("get", "GET /v1/threads/{id}"),
          ("post", "POST /v1/threads/{id}/messages"))
# The four configurations: "off" the server without tenancy with the
# keys' choices of thread, "on" the server with tenancy and a key per
# request, "offusers" the server without tenancy with the end users'
# choices of thread (the same 10,000 threads, so the same spread over
# memory), "users" the server with tenancy and an end user's token per
# request. keys / off compares "on" with "off", end users / off "users"
# with "offusers".
CONFIGS = ("off", "on", "offusers", "users")
CONFIG_NAMES = {"off": "off", "on": "on, keys",
                "offusers": "off, end users' threads",
                "users": "on, end users"}
# The order of the configurations in round r is ORDERS[r % 4]: each pair
# compared is measured back to back, each of its two first in every
# other round, and the pairs take turns going first.
ORDERS = (("off", "on", "offusers", "users"),
          ("users", "offusers", "on", "off"),
          ("on", "off", "users", "offusers"),
          ("offusers", "users", "off", "on"))


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


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_token(secret, claims):
    """A JWT signed with HMAC-SHA256 and `secret`, as an issuer signs its
    end users' tokens (tests/tenant_client.cpp's hs256_token)."""
    def part(obj):
        return b64url(json.dumps(obj, separators=(",", ":")).encode())
    signed = part({"alg": "HS256", "typ": "JWT"}) + "." + part(claims)
    mac = hmac.new(secret.encode(), signed.encode(), hashlib.sha256)
    return signed + "." + b64url(mac.digest())


def issuer_of(i):
    return f"https://bench-{i}.example"


def populate(on_url, off_url, admin, tenants, log):
    """Tenants, keys, end-user settings and threads on the on server, the
    same threads on the off server, and one request with every key and
    every token; (keys by tenant, tokens by tenant, seconds taken)."""
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
            t_rest = time.monotonic()
            log(f"  one request with each of the other {len(rest):,} keys "
                f"in {t_rest - t_threads:.1f} s")

            # End users: an issuer and a secret of its own per tenant,
            # then one token per user, each creating the user's thread
            # (which verifies the token and caches it).
            secrets_of = [secrets.token_urlsafe(32) for _ in range(tenants)]
            run(lambda i: on.expect(
                200, "PUT", f"/v1/tenants/{ids[i]}/auth",
                {"issuer": issuer_of(i), "hs256_secret": secrets_of[i]},
                admin), range(tenants))
            exp = int(time.time()) + TOKEN_LIFETIME_S
            tokens = [[hs256_token(secrets_of[i],
                                   {"iss": issuer_of(i), "sub": f"u{u}",
                                    "exp": exp})
                       for u in range(USERS_PER_TENANT)]
                      for i in range(tenants)]
            users = [(i, u, j) for i in range(tenants)
                     for u in range(USERS_PER_TENANT)
                     for j in range(THREADS_PER_USER)]

            def user_content(i, u, j):
                n = (i * USERS_PER_TENANT + u) * THREADS_PER_USER + j
                return {"content": texts[n % len(texts)]}

            run(lambda p: on.expect(
                200, "POST", f"/v1/threads/bench-{p[2]}/messages",
                user_content(*p), tokens[p[0]][p[1]]), users)
            run(lambda p: off.expect(
                200, "POST",
                f"/v1/threads/t{p[0]}-u{p[1]}-bench-{p[2]}/messages",
                user_content(*p)), users)
            t_users = time.monotonic()
            log(f"  on: {tenants:,} issuers, {tenants * USERS_PER_TENANT:,} "
                f"end users' tokens; {len(users):,} end users' threads on "
                f"each server in {t_users - t_rest:.1f} s")
            # The server drops a tenant's verified tokens when it applies
            # the change of the tenant's settings (its refresher, every
            # 500 ms), which may come after the thread's message: once it
            # has, one GET with each token verifies the ones dropped.
            time.sleep(1.0)
            run(lambda iu: on.expect(200, "GET", "/v1/threads/bench-0",
                                     None, tokens[iu[0]][iu[1]]),
                [(i, u) for i in range(tenants)
                 for u in range(USERS_PER_TENANT)])
            log(f"  one GET with each token in "
                f"{time.monotonic() - t_users:.1f} s")
    finally:
        on.close()
        off.close()
    return keys, tokens, time.monotonic() - started


def admin_get(url, path, admin, timeout=10.0):
    req = urllib.request.Request(url + path, headers={
        "Authorization": "Bearer " + admin})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def authentications(url, admin):
    """From the on server's /metrics: ({"cache": N, "store": N} of
    spindle_key_authentications, {"verified": N, "cache": N} of
    spindle_end_user_authentications)."""
    text = admin_get(url, "/metrics", admin)
    out = []
    for name in ("spindle_key_authentications",
                 "spindle_end_user_authentications"):
        by = {}
        for source, value in re.findall(
                r'^' + name + r'\{source="(\w+)"\}\s+([0-9.eE+-]+)$',
                text, re.M):
            by[source] = int(float(value))
        out.append(by)
    return tuple(out)


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

LUA = """-- {what}, {config}: a random one of {count} keys or
-- tokens ({per_tenant} per tenant) and one of its {threads} threads (the
-- tenant's with a key, the end user's with a token) per request; with
-- tenancy off, the same choices as the path /v1/threads/tN-bench-J.
local mode = "{mode}"
local method = "{method}"
local count = {count}
local per_tenant = {per_tenant}
local threads = {threads}
local items = {{
{items}
}}
local tokens = {{}}
local counter = 0
local headers = {{}}
if method == "POST" then
  headers["Content-Type"] = "application/json"
end

-- Each wrk thread its own seed, the same in every configuration's script:
-- all get the same choices in the same order.
local wrk_threads = {{}}
function setup(thread)
  thread:set("index", #wrk_threads)
  table.insert(wrk_threads, thread)
end

function init(args)
  local i = index or 0
  counter = i * 7919
  math.randomseed(12345 + i)
  if mode == "on" or mode == "users" then
    for line in io.lines("{tokens_path}") do
      if #line > 0 then
        tokens[#tokens + 1] = line
      end
    end
    if #tokens ~= count then
      error("{tokens_path}: " .. #tokens .. " lines, expected " .. count)
    end
  end
end

function request()
  local r = math.random(count)
  local tenant = math.floor((r - 1) / per_tenant)
  local j = math.random(0, threads - 1)
  local path
  if mode == "off" then
    path = "/v1/threads/t" .. tenant .. "-bench-" .. j
  elseif mode == "offusers" then
    path = "/v1/threads/t" .. tenant .. "-u" .. ((r - 1) % per_tenant)
           .. "-bench-" .. j
  else
    headers["Authorization"] = "Bearer " .. tokens[r]
    path = "/v1/threads/bench-" .. j
  end
  if method == "POST" then
    local body = items[(counter % #items) + 1]
    counter = counter + 1
    return wrk.format("POST", path .. "/messages", headers, body)
  end
  return wrk.format("GET", path, headers)
end
"""


def write_lua(tmp, route, mode, tokens_path, count):
    """The wrk script of `route` for configuration `mode` (CONFIGS):
    "on" reads the keys from `tokens_path`, "users" the end users'
    tokens, both `count` lines in the order of their tenants."""
    lines = []
    for t in bh.MESSAGES:
        item = json.dumps({"content": t}, ensure_ascii=False)
        assert "]==]" not in item
        lines.append(f"  [==[{item}]==],")
    assert '"' not in tokens_path and "\\" not in tokens_path
    by_users = mode in ("users", "offusers")
    per_tenant = USERS_PER_TENANT if by_users else KEYS_PER_TENANT
    assert count % per_tenant == 0
    path = os.path.join(tmp, f"{route}-{mode}.lua")
    with open(path, "w", encoding="utf-8") as f:
        f.write(LUA.format(
            what=dict(ROUTES)[route], config=CONFIG_NAMES[mode], mode=mode,
            method="GET" if route == "get" else "POST",
            count=count, per_tenant=per_tenant,
            threads=THREADS_PER_USER if by_users else THREADS_PER_TENANT,
            items="\n".join(lines), tokens_path=tokens_path))
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
    the four configurations (CONFIGS) one right after the other, in the
    order ORDERS gives each round; on / off ("ratio") and end users / off
    ("users_ratio") are the medians of the rounds' ratios, each
    configuration's figures its median round's. `cpu_ratio` is off's CPU
    time per request over on's with keys (`users_cpu_ratio` with end
    users' tokens), the median of the rounds': the capacity tenancy
    leaves."""
    points = []
    for c in conns:
        runs = []
        for r in range(rounds):
            order = ORDERS[r % len(ORDERS)]
            got = {name: measured(urls[name], c, seconds, scripts[name],
                                  pids[name])
                   for name in order}
            got["order"] = list(order)
            for name, base, prefix in (("on", "off", ""),
                                       ("users", "offusers", "users_")):
                got[prefix + "ratio"] = (got[name]["requests_per_sec"]
                                         / got[base]["requests_per_sec"])
                got[prefix + "cpu_ratio"] = (
                    got[base]["cpu_us_per_request"]
                    / got[name]["cpu_us_per_request"])
            runs.append(got)

        def median_run(name):
            by = sorted(runs, key=lambda g: g[name]["requests_per_sec"])
            return by[len(by) // 2][name]

        p = {"connections": c, "off": median_run("off"),
             "on": median_run("on"), "offusers": median_run("offusers"),
             "users": median_run("users"),
             "orders": [g["order"] for g in runs],
             "cpu_us": {name: statistics.median(g[name]["cpu_us_per_request"]
                                                for g in runs)
                        for name in CONFIGS}}
        for prefix in ("", "users_"):
            p[prefix + "ratio"] = statistics.median(g[prefix + "ratio"]
                                                    for g in runs)
            p[prefix + "round_ratios"] = [g[prefix + "ratio"] for g in runs]
            p[prefix + "cpu_ratio"] = statistics.median(
                g[prefix + "cpu_ratio"] for g in runs)
        log(f"  {route} c={c}: off {p['off']['requests_per_sec']:,.0f}/s, "
            f"keys {p['on']['requests_per_sec']:,.0f}/s, off (users' "
            f"threads) {p['offusers']['requests_per_sec']:,.0f}/s, end users "
            f"{p['users']['requests_per_sec']:,.0f}/s; keys/off rounds "
            + " ".join(f"{x:.2f}x" for x in p["round_ratios"])
            + f", median {p['ratio']:.2f}x; end users/off rounds "
            + " ".join(f"{x:.2f}x" for x in p["users_round_ratios"])
            + f", median {p['users_ratio']:.2f}x; CPU per request off "
            f"{p['cpu_us']['off']:.0f} us, keys {p['cpu_us']['on']:.0f} us, "
            f"off (users' threads) {p['cpu_us']['offusers']:.0f} us, "
            f"end users {p['cpu_us']['users']:.0f} us")
        points.append(p)
    return points


# ---------------------------------------------------------------- tables

def keys_met(p):
    return p["ratio"] >= TARGET


def users_met(p):
    return p["users_ratio"] >= TARGET


def rounds_text(ratios, x=""):
    return " ".join(f"{v:.2f}{x}" for v in ratios)


def route_table(points):
    rows = []
    for p in points:
        off, on, us = p["off"], p["on"], p["users"]
        rows.append([p["connections"], bh.fmt_rps(off), bh.fmt_rps(on),
                     bh.fmt_rps(p["offusers"]),
                     bh.fmt_rps(us), f"{p['ratio']:.2f}x",
                     f"{p['users_ratio']:.2f}x",
                     rounds_text(p["round_ratios"]),
                     rounds_text(p["users_round_ratios"]),
                     " / ".join("yes" if ok else "**no**"
                                for ok in (keys_met(p), users_met(p))),
                     bh.lat(off, "p50"), bh.lat(on, "p50"),
                     bh.lat(us, "p50"), bh.lat(off, "p99"),
                     bh.lat(on, "p99"), bh.lat(us, "p99"),
                     f"{p['cpu_us']['off']:.0f} µs",
                     f"{p['cpu_us']['on']:.0f} µs",
                     f"{p['cpu_us']['offusers']:.0f} µs",
                     f"{p['cpu_us']['users']:.0f} µs",
                     f"{p['cpu_ratio']:.2f}x",
                     f"{p['users_cpu_ratio']:.2f}x"])
    return bh.table(["connections", "off req/s", "keys req/s",
                     "off (users' threads) req/s", "users req/s", "keys/off", "users/off", "keys rounds",
                     "users rounds", f"≥ {TARGET}x keys / users",
                     "off p50", "keys p50", "users p50", "off p99",
                     "keys p99", "users p99", "off CPU/req",
                     "keys CPU/req", "off (users' threads) CPU/req",
                     "users CPU/req", "CPU off/keys",
                     "CPU off/users"], rows)


def route_report_table(route, points, seconds, tenants):
    rows = []
    for p in points:
        off, on, us = p["off"], p["on"], p["users"]
        rows.append([p["connections"], round(off["requests_per_sec"]),
                     round(on["requests_per_sec"]),
                     round(p["offusers"]["requests_per_sec"]),
                     round(us["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     f"{p['users_ratio']:.2f}x",
                     rounds_text(p["round_ratios"], "x"),
                     rounds_text(p["users_round_ratios"], "x"),
                     "yes" if keys_met(p) else "no",
                     "yes" if users_met(p) else "no",
                     bh.ms_cell(off, "p50"), bh.ms_cell(on, "p50"),
                     bh.ms_cell(us, "p50"), bh.ms_cell(off, "p99"),
                     bh.ms_cell(on, "p99"), bh.ms_cell(us, "p99"),
                     sum(p[name]["errors"] for name in CONFIGS)])
    what = dict(ROUTES)[route]
    n_rounds = len(points[0]["round_ratios"]) if points else 0
    threads = tenants * (THREADS_PER_TENANT
                         + USERS_PER_TENANT * THREADS_PER_USER)
    notes = [
        f"on: `--admin-token`, {tenants:,} tenants with "
        f"{KEYS_PER_TENANT} keys each ({tenants * KEYS_PER_TENANT:,} "
        f"keys), each request with a random key and one of its tenant's "
        f"{THREADS_PER_TENANT} threads; end users: the same server, "
        f"{USERS_PER_TENANT} end users per tenant "
        f"({tenants * USERS_PER_TENANT:,} HS256 JWTs, one issuer per "
        f"tenant), each request with a random user's token and its "
        f"thread; off: no token, the same choices of thread as the keys "
        f"(beside the keys) or as the end users (beside the end users: "
        f"the same threads, so the same spread over memory). "
        f"{threads:,} threads on each server, all resident "
        f"(--max-resident {MAX_RESIDENT} --idle-timeout 0). Durable (a "
        f"data directory, --sync full), offline provider.",
        f"`wrk -t2 -cN -d{seconds}s --latency --timeout 10s` against each "
        f"configuration in turn, after a warm-up of each, in {n_rounds} "
        f"round(s) whose order of the configurations changes (each pair "
        f"compared back to back); on / off and end users / off are the "
        f"medians of the rounds' ratios, the "
        f"other columns each configuration's median round.",
        "errors: socket errors and non-2xx replies of the four "
        "configurations over the point.",
    ]
    bad = [f"{p['connections']} connections ({CONFIG_NAMES[name]}: "
           f"{p[name]['errors']})"
           for p in points for name in CONFIGS if p[name]["errors"]]
    if bad:
        notes.append("Points with socket errors or non-2xx replies, not "
                     "valid measurements: " + ", ".join(bad) + ".")
    notes.append(f"Target: on / off and end users / off at least "
                 f"{TARGET}x at "
                 f"{' and '.join(map(str, CONNECTIONS))} connections.")
    return {
        "title": f"{what} with tenancy on (a tenant's key, an end user's "
                 f"token) beside the same server with tenancy off, "
                 f"keep-alive connections",
        "columns": ["connections", "off req/s", "on req/s",
                    "off (end users' threads) req/s", "end users req/s", "on / off", "end users / off",
                    "rounds", "end users' rounds",
                    f"target met (≥ {TARGET}x)",
                    f"end users' target met (≥ {TARGET}x)", "off p50 ms",
                    "on p50 ms", "end users p50 ms", "off p99 ms",
                    "on p99 ms", "end users p99 ms", "errors"],
        "rows": rows,
        "notes": notes,
    }


AUTH_PHASES = ("populating, warm-up", "measured points", "total")


def auth_rows(auth, sources=("cache", "store")):
    before, after = auth["before"], auth["after"]
    rows = []
    for label, a, b in zip(AUTH_PHASES, ({}, before, {}),
                           (before, after, after)):
        rows.append([label] + [b.get(s, 0) - a.get(s, 0) for s in sources])
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


def end_user_auth_report_table(auth):
    return {
        "title": "Requests authenticated by an end user's token on the "
                 "tenancy-on server, by whether its signature was verified",
        "columns": ["requests", "signature verified",
                    "found verified in the cache"],
        "rows": auth_rows(auth, ("verified", "cache")),
        "notes": [
            "spindle_end_user_authentications{source=\"verified\"} and "
            "{source=\"cache\"} from the on server's /metrics (with the "
            "admin token) before the first measured point and at the end. "
            "A token's first use verifies its signature (HMAC-SHA256 with "
            "its tenant's secret); later requests find it verified in the "
            "cache until it expires. Every token was used twice before the "
            "measured points (its thread's message, then one GET); "
            "populating verifies some tokens twice, as the server drops a "
            "tenant's verified tokens when it applies the change of the "
            "tenant's settings (PUT /v1/tenants/{id}/auth), which may come "
            "after the token's first use.",
        ],
    }


def report_document(result, seconds):
    tables = [route_report_table(route, result[route], seconds,
                                 result["settings"]["tenants"])
              for route, _ in ROUTES if route in result]
    if "key_authentications" in result:
        tables.append(auth_report_table(result["key_authentications"]))
    if "end_user_authentications" in result:
        tables.append(end_user_auth_report_table(
            result["end_user_authentications"]))
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
    # tenants, 1,000 keys, 1,000 end users; the target is measured by the
    # full run only.
    tenants = TENANTS // 10 if args.quick else TENANTS
    threads = tenants * (THREADS_PER_TENANT
                         + USERS_PER_TENANT * THREADS_PER_USER)
    assert threads <= MAX_RESIDENT
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
            "end_users_per_tenant": USERS_PER_TENANT,
            "threads_per_end_user": THREADS_PER_USER,
            "token_lifetime_s": TOKEN_LIFETIME_S,
            "threads_per_server": threads,
            "server_flags": ["--max-resident", str(MAX_RESIDENT),
                             "--idle-timeout", "0"],
            "configurations": CONFIG_NAMES,
            "message_texts": len(bh.MESSAGES),
            "target": {"on_over_off": TARGET,
                       "end_users_over_off": TARGET,
                       "at_connections": conns},
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
        flags = result["settings"]["server_flags"]
        off_srv, off_url = start_spindle(exe, tmp, "off",
                                         os.path.join(tmp, "off"), flags,
                                         stack)
        on_srv, on_url = start_spindle(exe, tmp, "on",
                                       os.path.join(tmp, "on"),
                                       ["--admin-token", admin, *flags],
                                       stack)
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
        keys, tokens, took = populate(on_url, off_url, admin, tenants, log)
        result["populate_seconds"] = took
        paths = {"on": os.path.join(tmp, "keys.txt"),
                 "users": os.path.join(tmp, "tokens.txt")}
        for name, by_tenant in (("on", keys), ("users", tokens)):
            with open(paths[name], "w") as f:
                for each in by_tenant:
                    for k in each:
                        f.write(k + "\n")
        counts = {"off": tenants * KEYS_PER_TENANT,
                  "on": tenants * KEYS_PER_TENANT,
                  "offusers": tenants * USERS_PER_TENANT,
                  "users": tenants * USERS_PER_TENANT}
        urls = {"off": off_url, "on": on_url, "offusers": off_url,
                "users": on_url}
        pids["users"] = pids["on"]
        pids["offusers"] = pids["off"]
        scripts = {route: {name: write_lua(tmp, route, name,
                                           paths.get(name, ""),
                                           counts[name])
                           for name in CONFIGS}
                   for route, _ in ROUTES}
        # Warm each up (connections, allocators, caches) on both routes.
        for route, _ in ROUTES:
            for name in CONFIGS:
                bh.run_wrk(urls[name], 8, 1, scripts[route][name])
        keys_before, users_before = authentications(on_url, admin)
        for route, _ in ROUTES:
            result[route] = bench_route(route, urls, scripts[route], conns,
                                        seconds, rounds, log, pids)
        keys_after, users_after = authentications(on_url, admin)
        result["key_authentications"] = {"before": keys_before,
                                         "after": keys_after}
        result["end_user_authentications"] = {"before": users_before,
                                              "after": users_after}
        result["answers"] = {"off": answers_by_status(off_url),
                             "on": answers_by_status(on_url, admin)}

    cpus = os.cpu_count()
    print(f"\n## Tenancy on beside tenancy off (wrk, {seconds} s per point, "
          f"{rounds} round(s), {cpus} CPUs shared by client and servers)\n")
    v = result["versions"]
    print(f"{v['spindle']}; {v['wrk']}\n")
    print(f"on: --admin-token, {tenants:,} tenants x {KEYS_PER_TENANT} keys "
          f"= {tenants * KEYS_PER_TENANT:,} keys (keys: a random key per "
          f"request, one of its tenant's {THREADS_PER_TENANT} threads) and "
          f"x {USERS_PER_TENANT} end users = "
          f"{tenants * USERS_PER_TENANT:,} HS256 tokens, one issuer per "
          f"tenant (users: a random token per request, its user's thread); "
          f"off: no token, the keys' choices of thread. {threads:,} threads "
          f"on each server, all resident, durable, offline provider; "
          f"populated in {result['populate_seconds']:.1f} s.\n")
    for route, what in ROUTES:
        print(f"### {what}\n")
        print(route_table(result[route]))
        print()
    print(f"Target: keys/off and users/off ≥ {TARGET}x at "
          f"{' and '.join(map(str, CONNECTIONS))} connections, both routes "
          f"(the median of {rounds} round(s), the order changing from round "
          f"to round).")
    misses = [f"{route} c={p['connections']} {label} {p[key]:.2f}x"
              for route, _ in ROUTES for p in result[route]
              for label, key in (("keys", "ratio"), ("users", "users_ratio"))
              if p[key] < TARGET]
    print("Target met." if not misses
          else "Target NOT met: " + ", ".join(misses) + ".")
    print("\n### spindle_key_authentications of the tenancy-on server\n")
    print(bh.table(["requests", "from the cache", "from the store"],
                   [[r[0], f"{r[1]:,}", f"{r[2]:,}"]
                    for r in auth_rows(result["key_authentications"])]))
    print("\n### spindle_end_user_authentications of the tenancy-on "
          "server\n")
    print(bh.table(["requests", "verified", "from the cache"],
                   [[r[0], f"{r[1]:,}", f"{r[2]:,}"]
                    for r in auth_rows(result["end_user_authentications"],
                                       ("verified", "cache"))]))
    print()
    bad = [f"{route} c={p['connections']} {CONFIG_NAMES[name]} "
           f"({p[name]['errors']})"
           for route, _ in ROUTES for p in result[route]
           for name in CONFIGS if p[name]["errors"]]
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
