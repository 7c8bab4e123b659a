#!/usr/bin/env python3
"""What per-tenant limits cost on POST /v1/threads/{id}/messages.

What it measures
----------------
Every call to the model of a tenant with limits goes through the limiter
(docs/limits.md): counted against requests_per_min, its prompt and reply
reserve against tokens_per_min, a slot of concurrent_exchanges taken and
freed, the tokens it used settled; and with `--llm-concurrency` through
the upstream's fair queue. This compares two servers of the same build
under the same load, in the same run:

- off: tenancy on (`--admin-token`), no limits at all: neither the
  command line's defaults nor any tenant's own;
- on: the same, but every tenant's limits set with `PATCH
  /v1/tenants/{id}` {"limits": {"requests_per_min": 1000000000,
  "tokens_per_min": 1000000000000, "concurrent_exchanges": 100000,
  "max_queued": 100000}}, the largest each takes, and the server started
  with `--llm-concurrency 100000`: every check of the limiter and of the
  upstream's fair queue runs on every call, and none is ever refused or
  queued.

Each a `spindle serve` of its own, a data directory in a temporary
directory (the durable default settings: --sync full, group commit), the
offline provider (instant replies), --log-level warn, on a free port.
Each gets 100 tenants (POST /v1/tenants with the admin token) with one
key each (POST /v1/tenants/{id}/keys); then each tenant's 16 threads,
bench-0 .. bench-15 (a tenant's threads are its own: the same path is
another thread for another tenant), 1,600 in all, each created by one
message sent with the tenant's key, the same messages on both servers;
then one warm-up second of the load on each. Every setup message on the
on server must answer with `x-ratelimit-limit-requests: 1000000000` and
`x-ratelimit-limit-tokens: 1000000000000` (the limits are in force), and
none on the off server.

The load, the shape users give it, many tenants and a hot one: POST
/v1/threads/bench-K/messages with the tenant's key as `Authorization:
Bearer` and a JSON body {"content": ..., "user_id": "user-U"}: the
tenant (tenant 0, the hot one, for half of the requests; the other half
spread evenly over the other 99), the thread K (of its 16), the user U
(of 16) and the content (12 words drawn from bench_usage.py's
vocabulary, about one in four a random number) chosen at random for each
request by the wrk Lua script. Each wrk thread seeds its generator with
its own index, the same in every run and against either server: both
servers get the same sequence of requests (each with its own keys).

At 8 and 64 connections, five rounds (one in a quick run), the two
servers one right after the other in each round, the order alternating
from round to round (off first in the first). on / off is the median of
the rounds' requests per second ratios (each round's ratio is listed);
the other columns are each server's median round, and CPU per request
the median of its rounds' (the server's user and system time from
/proc/PID/stat over the point, all its threads, divided by the requests
wrk counted): the cost a request puts on the server whatever else runs
on the machine, steadier than requests per second on a shared machine.
Target (the limits issue): on / off at least 0.97x at 64 connections.

Every point is `wrk -t2 -cN -dSs --latency --timeout 10s` with the Lua
script; the table gives requests/sec, p50 and p99 latency, CPU time per
request and any socket errors or non-2xx replies over all of a point's
rounds (a point with errors is flagged: its figure is not a valid
measurement). wrk and both servers share the machine's cores; each
server runs its default of one event-loop thread per core.

At the end both servers' /metrics (with the admin token) give
spindle_limit_refusals by limit, spindle_limit_queue and
spindle_upstream_calls: on the on server nothing may have been refused
(requests_per_min, tokens_per_min, max_queued), nothing queued for a
slot of concurrent_exchanges (spindle_limit_queue{kind="queued"}) or for
the upstream (spindle_upstream_calls{state="queued"}); a nonzero count
is flagged, the points then measured refusals or waits, not the checks.
Its spindle_upstream_calls{state="sent"} shows the calls that went
through the fair queue (beside the route's 2xx answers), the off
server's none.

Usage
-----
    python3 bench/bench_limits.py --quick            # ~30 s
    python3 bench/bench_limits.py --json out.json    # full run, ~3 minutes

Options:
    --build-dir DIR   where the spindle executable is (default: build)
    --pin             both servers on the first core, wrk and this script
                      on the second: the same conditions for both
    --quick           3 s per point, one round (the full run: 8 s per
                      point, five rounds)
    --duration S      seconds per point, overriding the above
    --rounds N        rounds per point (default 5, 1 with --quick)
    --json PATH       write the tables as JSON in the benchmark report's
                      format ({"benchmark": "limits", "machine",
                      "tables"}, see bench/make_report.py), with every raw
                      figure and the run's settings beside them under
                      "figures"

Needs wrk (.ci/install-deps installs it). The servers and the Lua scripts
run from a temporary directory that is removed at the end; both servers
are stopped on exit, failure and Ctrl-C. Python 3 standard library only;
shares bench_http.py's servers, wrk runner and parser, and
bench_usage.py's messages.
"""

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import platform
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_http as bh  # noqa: E402  (servers, wrk and its parser, tables)
import bench_usage as bu  # noqa: E402  (the messages' vocabulary)

TENANTS = 100
HOT_TENANT = 0          # half of the requests
THREADS_PER_TENANT = 16  # bench-0 .. bench-15 of each tenant
USERS = 16              # user-0 .. user-15
WORDS_PER_MESSAGE = bu.WORDS_PER_MESSAGE
SEED = 12345            # wrk thread i seeds with SEED + i
CONNECTIONS = (8, 64)
TARGET = 0.97           # on / off, requests per second
TARGET_CONNECTIONS = 64
WARMUP_S = 1            # per server, at 8 connections, before the points
POPULATE_CLIENTS = 32   # concurrent Python connections while populating
ROUTE = "POST /v1/threads/{id}/messages"
# Every limit at the largest value PATCH takes: each check runs, none
# ever refuses or queues.
LIMITS = {"requests_per_min": 1000000000,
          "tokens_per_min": 1000000000000,
          "concurrent_exchanges": 100000,
          "max_queued": 100000}
LLM_CONCURRENCY = 100000  # the largest --llm-concurrency takes
SERVERS = ("off", "on")
NAMES = {"off": "limits off", "on": "limits on"}
SERVER_FLAGS = {"off": [],
                "on": ["--llm-concurrency", str(LLM_CONCURRENCY)]}
# The order of the servers in round r is ORDERS[r % 2].
ORDERS = (("off", "on"), ("on", "off"))
# What the on server's /metrics must show as 0 after the run.
MUST_BE_ZERO = (("spindle_limit_refusals", "limit", "requests_per_min"),
                ("spindle_limit_refusals", "limit", "tokens_per_min"),
                ("spindle_limit_refusals", "limit", "max_queued"),
                ("spindle_limit_queue", "kind", "queued"),
                ("spindle_limit_queue", "kind", "waiting"),
                ("spindle_upstream_calls", "state", "queued"),
                ("spindle_upstream_calls", "state", "waiting"))
SHOWN = MUST_BE_ZERO + (("spindle_upstream_calls", "state", "sent"),)


def fail(msg):
    raise SystemExit("bench_limits: " + msg)


# ---------------------------------------------------------------- servers

def start_spindle(exe, tmp, name, extra, stack):
    """bench_http.start_spindle with more flags: `spindle serve` on a free
    port (--port 0; the address is read from its first line of output), a
    data directory of its own under `tmp`, the offline provider, stopped
    when `stack` unwinds; (Server, URL)."""
    out = os.path.join(tmp, name + ".out")
    err = os.path.join(tmp, name + ".err")
    srv = bh.Server(f"spindle ({name})",
                    [exe, "serve", "--port", "0",
                     "--data", os.path.join(tmp, name),
                     "--llm", "offline", "--log-level", "warn", *extra],
                    out, err, cwd=tmp)
    stack.callback(srv.stop)
    deadline = time.monotonic() + 30
    pattern = re.compile(r"serving on (http://[0-9.]+:(\d+))")
    while time.monotonic() < deadline:
        try:
            with open(out, errors="replace") as f:
                m = pattern.search(f.read())
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
    thread, for populating it concurrently (bench_tenants.py's, with the
    answer's headers)."""

    def __init__(self, url, name):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.name = name
        self.local = threading.local()
        self.lock = threading.Lock()
        self.conns = []

    def request(self, method, path, body=None, token=None):
        """(status, parsed JSON answer or its text, headers). A broken
        connection is not retried: a POST sent twice would create twice."""
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
        got = {k.lower(): v for k, v in r.getheaders()}
        try:
            return r.status, json.loads(text), got
        except ValueError:
            return r.status, text, got

    def expect(self, want, method, path, body=None, token=None):
        """The answer and its headers; anything but `want` ends the run
        with what the server said."""
        status, answer, headers = self.request(method, path, body, token)
        if status != want:
            fail(f"{method} {path} on the {self.name} server answered "
                 f"{status} (expected {want}): {answer}")
        return answer, headers

    def close(self):
        with self.lock:
            for c in self.conns:
                c.close()
            self.conns = []


def setup_messages():
    """The setup message of each tenant's each thread, the same on both
    servers: {(tenant, thread): body}."""
    rng = random.Random(SEED)
    return {(i, k): {"content": bu.setup_message(rng),
                     "user_id": f"user-{k % USERS}"}
            for i in range(TENANTS) for k in range(THREADS_PER_TENANT)}


RATE_HEADERS = {"x-ratelimit-limit-requests":
                str(LIMITS["requests_per_min"]),
                "x-ratelimit-limit-tokens": str(LIMITS["tokens_per_min"])}


def populate(url, name, admin, limited, messages, log):
    """On one server: TENANTS tenants, a key each, with `limited` every
    tenant's LIMITS, then every tenant's threads, each created by one
    message; (keys in the order of the tenants, seconds taken)."""
    c = Client(url, name)
    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(POPULATE_CLIENTS) as ex:
            def run(fn, items):
                return list(ex.map(fn, items))

            ids = run(lambda i: c.expect(
                201, "POST", "/v1/tenants", {"name": f"bench-{i}"},
                admin)[0]["id"], range(TENANTS))
            keys = run(lambda i: c.expect(
                201, "POST", f"/v1/tenants/{ids[i]}/keys", {},
                admin)[0]["key"], range(TENANTS))
            for i, key in enumerate(keys):
                if not re.fullmatch(r"[A-Za-z0-9_.~+/=-]+", key):
                    fail(f"tenant {ids[i]}'s key on the {name} server has "
                         f"characters the Lua script does not expect: "
                         f"{key!r}")
            if limited:
                def patch(i):
                    answer, _ = c.expect(200, "PATCH",
                                         f"/v1/tenants/{ids[i]}",
                                         {"limits": LIMITS}, admin)
                    shown = (answer.get("limits") or {}
                             if isinstance(answer, dict) else {})
                    if any(shown.get(k) != v for k, v in LIMITS.items()):
                        fail(f"PATCH /v1/tenants/{ids[i]} on the {name} "
                             f"server answered limits {shown}, expected "
                             f"{LIMITS}: {answer}")
                run(patch, range(TENANTS))

            def create(p):
                i, k = p
                _, headers = c.expect(
                    200, "POST", f"/v1/threads/bench-{k}/messages",
                    messages[p], keys[i])
                seen = {h: headers.get(h) for h in RATE_HEADERS}
                want = RATE_HEADERS if limited else {h: None
                                                     for h in RATE_HEADERS}
                if seen != want:
                    fail(f"POST /v1/threads/bench-{k}/messages with tenant "
                         f"{ids[i]}'s key on the {name} server answered "
                         f"the rate headers {seen}, expected {want}")
            run(create, sorted(messages))
    finally:
        c.close()
    took = time.monotonic() - started
    log(f"  {name}: {TENANTS} tenants, {TENANTS} keys"
        + (", every tenant's limits" if limited else "")
        + f", {len(messages):,} threads in {took:.1f} s")
    return keys, took


def admin_get(url, path, admin, timeout=10.0):
    req = urllib.request.Request(url + path, headers={
        "Authorization": "Bearer " + admin})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def limit_counts(text):
    """{(metric, label, value): count} of the SHOWN series in /metrics'
    text (None for a series it does not have)."""
    out = {}
    for metric, label, value in SHOWN:
        m = re.search(r'^' + metric + r'\{' + label + r'="' + value
                      + r'"\}\s+([0-9.eE+-]+)$', text, re.M)
        out[(metric, label, value)] = int(float(m.group(1))) if m else None
    return out


def answers_by_status(text):
    """spindle_http_requests_total by "ROUTE STATUS"."""
    out = {}
    # The route label holds braces itself ("POST /v1/threads/{id}/...").
    for labels, value in re.findall(
            r'^spindle_http_requests_total\{(.*)\}\s+([0-9.eE+-]+)$',
            text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{lab.get('route', '?')} {lab.get('status', '?')}"
        out[key] = out.get(key, 0) + int(float(value))
    return out


def route_2xx(answers):
    return sum(n for k, n in answers.items()
               if k.startswith(ROUTE + " ") and re.search(r" 2\d\d$", k))


def server_check(urls, admin, log):
    """Both servers' limit counters and answers, once the route's 2xx
    answers stop moving (the requests in flight when wrk stopped complete
    on the server after it)."""
    def read(name):
        text = admin_get(urls[name], "/metrics", admin)
        return limit_counts(text), answers_by_status(text)

    out = {}
    for name in SERVERS:
        counts, answers = read(name)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.5)
            again, answers_again = read(name)
            if (again == counts
                    and route_2xx(answers_again) == route_2xx(answers)):
                break
            counts, answers = again, answers_again
        else:
            log(f"  the {name} server's counters were still moving "
                f"after 10 s")
        out[name] = {"counts": {f'{m}{{{lab}="{v}"}}': n
                                for (m, lab, v), n in counts.items()},
                     "answers": answers,
                     "route_2xx": route_2xx(answers)}
    on = out["on"]["counts"]
    out["nonzero"] = [k for k in (f'{m}{{{lab}="{v}"}}'
                                  for m, lab, v in MUST_BE_ZERO)
                      if on.get(k) != 0]
    out["sent"] = on.get('spindle_upstream_calls{state="sent"}')
    return out


# ---------------------------------------------------------------- wrk

LUA = """-- POST /v1/threads/bench-K/messages on the {name} server: the
-- tenant {hot} for half of the requests, else one of the other {others}
-- at random, its key as Authorization: Bearer; K one of its {threads}
-- threads, with {{"content": 12 words, "user_id": "user-U"}}, U one of
-- {users} users: tenant, thread, user and words chosen at random per
-- request. Each wrk thread seeds with its own index, the same in every
-- run against either server: both servers get the same sequence of
-- requests, each with its own keys.
local tenants = {tenants}
local hot = {hot}
local threads = {threads}
local users = {users}
local words_per_message = {words_per_message}
local keys = {{
{keys}
}}
local words = {{
{words}
}}
local headers = {{ ["Content-Type"] = "application/json" }}

local wrk_threads = {{}}
function setup(thread)
  thread:set("index", #wrk_threads)
  table.insert(wrk_threads, thread)
end

function init(args)
  math.randomseed({seed} + (index or 0))
end

function request()
  local t = hot
  if math.random(2) == 2 then
    -- one of the others, uniformly
    t = math.random(0, tenants - 2)
    if t >= hot then
      t = t + 1
    end
  end
  local k = math.random(0, threads - 1)
  local u = math.random(0, users - 1)
  local parts = {{}}
  for i = 1, words_per_message do
    if math.random(4) == 1 then
      parts[i] = tostring(math.random(0, 9999))
    else
      parts[i] = words[math.random(#words)]
    end
  end
  headers["Authorization"] = "Bearer " .. keys[t + 1]
  local body = '{{"content":"' .. table.concat(parts, " ")
    .. '","user_id":"user-' .. u .. '"}}'
  return wrk.format("POST", "/v1/threads/bench-" .. k .. "/messages",
                    headers, body)
end
"""


def write_lua(tmp, name, keys):
    """The wrk script of one server, its tenants' keys in their order."""
    for w in bu.VOCABULARY:
        assert re.fullmatch(r"[a-z]+", w), w
    assert len(keys) == TENANTS
    path = os.path.join(tmp, f"limits-{name}.lua")
    with open(path, "w", encoding="utf-8") as f:
        f.write(LUA.format(name=NAMES[name], tenants=TENANTS, hot=HOT_TENANT,
                           others=TENANTS - 1, threads=THREADS_PER_TENANT,
                           users=USERS, words_per_message=WORDS_PER_MESSAGE,
                           seed=SEED,
                           keys="\n".join(f'  "{k}",' for k in keys),
                           words="\n".join(f'  "{w}",'
                                           for w in bu.VOCABULARY)))
    return path


def cpu_seconds(pid):
    """User and system CPU time the process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(url, c, seconds, script, pid):
    """One wrk point, with the server's CPU time per request."""
    before = cpu_seconds(pid)
    r = bh.run_wrk(url, c, seconds, script)
    used = cpu_seconds(pid) - before
    n = r.get("requests") or 0
    r["cpu_us_per_request"] = used * 1e6 / n if n else float("nan")
    return r


def bench(urls, pids, scripts, conns, seconds, rounds, log):
    """`rounds` rounds per connection count, the two servers one right
    after the other in the order ORDERS gives each round. "ratio" is the
    median of the rounds' on / off ratios, "cpu_ratio" of their CPU per
    request on / off; each server's figures are its median round's, its
    CPU per request the median of its rounds'."""
    points = []
    for c in conns:
        p = bh.paired_point(
            c, rounds, ORDERS,
            lambda name: measured(urls[name], c, seconds, scripts[name],
                                  pids[name]),
            "on", "off")
        log(f"  c={c}: off {p['off']['requests_per_sec']:,.0f}/s, "
            f"on {p['on']['requests_per_sec']:,.0f}/s; on/off rounds "
            + " ".join(f"{x:.2f}x" for x in p["round_ratios"])
            + f", median {p['ratio']:.2f}x; CPU per request off "
            f"{p['cpu_us']['off']:.0f} us, on {p['cpu_us']['on']:.0f} us")
        points.append(p)
    return points


# ---------------------------------------------------------------- tables

def has_target(p):
    return p["connections"] == TARGET_CONNECTIONS


def met(p):
    return p["ratio"] >= TARGET


def rounds_text(ratios, x=""):
    return " ".join(f"{v:.2f}{x}" for v in ratios)


def errors_text(p):
    bad = [f"{name} {p['errors'][name]}" for name in SERVERS
           if p["errors"][name]]
    return "**" + ", ".join(bad) + " (invalid)**" if bad else "0"


def bad_points(points):
    return [f"{p['connections']} connections ({NAMES[name]}: "
            f"{p['errors'][name]})"
            for p in points for name in SERVERS if p["errors"][name]]


def limits_table(points):
    rows = []
    for p in points:
        off, on = p["off"], p["on"]
        rows.append([p["connections"], f"{off['requests_per_sec']:,.0f}",
                     f"{on['requests_per_sec']:,.0f}", f"{p['ratio']:.2f}x",
                     rounds_text(p["round_ratios"]),
                     ("yes" if met(p) else "**no**") if has_target(p)
                     else "-",
                     bh.lat(off, "p50"), bh.lat(on, "p50"),
                     bh.lat(off, "p99"), bh.lat(on, "p99"),
                     f"{p['cpu_us']['off']:.0f} µs",
                     f"{p['cpu_us']['on']:.0f} µs",
                     f"{p['cpu_ratio']:.2f}x", errors_text(p)])
    return bh.table(["connections", "off req/s", "on req/s", "on/off",
                     "rounds", f"≥ {TARGET}x", "off p50", "on p50",
                     "off p99", "on p99", "off CPU/req", "on CPU/req",
                     "CPU on/off", "errors"], rows)


def check_rows(check):
    rows = []
    for metric, label, value in SHOWN:
        key = f'{metric}{{{label}="{value}"}}'
        on = check["on"]["counts"].get(key)
        off = check["off"]["counts"].get(key)
        must = (metric, label, value) in MUST_BE_ZERO
        verdict = ("-" if not must
                   else "yes" if on == 0 else "**NO**")
        rows.append([key, "-" if on is None else on,
                     "-" if off is None else off, verdict])
    rows.append([f"{ROUTE} 2xx answers (spindle_http_requests_total)",
                 check["on"]["route_2xx"], check["off"]["route_2xx"], "-"])
    return rows


def check_lines(check):
    lines = []
    if check["nonzero"]:
        lines.append("**NOT 0 on the on server**: "
                     + ", ".join(f"{k} = {check['on']['counts'].get(k)}"
                                 for k in check["nonzero"])
                     + ": calls were refused or waited, so the points "
                       "measured more than the checks.")
    else:
        lines.append("Nothing refused or queued on the on server.")
    sent, answered = check["sent"], check["on"]["route_2xx"]
    if not sent:
        lines.append("**spindle_upstream_calls{state=\"sent\"} is "
                     f"{sent} on the on server**: no call went through the "
                     "upstream's fair queue.")
    else:
        lines.append(f"{sent:,} calls went through the on server's "
                     f"upstream fair queue, beside {answered:,} 2xx answers "
                     f"to {ROUTE}.")
    return lines


def report_table(points, seconds, rounds):
    rows = []
    for p in points:
        off, on = p["off"], p["on"]
        rows.append([p["connections"], round(off["requests_per_sec"]),
                     round(on["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     rounds_text(p["round_ratios"], "x"),
                     ("yes" if met(p) else "no") if has_target(p) else "-",
                     bh.ms_cell(off, "p50"), bh.ms_cell(on, "p50"),
                     bh.ms_cell(off, "p99"), bh.ms_cell(on, "p99"),
                     round(p["cpu_us"]["off"]), round(p["cpu_us"]["on"]),
                     f"{p['cpu_ratio']:.2f}x",
                     sum(p["errors"].values())])
    notes = [
        f"Two servers of the same build, each with `--admin-token`, "
        f"{TENANTS} tenants and a key each, {THREADS_PER_TENANT} threads "
        f"per tenant created by one message each before the first point; "
        f"durable (a data directory, the default --sync full), offline "
        f"provider. off: no limits; on: every tenant's limits "
        f"(`PATCH /v1/tenants/{{id}}` {json.dumps({'limits': LIMITS})}) "
        f"and `--llm-concurrency {LLM_CONCURRENCY}`: every check of the "
        f"limiter and of the upstream's fair queue runs, none refuses or "
        f"queues.",
        f"Each request POSTs with a tenant's key: the hot tenant for half "
        f"of the requests, else one of the other {TENANTS - 1} at random; "
        f"a random one of its {THREADS_PER_TENANT} threads, a random "
        f"user_id of {USERS} and {WORDS_PER_MESSAGE} random words, the "
        f"same sequence against both servers. "
        f"`wrk -t2 -cN -d{seconds}s --latency --timeout 10s` against each "
        f"server in turn, after a warm-up of each, in {rounds} round(s) "
        f"whose order of the servers alternates; on / off and CPU on / off "
        f"are the medians of the rounds' ratios, the other columns each "
        f"server's median round (CPU per request: the median of its "
        f"rounds', the server's user and system time over the requests wrk "
        f"counted).",
        "errors: socket errors and non-2xx replies of both servers over "
        "all of the point's rounds.",
    ]
    bad = bad_points(points)
    if bad:
        notes.append("Points with socket errors or non-2xx replies, not "
                     "valid measurements: " + ", ".join(bad) + ".")
    notes.append(f"Target: on / off at least {TARGET}x at "
                 f"{TARGET_CONNECTIONS} connections.")
    return {
        "title": "POST /v1/threads/{id}/messages with every tenant's limits "
                 "(on) beside none (off), 100 tenants and a hot one, "
                 "keep-alive connections",
        "columns": ["connections", "off req/s", "on req/s", "on / off",
                    "rounds", f"target met (≥ {TARGET}x)", "off p50 ms",
                    "on p50 ms", "off p99 ms", "on p99 ms",
                    "off CPU µs per request", "on CPU µs per request",
                    "CPU on / off", "errors"],
        "rows": rows,
        "notes": notes,
    }


def check_report_table(check):
    return {
        "title": "Refusals and waits of the limits-on server (/metrics) "
                 "after the run",
        "columns": ["series", "on", "off", "0 on the on server"],
        "rows": check_rows(check),
        "notes": [" ".join(line.replace("**", "")
                           for line in check_lines(check))],
    }


def report_document(result, seconds, rounds):
    tables = [report_table(result["points"], seconds, rounds)]
    if "check" in result:
        tables.append(check_report_table(result["check"]))
    return {"benchmark": "limits", "machine": bh.machine(), "tables": tables,
            "figures": result}


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(
        description="What per-tenant limits cost on POST /v1/threads/{id}/"
                    "messages, with wrk (see the module docstring).")
    ap.add_argument("--build-dir", default="build",
                    help="directory holding the spindle executable "
                         "(default: build)")
    ap.add_argument("--quick", action="store_true",
                    help="3 s per point, one round")
    ap.add_argument("--duration", type=int, metavar="S",
                    help="seconds per point (default: 3 with --quick, else 8)")
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
    if args.pin and not shutil.which("taskset"):
        fail("--pin needs taskset (util-linux)")
    seconds = args.duration or (3 if args.quick else 8)
    if seconds < 1:
        fail("--duration must be at least 1")
    if args.rounds is not None and args.rounds < 1:
        fail("--rounds must be at least 1")
    rounds = args.rounds or (1 if args.quick else 5)
    conns = list(CONNECTIONS)
    bh.raise_fd_limit()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C does, so both servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    result = {
        "settings": {
            "quick": args.quick, "seconds_per_point": seconds,
            "rounds": rounds, "connections": conns,
            "warmup_s": WARMUP_S, "tenants": TENANTS,
            "hot_tenant": HOT_TENANT, "hot_share": 0.5,
            "threads_per_tenant": THREADS_PER_TENANT, "users": USERS,
            "words_per_message": WORDS_PER_MESSAGE,
            "vocabulary": len(bu.VOCABULARY), "seed": SEED,
            "limits": LIMITS,
            "server_flags": {name: ["--port", "0", "--llm", "offline",
                                    "--log-level", "warn", "--admin-token",
                                    "ADMIN", *SERVER_FLAGS[name]]
                             for name in SERVERS},
            "executable": exe,
            "target": {"on_over_off": TARGET,
                       "at_connections": TARGET_CONNECTIONS},
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)},
        "versions": {k: v for k, v in bh.versions(exe).items()
                     if k != "nginx"},
    }
    admin = "adm_" + secrets.token_urlsafe(30)

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench_limits-"))
        log(f"bench_limits: {seconds} s per point, {rounds} round(s), "
            f"temp dir {tmp}")
        urls, pids = {}, {}
        for name in SERVERS:
            srv, urls[name] = start_spindle(
                exe, tmp, name, ["--admin-token", admin, *SERVER_FLAGS[name]],
                stack)
            pids[name] = srv.proc.pid
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
        log(f"  limits off at {urls['off']}, limits on at {urls['on']}")
        messages = setup_messages()
        scripts, result["populate_seconds"] = {}, {}
        for name in SERVERS:
            keys, result["populate_seconds"][name] = populate(
                urls[name], name, admin, name == "on", messages, log)
            scripts[name] = write_lua(tmp, name, keys)
        # Warm each up (connections, allocators, caches).
        result["warmup"] = {name: bh.run_wrk(urls[name], 8, WARMUP_S,
                                             scripts[name])
                            for name in SERVERS}
        result["points"] = bench(urls, pids, scripts, conns, seconds, rounds,
                                 log)
        result["check"] = server_check(urls, admin, log)

    points = result["points"]
    check = result["check"]
    cpus = os.cpu_count()
    print(f"\n## Every tenant's limits beside none, POST "
          f"/v1/threads/{{id}}/messages (wrk, {seconds} s per point, "
          f"{rounds} round(s), {cpus} CPUs shared by client and servers)\n")
    v = result["versions"]
    print(f"{v['spindle']} ({exe}); {v['wrk']}\n")
    print(f"Both with --admin-token, {TENANTS} tenants with a key each, "
          f"{THREADS_PER_TENANT} threads per tenant; durable, offline "
          f"provider. on: every tenant's limits "
          f"{json.dumps(LIMITS)} and --llm-concurrency {LLM_CONCURRENCY}; "
          f"off: none. Each request with a tenant's key (the hot tenant "
          f"for half, else one of the other {TENANTS - 1}), a random one "
          f"of its threads, a random user_id of {USERS} and "
          f"{WORDS_PER_MESSAGE} random words, the same sequence against "
          f"both.\n")
    print(limits_table(points))
    print(f"\non/off and CPU on/off: the medians of {rounds} round(s)' "
          f"ratios (the rounds listed), the order of the servers "
          f"alternating from round to round; the other columns each "
          f"server's median round; CPU/req: the server's user and system "
          f"time per request, the median of its rounds.")
    target = [p for p in points if has_target(p)]
    print()
    for p in target:
        print(f"on / off at {TARGET_CONNECTIONS} connections ≥ {TARGET}: "
              + ("met" if met(p) else "NOT met")
              + f" ({p['ratio']:.2f}x"
              + (", invalid: errors" if any(p["errors"].values()) else "")
              + ")")
    print("\n### /metrics after the run\n")
    print(bh.table(["series", "on", "off", "0 on the on server"],
                   check_rows(check)))
    print()
    for line in check_lines(check):
        print(line)
    print()
    bad = bad_points(points)
    if bad:
        print("Points with socket errors or non-2xx replies (not valid "
              "measurements): " + ", ".join(bad))
        for name in SERVERS:
            odd = {k: n for k, n in check[name]["answers"].items()
                   if not re.search(r" 2\d\d$", k)}
            if odd:
                print(f"  {NAMES[name]} server's answers other than 2xx: "
                      + ", ".join(f"{k}: {n}"
                                  for k, n in sorted(odd.items())))
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report_document(result, seconds, rounds), f, indent=2,
                      ensure_ascii=False)
            f.write("\n")
        log(f"bench_limits: figures written to {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("bench_limits: interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
