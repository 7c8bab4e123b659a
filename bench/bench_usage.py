#!/usr/bin/env python3
"""What recording usage costs on POST /v1/threads/{id}/messages.

What it measures
----------------
Every exchange records what it spent (docs/usage.md): besides its
assistant turn, one UPSERT into the `usage_counters` table, in the same
transaction. This compares the spindle of this build ("current") with
the binary of commit ca4395d, the last one before that work
("baseline", built by `bench/build-baseline --commit ca4395d
build-baseline-usage`), under the same load, in the same run.

Two `spindle serve` servers, each with a data directory of its own in a
temporary directory (the durable default settings: --sync full, group
commit), the offline provider (instant replies), --log-level warn, on
free ports. Before the first measured point each gets the same 64
threads, bench-0 .. bench-63, each created by one message, and one
warm-up second of the load.

The load, the shape users give it: POST /v1/threads/bench-K/messages
with a JSON body {"content": ..., "user_id": "user-U"}, the thread K (of
64), the user U (of 16) and the content (12 words drawn from a small
vocabulary, about one in four a random number) chosen at random for each
request by the wrk Lua script. Each wrk thread seeds its generator with
its own index, the same in every run and against either server: both
servers get the same sequence of requests. Each request is a whole
exchange: user turn stored, offline reply generated, assistant turn
stored (with, on the current server, its usage and the counter row's
UPSERT), exchange handed to long-term memory. Sixteen users over 64
threads make up to 1,024 counter rows an hour.

At 8 and 64 connections, five rounds (one in a quick run), the two
servers one right after the other in each, the order alternating from
round to round (baseline first in the first). current / baseline is the
median of the rounds' requests per second ratios (each round's ratio is
listed); the other columns are each server's median round, and CPU per
request the median of its rounds' (the server's user and system time
from /proc/PID/stat over the point, all its threads, divided by the
requests wrk counted): the cost a request puts on the server whatever
else runs on the machine, steadier than requests per second on a shared
machine. There is no target: the figures are the counters' cost for
docs/usage.md.

Every point is `wrk -t2 -cN -dSs --latency --timeout 10s` with the Lua
script; the table gives requests/sec, p50 and p99 latency, CPU time per
request and any socket errors or non-2xx replies over all of a point's
rounds (a point with errors is flagged: its figure is not a valid
measurement). wrk and both servers share the machine's cores; each
server runs its default of one event-loop thread per core.

At the end GET /v1/usage on the current server (tenancy off, so no
token) gives the exchanges it counted, checked against the 2xx POSTs wrk
reported on it (warm-up and measured points) plus the 64 setup
messages. A mismatch is flagged, not fatal: a request in flight when a
wrk run stops (at most one per connection) is completed by the server
without wrk counting it, so the server's own count of its 2xx answers to
the route (/metrics) and of the exchanges whose usage it recorded are
printed beside it.

Usage
-----
    bench/build-baseline --commit ca4395d build-baseline-usage
    python3 bench/bench_usage.py \
        --baseline-exe build-baseline-usage/spindle --quick   # ~30 s
    python3 bench/bench_usage.py \
        --baseline-exe build-baseline-usage/spindle --json out.json
                                                    # full run, ~3 minutes

Options:
    --baseline-exe EXE  the spindle of commit ca4395d, before usage was
                        recorded (required; bench/build-baseline prints
                        its path)
    --build-dir DIR     where the current spindle executable is (default:
                        build)
    --pin               both servers on the first core, wrk and this script
                        on the second: the same conditions for both
    --quick             3 s per point, one round (the full run: 8 s per
                        point, five rounds)
    --duration S        seconds per point, overriding the above
    --rounds N          rounds per point (default 5, 1 with --quick)
    --json PATH         write the tables as JSON in the benchmark report's
                        format ({"benchmark": "usage", "machine",
                        "tables"}, see bench/make_report.py), with every
                        raw figure and the run's settings beside them under
                        "figures"

Needs wrk (.ci/install-deps installs it). The servers and the Lua script
run from a temporary directory that is removed at the end; both servers
are stopped on exit, failure and Ctrl-C. Python 3 standard library only;
the rounds of a point are bench_http.py's (`paired_point`), the rest is
its own.
"""

import argparse
import contextlib
import http.client
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_http as bh  # noqa: E402  (the rounds of a point)

BASELINE_COMMIT = "ca4395d"   # the last commit before usage was recorded
BASELINE_DIR = "build-baseline-usage"
BUILD_BASELINE = (f"bench/build-baseline --commit {BASELINE_COMMIT} "
                  f"{BASELINE_DIR}")
THREADS = 64            # bench-0 .. bench-63
USERS = 16              # user-0 .. user-15
WORDS_PER_MESSAGE = 12
SEED = 12345            # wrk thread i seeds with SEED + i
CONNECTIONS = (8, 64)
WARMUP_S = 1            # per server, at 8 connections, before the points
STOP_GRACE = 10.0       # seconds between SIGTERM and SIGKILL
ROUTE = "POST /v1/threads/{id}/messages"
SERVERS = ("baseline", "current")
NAMES = {"baseline": f"baseline ({BASELINE_COMMIT})", "current": "current"}
# The order of the servers in round r is ORDERS[r % 2].
ORDERS = (("baseline", "current"), ("current", "baseline"))
NO_TARGET = "no target: the usage counters' cost on POST, for docs/usage.md"

# What the messages are made of: plain lowercase words (no JSON escaping
# needed in the Lua script), about one word in four replaced by a number.
VOCABULARY = (
    "please", "help", "me", "with", "the", "order", "invoice", "refund",
    "account", "password", "delivery", "tomorrow", "why", "how", "what",
    "when", "can", "you", "explain", "summarise", "this", "report", "for",
    "my", "team", "meeting", "at", "pm", "budget", "project", "deadline",
    "thanks",
)


def fail(msg):
    raise SystemExit("bench_usage: " + msg)


def raise_fd_limit():
    """In a child, before exec: open files up to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ---------------------------------------------------------------- servers

class Server:
    """A child process in a session of its own, stopped with SIGTERM and,
    after STOP_GRACE seconds, SIGKILL to its whole process group."""

    def __init__(self, name, argv, stdout, stderr, cwd=None):
        self.name = name
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                cwd=cwd, start_new_session=True, preexec_fn=raise_fd_limit)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            print(f"bench_usage: {self.name} did not stop within "
                  f"{STOP_GRACE:.0f} s of SIGTERM; killing it",
                  file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def start_spindle(exe, tmp, name, stack):
    """`spindle serve` on a free port (--port 0; the address is read from
    its first line of output), a data directory of its own under `tmp`,
    the offline provider, stopped when `stack` unwinds; (Server, URL)."""
    out = os.path.join(tmp, name + ".out")
    err = os.path.join(tmp, name + ".err")
    srv = Server(f"spindle ({name})",
                 [exe, "serve", "--port", "0",
                  "--data", os.path.join(tmp, name),
                  "--llm", "offline", "--log-level", "warn"],
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
            status, _ = http_get(url + "/healthz")
            if status != 200:
                fail(f"spindle ({name}) answered {status} on /healthz")
            return srv, url
        if not srv.alive():
            fail(f"spindle ({name}) exited with {srv.proc.returncode}:\n"
                 + tail(out) + tail(err))
        time.sleep(0.05)
    fail(f"spindle ({name}) printed no address in 30 s:\n"
         + tail(out) + tail(err))


def setup_message(rng):
    """A message like the Lua script's: 12 words of VOCABULARY, about one
    in four a number."""
    return " ".join(str(rng.randint(0, 9999)) if rng.randint(1, 4) == 1
                    else rng.choice(VOCABULARY)
                    for _ in range(WORDS_PER_MESSAGE))


def create_threads(url, name):
    """bench-0 .. bench-63, each created by one message (user-(K mod 16)),
    over one keep-alive connection; the same messages on both servers."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    rng = random.Random(SEED)
    try:
        for k in range(THREADS):
            body = json.dumps({"content": setup_message(rng),
                               "user_id": f"user-{k % USERS}"})
            path = f"/v1/threads/bench-{k}/messages"
            try:
                conn.request("POST", path, body=body,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                text = r.read().decode("utf-8", "replace")
            except (http.client.HTTPException, OSError) as e:
                fail(f"POST {path} on the {name} server: {e!r}")
            if r.status != 200:
                fail(f"POST {path} on the {name} server answered "
                     f"{r.status} (expected 200): {text[:500]}")
    finally:
        conn.close()


def get_json(url, path, timeout=10.0):
    """(status, parsed JSON answer or its text, or None on no answer)."""
    try:
        with urllib.request.urlopen(url + path, timeout=timeout) as r:
            status, text = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return None, repr(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def server_counts(url):
    """From /metrics (no token: tenancy off): spindle_http_requests_total
    by "ROUTE STATUS", and spindle_usage_exchanges_total over its sources
    (None when the server has no such series)."""
    try:
        _, text = http_get(url + "/metrics", timeout=10)
    except (urllib.error.URLError, OSError):
        return {}, None
    answers = {}
    # The route label holds braces itself ("POST /v1/threads/{id}/...").
    for labels, value in re.findall(
            r'^spindle_http_requests_total\{(.*)\}\s+([0-9.eE+-]+)$',
            text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{lab.get('route', '?')} {lab.get('status', '?')}"
        answers[key] = answers.get(key, 0) + int(float(value))
    recorded = None
    for value in re.findall(
            r'^spindle_usage_exchanges_total\{[^}]*\}\s+([0-9.eE+-]+)$',
            text, re.M):
        recorded = (recorded or 0) + int(float(value))
    return answers, recorded


def route_2xx(answers):
    """The route's 2xx answers, None when /metrics has none of its series."""
    mine = [n for k, n in answers.items() if k.startswith(ROUTE + " ")]
    if not mine:
        return None
    return sum(n for k, n in answers.items()
               if k.startswith(ROUTE + " ") and re.search(r" 2\d\d$", k))


def settled_counts(url, log):
    """server_counts once the route's 2xx answers stop moving (the last
    requests in flight when wrk stopped complete on the server after it)."""
    answers, recorded = server_counts(url)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again, recorded_again = server_counts(url)
        if (route_2xx(again) == route_2xx(answers)
                and recorded_again == recorded):
            return again, recorded_again
        answers, recorded = again, recorded_again
    log("  the current server's answers were still moving after 10 s")
    return answers, recorded


def usage_check(url, wrk_2xx, in_flight, log):
    """GET /v1/usage on the current server beside wrk's 2xx POSTs plus the
    setup messages."""
    answers, recorded = settled_counts(url, log)
    status, body = get_json(url, "/v1/usage")
    check = {"wrk_2xx": wrk_2xx, "setup_messages": THREADS,
             "expected": wrk_2xx + THREADS,
             "in_flight_at_most": in_flight,
             "server_2xx": route_2xx(answers),
             "server_recorded": recorded,
             "status": status, "exchanges": None}
    try:
        check["exchanges"] = int(body["data"][0]["exchanges"])
    except (TypeError, KeyError, IndexError, ValueError):
        check["answer"] = body if isinstance(body, str) else json.dumps(body)
    check["match"] = check["exchanges"] == check["expected"]
    return check


# ---------------------------------------------------------------- wrk

LUA = """-- POST /v1/threads/bench-K/messages, K one of {threads} threads, with
-- {{"content": 12 words, "user_id": "user-U"}}, U one of {users} users:
-- thread, user and words chosen at random per request. Each wrk thread
-- seeds with its own index, the same in every run against either server:
-- both servers get the same sequence of requests.
local threads = {threads}
local users = {users}
local words_per_message = {words_per_message}
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
  local body = '{{"content":"' .. table.concat(parts, " ")
    .. '","user_id":"user-' .. u .. '"}}'
  return wrk.format("POST", "/v1/threads/bench-" .. k .. "/messages",
                    headers, body)
end
"""


def write_lua(tmp):
    for w in VOCABULARY:
        assert re.fullmatch(r"[a-z]+", w), w
    path = os.path.join(tmp, "usage.lua")
    with open(path, "w", encoding="utf-8") as f:
        f.write(LUA.format(threads=THREADS, users=USERS,
                           words_per_message=WORDS_PER_MESSAGE, seed=SEED,
                           words="\n".join(f'  "{w}",' for w in VOCABULARY)))
    return path


UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def to_ms(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unparsed time {text!r}")
    return float(m.group(1)) * UNITS_MS[m.group(2)]


def parse_wrk(out):
    r = {}
    m = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    if not m:
        raise ValueError("no Requests/sec in wrk's output:\n" + out)
    r["requests_per_sec"] = float(m.group(1))
    m = re.search(r"(\d+) requests in ([0-9.]+\w+), ([0-9.]+\w+) read", out)
    if m:
        r["requests"] = int(m.group(1))
        r["duration_s"] = to_ms(m.group(2)) / 1e3
        r["read"] = m.group(3)
    lat = {}
    m = re.search(r"Latency\s+([0-9.]+\w+)\s+([0-9.]+\w+)\s+([0-9.]+\w+)", out)
    if m:
        lat["avg"], lat["stdev"], lat["max"] = (to_ms(g) for g in m.groups())
    for p, v in re.findall(r"^\s+(\d+)%\s+([0-9.]+\w+)\s*$", out, re.M):
        lat["p" + p] = to_ms(v)
    r["latency_ms"] = lat
    errors = {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                  r"timeout (\d+)", out)
    if m:
        errors = dict(zip(errors, map(int, m.groups())))
    r["socket_errors"] = errors
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    r["non_2xx"] = int(m.group(1)) if m else 0
    r["errors"] = sum(errors.values()) + r["non_2xx"]
    # Every response wrk counted that was not an error status.
    r["ok"] = max(0, r.get("requests", 0) - r["non_2xx"])
    return r


def run_wrk(url, connections, seconds, script):
    threads = min(2, connections)
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
            "--latency", "--timeout", "10s", "-s", script, url]
    p = subprocess.run(argv, capture_output=True, text=True,
                       preexec_fn=raise_fd_limit, timeout=seconds + 60)
    if p.returncode != 0:
        fail(f"{' '.join(argv)} exited with {p.returncode}:\n"
             + p.stdout + p.stderr)
    r = parse_wrk(p.stdout)
    r["command"] = " ".join(argv[:-1] + ["URL"])
    return r


def cpu_seconds(pid):
    """User and system CPU time the process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(url, c, seconds, script, pid):
    """One wrk point, with the server's CPU time per request."""
    before = cpu_seconds(pid)
    r = run_wrk(url, c, seconds, script)
    used = cpu_seconds(pid) - before
    n = r.get("requests") or 0
    r["cpu_us_per_request"] = used * 1e6 / n if n else float("nan")
    return r


def bench(urls, pids, script, conns, seconds, rounds, log, tally):
    """`rounds` rounds per connection count, the two servers one right
    after the other in the order ORDERS gives each round. "ratio" is the
    median of the rounds' current / baseline ratios, "cpu_ratio" of their
    CPU per request current / baseline; each server's figures are its
    median round's, its CPU per request the median of its rounds'.
    `tally` counts each server's 2xx replies and connections."""
    points = []
    for c in conns:
        def measure(name):
            got = measured(urls[name], c, seconds, script, pids[name])
            tally[name]["ok"] += got["ok"]
            tally[name]["connections"] += c
            return got

        p = bh.paired_point(c, rounds, ORDERS, measure, "current",
                            "baseline")
        log(f"  c={c}: baseline {p['baseline']['requests_per_sec']:,.0f}/s, "
            f"current {p['current']['requests_per_sec']:,.0f}/s; "
            f"current/baseline rounds "
            + " ".join(f"{x:.2f}x" for x in p["round_ratios"])
            + f", median {p['ratio']:.2f}x; CPU per request baseline "
            f"{p['cpu_us']['baseline']:.0f} us, current "
            f"{p['cpu_us']['current']:.0f} us")
        points.append(p)
    return points


# ---------------------------------------------------------------- tables

def fmt_rps(r):
    return f"{r['requests_per_sec']:,.0f}"


def fmt_ms(v):
    if v is None:
        return "-"
    if v < 1:
        return f"{v * 1000:.0f} µs"
    if v < 100:
        return f"{v:.2f} ms"
    return f"{v:.0f} ms"


def lat(r, p):
    return fmt_ms(r["latency_ms"].get(p))


def ms_cell(r, p):
    """A latency percentile in milliseconds, as the C++ tables write them
    (to the microsecond below 10 ms, fewer decimals above)."""
    v = r["latency_ms"].get(p)
    if v is None:
        return "-"
    return f"{v:.{3 if v < 10 else 2 if v < 100 else 1}f}"


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "---:|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def rounds_text(ratios, x=""):
    return " ".join(f"{v:.2f}{x}" for v in ratios)


def errors_text(p):
    bad = [f"{NAMES[name]} {p['errors'][name]}" for name in SERVERS
           if p["errors"][name]]
    return "**" + ", ".join(bad) + " (invalid)**" if bad else "0"


def bad_points(points):
    return [f"{p['connections']} connections ({NAMES[name]}: "
            f"{p['errors'][name]})"
            for p in points for name in SERVERS if p["errors"][name]]


def usage_table(points):
    rows = []
    for p in points:
        b, cur = p["baseline"], p["current"]
        rows.append([p["connections"], fmt_rps(b), fmt_rps(cur),
                     f"{p['ratio']:.2f}x", rounds_text(p["round_ratios"]),
                     lat(b, "p50"), lat(cur, "p50"),
                     lat(b, "p99"), lat(cur, "p99"),
                     f"{p['cpu_us']['baseline']:.0f} µs",
                     f"{p['cpu_us']['current']:.0f} µs",
                     f"{p['cpu_ratio']:.2f}x", errors_text(p)])
    return table(["connections", "baseline req/s", "current req/s",
                  "current/baseline", "rounds", "baseline p50",
                  "current p50", "baseline p99", "current p99",
                  "baseline CPU/req", "current CPU/req",
                  "CPU current/baseline", "errors"], rows)


def check_lines(check):
    """What the check of GET /v1/usage says, in lines of text."""
    if check["exchanges"] is None:
        return [f"GET /v1/usage answered {check['status']}: "
                f"{str(check.get('answer'))[:300]}",
                "**Not checked** (no total of exchanges in the answer)."]
    lines = [f"GET /v1/usage, total exchanges: {check['exchanges']:,}",
             f"2xx POSTs wrk reported (warm-up and measured points) + "
             f"{check['setup_messages']} setup messages: "
             f"{check['wrk_2xx']:,} + {check['setup_messages']} = "
             f"{check['expected']:,}"]
    if check["match"]:
        lines.append("They match.")
        return lines
    diff = check["exchanges"] - check["expected"]
    within = 0 <= diff <= check["in_flight_at_most"]
    lines.append(
        f"**MISMATCH**: GET /v1/usage counts {diff:+,} against wrk's 2xx "
        f"+ {check['setup_messages']}; at most "
        f"{check['in_flight_at_most']:,} requests were in flight when the "
        f"wrk runs against the current server stopped (one per "
        f"connection), which the server completes without wrk counting "
        f"them: the difference is "
        + ("within that." if within else "**not** within that."))
    server = check["server_2xx"]
    if server is not None:
        lines.append(
            f"The server's own 2xx answers to {ROUTE} (/metrics): "
            f"{server:,}; GET /v1/usage's exchanges "
            + ("equal them." if server == check["exchanges"]
               else f"differ by {check['exchanges'] - server:+,}."))
    if check["server_recorded"] is not None:
        lines.append(f"spindle_usage_exchanges_total (/metrics): "
                     f"{check['server_recorded']:,}.")
    return lines


def report_table(points, seconds, rounds):
    rows = []
    for p in points:
        b, cur = p["baseline"], p["current"]
        rows.append([p["connections"], round(b["requests_per_sec"]),
                     round(cur["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     rounds_text(p["round_ratios"], "x"),
                     ms_cell(b, "p50"), ms_cell(cur, "p50"),
                     ms_cell(b, "p99"), ms_cell(cur, "p99"),
                     round(p["cpu_us"]["baseline"]),
                     round(p["cpu_us"]["current"]),
                     f"{p['cpu_ratio']:.2f}x",
                     sum(p["errors"].values())])
    notes = [
        f"current: this build, which adds one UPSERT into usage_counters "
        f"to each exchange's transaction (docs/usage.md); baseline: commit "
        f"{BASELINE_COMMIT}, the last before it (`{BUILD_BASELINE}`). "
        f"Each a durable server of its own (a data directory, the default "
        f"--sync full), offline provider, {THREADS} threads created by one "
        f"message each before the first point.",
        f"Each request POSTs a random one of the {THREADS} threads with a "
        f"random user_id of {USERS} and {WORDS_PER_MESSAGE} random words "
        f"(a vocabulary of {len(VOCABULARY)} words, one in four a number), "
        f"the same sequence against both servers. "
        f"`wrk -t2 -cN -d{seconds}s --latency --timeout 10s` against each "
        f"server in turn, after a warm-up of each, in {rounds} round(s) "
        f"whose order of the servers alternates; current / baseline and "
        f"CPU current / baseline are the medians of the rounds' ratios, "
        f"the other columns each server's median round (CPU per request: "
        f"the median of its rounds', the server's user and system time "
        f"over the requests wrk counted).",
        "errors: socket errors and non-2xx replies of both servers over "
        "all of the point's rounds.",
    ]
    bad = bad_points(points)
    if bad:
        notes.append("Points with socket errors or non-2xx replies, not "
                     "valid measurements: " + ", ".join(bad) + ".")
    notes.append(NO_TARGET[0].upper() + NO_TARGET[1:] + ".")
    return {
        "title": "POST /v1/threads/{id}/messages with usage recorded "
                 "(current) beside the build before it (baseline), "
                 "keep-alive connections",
        "columns": ["connections", "baseline req/s", "current req/s",
                    "current / baseline", "rounds", "baseline p50 ms",
                    "current p50 ms", "baseline p99 ms", "current p99 ms",
                    "baseline CPU µs per request",
                    "current CPU µs per request",
                    "CPU current / baseline", "errors"],
        "rows": rows,
        "notes": notes,
    }


def check_report_table(check):
    return {
        "title": "Exchanges counted by GET /v1/usage on the current server "
                 "beside the POSTs answered",
        "columns": ["GET /v1/usage exchanges", "wrk 2xx + setup",
                    "match", "server's 2xx answers (/metrics)",
                    "in flight at wrk's stops, at most"],
        "rows": [[check["exchanges"] if check["exchanges"] is not None
                  else "-", check["expected"],
                  "yes" if check["match"] else "no",
                  check["server_2xx"] if check["server_2xx"] is not None
                  else "-", check["in_flight_at_most"]]],
        "notes": [" ".join(line.replace("**", "")
                           for line in check_lines(check))],
    }


def report_document(result, seconds, rounds):
    tables = [report_table(result["points"], seconds, rounds)]
    if "usage_check" in result:
        tables.append(check_report_table(result["usage_check"]))
    return {"benchmark": "usage", "machine": machine(), "tables": tables,
            "figures": result}


def machine():
    """This machine as the C++ benchmarks describe it (bench/report.cpp):
    CPU model, cores, memory in GiB, kernel."""
    m = {}
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    m["cpu"] = line.split(":", 1)[1].strip()
                    break
    m["cores"] = os.cpu_count()
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    m["memory_gib"] = int(line.split()[1]) / 1024.0 / 1024.0
                    break
    u = os.uname()
    m["kernel"] = f"{u.sysname} {u.release}"
    return m


def versions(exes):
    def first_line(argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True,
                               timeout=10)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return None
    out = {name: first_line([exe, "--version"]) for name, exe in exes.items()}
    out["wrk"] = first_line(["wrk", "-v"])
    return out


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(
        description="What recording usage costs on POST /v1/threads/{id}/"
                    "messages:\nthis build beside the commit before it, "
                    "with wrk (see the module docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Build the baseline first (it prints the executable's "
               f"path):\n  {BUILD_BASELINE}\n  python3 bench/bench_usage.py "
               f"--baseline-exe {BASELINE_DIR}/spindle")
    ap.add_argument("--baseline-exe", metavar="PATH",
                    help=f"the spindle of commit {BASELINE_COMMIT}, before "
                         f"usage was recorded (required; built by "
                         f"`{BUILD_BASELINE}`)")
    ap.add_argument("--build-dir", default="build",
                    help="directory holding the current spindle executable "
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

    if not args.baseline_exe:
        fail(f"--baseline-exe is required: build the spindle of commit "
             f"{BASELINE_COMMIT} with `{BUILD_BASELINE}` and pass "
             f"--baseline-exe {BASELINE_DIR}/spindle")
    baseline = os.path.abspath(args.baseline_exe)
    if not (os.path.isfile(baseline) and os.access(baseline, os.X_OK)):
        fail(f"--baseline-exe {baseline} is not an executable: build it "
             f"with `{BUILD_BASELINE}` (it prints the executable's path)")
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
    raise_fd_limit()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C does, so both servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    exes = {"baseline": baseline, "current": exe}
    result = {
        "settings": {
            "quick": args.quick, "seconds_per_point": seconds,
            "rounds": rounds, "connections": conns,
            "warmup_s": WARMUP_S, "threads": THREADS, "users": USERS,
            "words_per_message": WORDS_PER_MESSAGE,
            "vocabulary": len(VOCABULARY), "seed": SEED,
            "baseline_commit": BASELINE_COMMIT,
            "build_baseline": BUILD_BASELINE,
            "executables": exes,
            "server_flags": ["--port", "0", "--llm", "offline",
                             "--log-level", "warn"],
            "target": None,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)},
        "versions": versions(exes),
    }

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench_usage-"))
        log(f"bench_usage: {seconds} s per point, {rounds} round(s), "
            f"temp dir {tmp}")
        urls, pids = {}, {}
        for name in SERVERS:
            srv, urls[name] = start_spindle(exes[name], tmp, name, stack)
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
        log(f"  baseline ({BASELINE_COMMIT}) at {urls['baseline']}, "
            f"current at {urls['current']}")
        # The baseline has no GET /v1/usage: an answer there means it is
        # not the build before usage was recorded.
        status, _ = get_json(urls["baseline"], "/v1/usage")
        result["baseline_usage_route"] = status
        if status == 200:
            log(f"  warning: the baseline answers GET /v1/usage: is "
                f"{baseline} the spindle of commit {BASELINE_COMMIT}?")
        started = time.monotonic()
        for name in SERVERS:
            create_threads(urls[name], name)
        log(f"  {THREADS} threads on each server in "
            f"{time.monotonic() - started:.1f} s")
        script = write_lua(tmp)
        tally = {name: {"ok": 0, "connections": 0} for name in SERVERS}
        # Warm each up (connections, allocators, caches).
        result["warmup"] = {}
        for name in SERVERS:
            w = run_wrk(urls[name], 8, WARMUP_S, script)
            result["warmup"][name] = w
            tally[name]["ok"] += w["ok"]
            tally[name]["connections"] += 8
        result["points"] = bench(urls, pids, script, conns, seconds, rounds,
                                 log, tally)
        result["usage_check"] = usage_check(
            urls["current"], tally["current"]["ok"],
            tally["current"]["connections"], log)
        result["answers"] = {name: server_counts(urls[name])[0]
                             for name in SERVERS}

    points = result["points"]
    check = result["usage_check"]
    cpus = os.cpu_count()
    print(f"\n## Usage recorded beside the build before it, POST "
          f"/v1/threads/{{id}}/messages (wrk, {seconds} s per point, "
          f"{rounds} round(s), {cpus} CPUs shared by client and servers)\n")
    v = result["versions"]
    print(f"baseline: {v['baseline']} (commit {BASELINE_COMMIT}, "
          f"{baseline}); current: {v['current']} ({exe}); {v['wrk']}\n")
    print(f"Each a durable server (a data directory, the default --sync "
          f"full), offline provider; {THREADS} threads, a random one per "
          f"request, with a random user_id of {USERS} and "
          f"{WORDS_PER_MESSAGE} random words, the same sequence against "
          f"both. current adds one UPSERT into usage_counters to each "
          f"exchange's transaction.\n")
    print(usage_table(points))
    print(f"\ncurrent/baseline and CPU current/baseline: the medians of "
          f"{rounds} round(s)' ratios (the rounds listed), the order of the "
          f"servers alternating from round to round; the other columns "
          f"each server's median round; CPU/req: the server's user and "
          f"system time per request, the median of its rounds.")
    print(f"\nSummary: {NO_TARGET}.")
    for p in points:
        print(f"  {p['connections']} connections: current/baseline "
              f"{p['ratio']:.2f}x, CPU per request "
              f"{p['cpu_us']['baseline']:.0f} -> "
              f"{p['cpu_us']['current']:.0f} µs "
              f"({p['cpu_ratio']:.2f}x)"
              + (" [invalid: errors]" if any(p["errors"].values()) else ""))
    print("\n### GET /v1/usage on the current server\n")
    for line in check_lines(check):
        print(line)
    print()
    bad = bad_points(points)
    if bad:
        print("Points with socket errors or non-2xx replies (not valid "
              "measurements): " + ", ".join(bad))
        for name, counts in result["answers"].items():
            odd = {k: n for k, n in counts.items()
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
        log(f"bench_usage: figures written to {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("bench_usage: interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
