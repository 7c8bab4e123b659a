#!/usr/bin/env python3
"""spindle's HTTP throughput beside nginx, measured with wrk.

What it measures
----------------
1. GET /healthz on a throwaway nginx and on `spindle serve --data :memory:`,
   at each connection count one right after the other in the same run. nginx
   answers the same 33-byte body spindle does
   (`{"status":"ok","version":"0.1.0"}`, application/json) from a
   `return 200` in its config, with no file, log or upstream behind it: the
   fastest an event-loop HTTP/1.1 server on this machine answers a tiny
   request. The table gives spindle / nginx for requests per second; the
   target is at least 0.9x at 8 and 64 connections. Each connection count
   is measured in five rounds (one in a quick run), the two servers one
   right after the other, the order alternating from round to round; the
   ratio is the median of the rounds' ratios (on this shared machine one
   8 s figure of the same nginx varied from 110k to 190k requests/s, and
   at 8 connections one round's ratio from 0.46x to 1.57x, depending on
   how the kernel placed the servers' and wrk's threads on the two cores).

2. POST /v1/threads/{id}/messages with the offline provider (instant
   replies, no delay): each request stores a user turn, generates a reply,
   stores the assistant turn and hands the exchange to long-term memory.
   Requests are spread over 64 thread IDs (bench-0 .. bench-63, created by
   one message each before the first measured point) and carry varied
   message texts. Two servers are measured at each connection count:
   durable (a data directory in a temporary directory, the default
   settings: --sync full, group commit) and --data :memory:. The table puts
   durable beside :memory: (the cost of durability) and gives the durable
   store's writes per commit over the point (from /metrics), which shows how
   well group commit batches.

5. POST /v1/chat/completions with a thread (OpenAI's format, the same
   texts and thread IDs, offline provider) beside POST /v1/threads/{id}/
   messages on the durable server, at 8 and 64 connections: three rounds
   each, the two routes one right after the other in alternating order,
   the ratio the rounds' median. Target: at least 0.9x.

Every point is `wrk -t2 -cN -dSs --latency --timeout 10s` (-t1 at one
connection); the tables give requests/sec, latency percentiles and any
socket errors or non-2xx replies (a point with errors is flagged: its
figure is not a valid measurement). wrk, nginx and spindle share the
machine's cores; nginx runs `worker_processes auto` and spindle its default
of one event-loop thread per core, so both get the same CPUs.

3. With --baseline-exe, POST messages also against the server spindle had
   before its event loops (a thread per connection; bench/build-baseline
   builds it from commit 2619959), durable, right after the durable point:
   the "before" columns. Target: at least 5x at 64 connections.

4. With --full-store, POST messages at 64 connections on a data directory
   filled by spindle_populate (1M turns over 10,000 threads, 100k memory
   entries in the scopes of the measured threads, texts of a Zipf-drawn
   vocabulary) beside an empty data directory. Target: at least 0.8x.

Usage
-----
    python3 bench/bench_http.py --quick            # ~30 seconds
    python3 bench/bench_http.py --json out.json    # full run, ~3 minutes
    bench/build-baseline && python3 bench/bench_http.py --only messages \
        --baseline-exe build-baseline/spindle --full-store

Options:
    --build-dir DIR   where the spindle executable is (default: build)
    --quick           2 s per point; /healthz at 8 and 64 connections,
                      messages at 8 and 64 (the full run: 8 s per point,
                      both at 1, 8, 64 and 512 connections)
    --duration S      seconds per point, overriding the above
    --rounds N        /healthz rounds per connection count (default 5, 1
                      with --quick)
    --only WHAT       healthz, messages or chat: run one part only
    --json PATH       write the tables as JSON in the benchmark report's
                      format ({"benchmark": "http", "machine", "tables"},
                      see bench/make_report.py), with every raw figure and
                      the run's settings beside them under "figures"

Needs /usr/sbin/nginx and wrk (Debian packages nginx-light and wrk;
.ci/install-deps installs both). nginx runs from a config written into a
temporary directory (its pid file, error log and temp paths are there too,
access log off), on a free loopback port, as the current user (workers run
as root when started by root); the script stops nginx and both spindle
servers on exit, failure and Ctrl-C, and removes the temporary directory.

Python 3 standard library only.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

NGINX = "/usr/sbin/nginx"
HEALTH_BODY = '{"status":"ok","version":"0.1.0"}'
THREADS = 64            # thread IDs the message requests are spread over
TARGET = 0.9            # spindle/nginx on GET /healthz, at 8 and 64 connections
TARGET_CONNECTIONS = (8, 64)
STOP_GRACE = 10.0       # seconds between SIGTERM and SIGKILL
SPEEDUP_TARGET = 5.0    # messages/s over the thread-per-connection server, at 64
STORE_TARGET = 0.8      # messages/s on a full store over an empty one, at 64
CHAT_TARGET = 0.9       # chat completions/s over messages/s, same threads
CHAT_ROUNDS = 3
BASELINE_COMMIT = "2619959"  # the last commit with the thread-per-connection server

# What people send to an assistant: short and long, questions and
# instructions, some with quotes and non-ASCII letters.
MESSAGES = [
    "Hi! Can you help me plan a three-day trip to Lisbon in early May?",
    "What's the difference between a mutex and a semaphore?",
    "Summarise the following in two sentences: the quarterly report shows "
    "revenue up 12% year over year, driven mostly by the new subscription "
    "tier, while support costs rose 4% after the migration to the new "
    "ticketing system.",
    "Thanks, that works.",
    "Rewrite this more politely: \"Send me the files by tomorrow or the "
    "deal is off.\"",
    "How do I undo the last git commit but keep the changes in my working "
    "tree?",
    "Translate to French: the meeting has been moved to Thursday at 3 pm.",
    "Which is healthier for breakfast, oatmeal or granola?",
    "Explain why my Python loop `for i in range(len(xs)): xs.pop(i)` skips "
    "elements.",
    "Give me five name ideas for a bakery that specialises in sourdough.",
    "ok",
    "Can you draft a short email to my landlord saying the heating has been "
    "broken since Monday and asking when someone can come and look at it?",
    "What time zone is Auckland in, and how many hours ahead of London is "
    "it in July?",
    "Convert 72 degrees Fahrenheit to Celsius.",
    "Write a haiku about a cat watching rain.",
    "Was ist der Unterschied zwischen \"seit\" und \"seitdem\"? Grüße!",
    "My sourdough starter smells like nail polish remover. Is it dead?",
    "List the planets in order from the sun, with one fact about each.",
    "How many tablespoons are in a cup?",
    "I have a job interview for a backend role on Friday. What questions "
    "should I expect about databases, and how should I prepare in the "
    "next three evenings?",
    "Is it safe to run `rm -rf node_modules` and reinstall?",
    "Could you recommend a few novels like 'Le Petit Prince' for a "
    "ten-year-old?",
    "What does HTTP status 429 mean and how should a client react to it?",
]


def fail(msg):
    raise SystemExit("bench_http: " + msg)


def raise_fd_limit():
    """In a child, before exec: open files up to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def http_post(url, body, timeout=10.0):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ---------------------------------------------------------------- processes

class Server:
    """A child process in a session of its own, stopped with SIGTERM and,
    after STOP_GRACE seconds, SIGKILL to its whole process group."""

    def __init__(self, name, argv, stdout, stderr, cwd=None):
        self.name = name
        self.log = stderr
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
            print(f"bench_http: {self.name} did not stop within "
                  f"{STOP_GRACE:.0f} s of SIGTERM; killing it", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def nginx_modules_without():
    """The modules this nginx was built without (fastcgi, uwsgi, scgi: a
    temp path directive for a missing module is a config error)."""
    r = subprocess.run([NGINX, "-V"], capture_output=True, text=True)
    return set(re.findall(r"--without-http_(\w+)_module", r.stderr + r.stdout))


def nginx_conf(tmp, port):
    without = nginx_modules_without()
    temp = [("client_body_temp_path", "body"), ("proxy_temp_path", "proxy")]
    for module, directive in (("fastcgi", "fastcgi_temp_path"),
                              ("uwsgi", "uwsgi_temp_path"),
                              ("scgi", "scgi_temp_path")):
        if module not in without:
            temp.append((directive, module))
    temp_lines = "\n".join(f"    {d} {os.path.join(tmp, sub)};"
                           for d, sub in temp)
    # Workers switch to `user` only when the master runs as root; the temp
    # directory is private to its owner, so they stay root then.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""# Throwaway nginx for bench/bench_http.py.
{user}daemon off;
master_process on;
worker_processes auto;
worker_rlimit_nofile 20000;
pid {os.path.join(tmp, "nginx.pid")};
error_log {os.path.join(tmp, "nginx-error.log")} warn;

events {{
    worker_connections 8192;
}}

http {{
    access_log off;
    server_tokens off;
    keepalive_timeout 60s;
    keepalive_requests 100000000;
{temp_lines}

    server {{
        listen 127.0.0.1:{port};
        location = /healthz {{
            default_type application/json;
            return 200 '{HEALTH_BODY}';
        }}
    }}
}}
"""


def start_nginx(tmp, stack):
    if not os.access(NGINX, os.X_OK):
        fail(f"{NGINX} not found: install nginx-light (.ci/install-deps)")
    for attempt in range(5):
        port = free_port()
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(nginx_conf(tmp, port))
        srv = Server("nginx",
                     [NGINX, "-p", tmp, "-c", conf,
                      "-e", os.path.join(tmp, "nginx-error.log")],
                     os.path.join(tmp, "nginx.out"),
                     os.path.join(tmp, "nginx.err"))
        stack.callback(srv.stop)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and srv.alive():
            try:
                status, body = http_get(url + "/healthz", timeout=1)
                if status == 200 and body == HEALTH_BODY:
                    return srv, url
                fail(f"nginx answered {status} {body!r} on /healthz")
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        srv.stop()
        log = tail(os.path.join(tmp, "nginx-error.log")) + \
            tail(os.path.join(tmp, "nginx.err"))
        if "Address already in use" in log and attempt < 4:
            continue
        fail("nginx did not start; its error log:\n" + log)
    fail("nginx found no free port")


def start_spindle(exe, tmp, name, data, stack):
    out = os.path.join(tmp, name + ".out")
    err = os.path.join(tmp, name + ".err")
    srv = Server(f"spindle ({name})",
                 [exe, "serve", "--port", "0", "--data", data,
                  "--log-level", "warn"], out, err, cwd=tmp)
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
            status, body = http_get(url + "/healthz")
            if status != 200:
                fail(f"spindle ({name}) answered {status} on /healthz")
            return srv, url, body
        if not srv.alive():
            fail(f"spindle ({name}) exited with {srv.proc.returncode}:\n"
                 + tail(out) + tail(err))
        time.sleep(0.05)
    fail(f"spindle ({name}) printed no address in 30 s:\n"
         + tail(out) + tail(err))


# ---------------------------------------------------------------- wrk

# What every request script shares: the headers, and a counter that starts
# at its own place in the sequence in each wrk thread.
LUA_PREAMBLE = """local headers = { ["Content-Type"] = "application/json" }
local counter = 0

local threads = {}
function setup(thread)
  thread:set("offset", #threads * 7919)
  table.insert(threads, thread)
end

function init(args)
  counter = offset or 0
end
"""

MESSAGES_LUA = """-- POST /v1/threads/bench-K/messages, K over {threads} thread IDs,
-- bodies taken in turn from {count} message texts.
local items = {{
{items}
}}
{preamble}
function request()
  local path = "/v1/threads/bench-" .. (counter % {threads}) .. "/messages"
  local body = items[(counter % #items) + 1]
  counter = counter + 1
  return wrk.format("POST", path, headers, body)
end
"""

CHAT_LUA = """-- POST /v1/chat/completions in OpenAI's format with a thread_id,
-- K over {threads} thread IDs, texts taken in turn from {count} messages.
local items = {{
{items}
}}
{preamble}
function request()
  local body = '{{"model":"bench","thread_id":"bench-' .. (counter % {threads})
    .. '","messages":[{{"role":"user","content":' .. items[(counter % #items) + 1]
    .. '}}]}}'
  counter = counter + 1
  return wrk.format("POST", "/v1/chat/completions", headers, body)
end
"""


def write_lua(tmp, name, template, items):
    """A wrk script from `template`, with `items` (JSON texts) as a Lua
    table of long strings."""
    lines = []
    for item in items:
        assert "]==]" not in item
        lines.append(f"  [==[{item}]==],")
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(template.format(threads=THREADS, count=len(MESSAGES),
                                items="\n".join(lines),
                                preamble=LUA_PREAMBLE))
    return path


def write_messages_lua(tmp):
    return write_lua(tmp, "messages.lua", MESSAGES_LUA,
                     [json.dumps({"content": t}, ensure_ascii=False)
                      for t in MESSAGES])


def write_chat_lua(tmp):
    return write_lua(tmp, "chat.lua", CHAT_LUA,
                     [json.dumps(t, ensure_ascii=False) for t in MESSAGES])


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
    return r


def run_wrk(url, connections, seconds, script=None):
    threads = min(2, connections)
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
            "--latency", "--timeout", "10s"]
    if script:
        argv += ["-s", script]
    argv.append(url)
    p = subprocess.run(argv, capture_output=True, text=True,
                       preexec_fn=raise_fd_limit, timeout=seconds + 60)
    if p.returncode != 0:
        fail(f"{' '.join(argv)} exited with {p.returncode}:\n"
             + p.stdout + p.stderr)
    r = parse_wrk(p.stdout)
    r["command"] = " ".join(argv[:-1] + ["URL"])
    return r


def metrics(url):
    """spindle's counters that matter here, from /metrics."""
    _, text = http_get(url + "/metrics", timeout=10)
    want = ("spindle_storage_commits", "spindle_storage_writes",
            "spindle_turns_stored_total")
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if m and m.group(1) in want:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


# ---------------------------------------------------------------- tables

def fmt_rps(r):
    s = f"{r['requests_per_sec']:,.0f}"
    return s + (f" ({r['errors']} errors)" if r["errors"] else "")


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


def paired_point(c, rounds, orders, measure, test, base):
    """One connection count `c` of two servers measured one right after
    the other in each of `rounds` rounds, in the order `orders` gives each
    round (alternating); `measure(name)` measures one server and returns
    its wrk figures with "cpu_us_per_request". "ratio" is the median of
    the rounds' `test` / `base` requests per second, "cpu_ratio" of their
    CPU per request; each server's figures are its median round's, its
    CPU per request the median of its rounds', its errors the sum over
    every round (bench_usage.py, bench_limits.py)."""
    def ratio(a, b):
        return a / b if b else float("nan")

    names = (base, test)
    runs = []
    for r in range(rounds):
        order = orders[r % len(orders)]
        got = {name: measure(name) for name in order}
        got["order"] = list(order)
        got["ratio"] = ratio(got[test]["requests_per_sec"],
                             got[base]["requests_per_sec"])
        got["cpu_ratio"] = ratio(got[test]["cpu_us_per_request"],
                                 got[base]["cpu_us_per_request"])
        runs.append(got)

    def median_run(name):
        by = sorted(runs, key=lambda g: g[name]["requests_per_sec"])
        return by[len(by) // 2][name]

    return {"connections": c,
            base: median_run(base),
            test: median_run(test),
            "ratio": statistics.median(g["ratio"] for g in runs),
            "round_ratios": [g["ratio"] for g in runs],
            "cpu_ratio": statistics.median(g["cpu_ratio"] for g in runs),
            "round_cpu_ratios": [g["cpu_ratio"] for g in runs],
            "orders": [g["order"] for g in runs],
            "cpu_us": {name: statistics.median(
                g[name]["cpu_us_per_request"] for g in runs)
                for name in names},
            "errors": {name: sum(g[name]["errors"] for g in runs)
                       for name in names},
            "rounds": [{name: {k: g[name][k] for k in
                               ("requests_per_sec", "requests",
                                "cpu_us_per_request", "errors",
                                "latency_ms") if k in g[name]}
                        for name in names} for g in runs]}


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "---:|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def healthz_table(points):
    rows = []
    for p in points:
        n, s = p["nginx"], p["spindle"]
        verdict = ""
        if p["connections"] in TARGET_CONNECTIONS:
            verdict = "yes" if p["ratio"] >= TARGET else "**no**"
        rows.append([p["connections"], fmt_rps(s), fmt_rps(n),
                     f"{p['ratio']:.2f}x", verdict,
                     lat(s, "p50"), lat(n, "p50"),
                     lat(s, "p99"), lat(n, "p99")])
    return table(["connections", "spindle req/s", "nginx req/s",
                  "spindle/nginx", f"≥ {TARGET}x",
                  "spindle p50", "nginx p50", "spindle p99", "nginx p99"],
                 rows)


def messages_table(points):
    rows = []
    with_base = any("baseline" in p for p in points)
    for p in points:
        d, m = p["durable"], p["memory"]
        wpc = p.get("writes_per_commit")
        row = [p["connections"], fmt_rps(d), fmt_rps(m),
               f"{p['ratio']:.2f}x",
               lat(d, "p50"), lat(m, "p50"),
               lat(d, "p99"), lat(m, "p99"),
               f"{wpc:.1f}" if wpc else "-"]
        if with_base:
            b = p.get("baseline")
            row += [fmt_rps(b) if b else "-", lat(b, "p99") if b else "-",
                    f"{p['speedup']:.2f}x" if b else "-"]
        rows.append(row)
    headers = ["connections", "durable req/s", ":memory: req/s",
               "durable/:memory:", "durable p50", ":memory: p50",
               "durable p99", ":memory: p99", "writes/commit"]
    if with_base:
        headers += ["before req/s", "before p99", "durable/before"]
    return table(headers, rows)


def store_table(points):
    rows = []
    for p in points:
        e, f = p["empty"], p["full"]
        rows.append([p["connections"], fmt_rps(e), fmt_rps(f),
                     f"{p['ratio']:.2f}x", lat(e, "p50"), lat(f, "p50"),
                     lat(e, "p99"), lat(f, "p99")])
    return table(["connections", "empty req/s", "full req/s", "full/empty",
                  "empty p50", "full p50", "empty p99", "full p99"], rows)


# ------------------------------------------------- the report's JSON format

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


def ms_cell(r, p):
    """A latency percentile in milliseconds, as the C++ tables write them
    (to the microsecond below 10 ms, fewer decimals above)."""
    v = r["latency_ms"].get(p)
    if v is None:
        return "-"
    return f"{v:.{3 if v < 10 else 2 if v < 100 else 1}f}"


def short_versions(v):
    """'nginx/1.22.1', 'wrk debian/4.1.0-3+b2' from their -v lines."""
    nginx = re.sub(r"^nginx version:\s*", "", v.get("nginx") or "nginx")
    wrk = re.sub(r"\s*\[.*$", "", v.get("wrk") or "wrk")
    return nginx, wrk


def errors_note(points, parts):
    bad = []
    for p in points:
        for key, name in parts:
            if p[key]["errors"]:
                bad.append(f"{p['connections']} connections ({name}: "
                           f"{p[key]['errors']})")
    if not bad:
        return []
    return ["Points with socket errors or non-2xx replies, not valid "
            "measurements: " + ", ".join(bad) + "."]


def healthz_report_table(points, seconds, versions_):
    nginx, wrk = short_versions(versions_)
    rows = []
    for p in points:
        n, s = p["nginx"], p["spindle"]
        target = "-"
        if p["connections"] in TARGET_CONNECTIONS:
            target = "yes" if p["ratio"] >= TARGET else "no"
        rows.append([p["connections"], round(s["requests_per_sec"]),
                     round(n["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     target, ms_cell(s, "p50"), ms_cell(n, "p50"),
                     ms_cell(s, "p99"), ms_cell(n, "p99"),
                     s["errors"] + n["errors"]])
    return {
        "title": "GET /healthz: spindle serve --data :memory: beside nginx "
                 "answering the same body, keep-alive connections",
        "columns": ["connections", "spindle req/s", "nginx req/s",
                    "spindle / nginx", f"target met (≥ {TARGET}x)",
                    "spindle p50 ms", "nginx p50 ms", "spindle p99 ms",
                    "nginx p99 ms", "errors"],
        "rows": rows,
        "notes": [
            f"{wrk} (`wrk -t2 -cN -d{seconds}s --latency --timeout 10s`, "
            f"-t1 at one connection) against each server in turn at every "
            f"connection count, after a warm-up of both, in "
            f"{len(points[0].get('round_ratios', [1])) if points else 1} "
            f"round(s) whose order of the servers alternates; spindle / "
            f"nginx is the median of the rounds' ratios (all of them under "
            f"figures), the other columns each server's median round. "
            f"nginx ({nginx}, "
            f"`worker_processes auto`, access log off) answers the same "
            f"33-byte JSON body as spindle from a `return 200` in its "
            f"config, with no file, log or upstream behind it: the fastest "
            f"an event-loop HTTP/1.1 server on this machine answers a tiny "
            f"request. spindle runs its default of one event-loop thread "
            f"per core; wrk and both servers share the machine's cores.",
            "errors: socket errors and non-2xx replies of both servers "
            "over the point.",
            *errors_note(points, (("spindle", "spindle"),
                                  ("nginx", "nginx"))),
            f"Target: spindle / nginx at least {TARGET}x at "
            f"{' and '.join(map(str, TARGET_CONNECTIONS))} connections.",
        ],
    }


def messages_report_table(points, seconds):
    rows = []
    for p in points:
        d, m = p["durable"], p["memory"]
        wpc = p.get("writes_per_commit")
        b = p.get("baseline")
        rows.append([p["connections"], round(d["requests_per_sec"]),
                     round(m["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     ms_cell(d, "p50"), ms_cell(m, "p50"),
                     ms_cell(d, "p99"), ms_cell(m, "p99"),
                     f"{wpc:.1f}" if wpc else "-",
                     round(b["requests_per_sec"]) if b else "-",
                     f"{p['speedup']:.2f}x" if b else "-",
                     d["errors"] + m["errors"] + (b["errors"] if b else 0)])
    return {
        "title": "POST /v1/threads/{id}/messages (offline provider): "
                 "spindle serve durable beside --data :memory:, keep-alive "
                 "connections",
        "columns": ["connections", "durable req/s", ":memory: req/s",
                    "durable / :memory:", "durable p50 ms",
                    ":memory: p50 ms", "durable p99 ms", ":memory: p99 ms",
                    "writes per commit", "before req/s", "durable / before",
                    "errors"],
        "rows": rows,
        "notes": [
            f"Each request is a whole exchange: user turn stored, offline "
            f"reply generated (no delay), assistant turn stored, exchange "
            f"handed to long-term memory. Requests go to {THREADS} thread "
            f"IDs, each created by one message before the first point, "
            f"with {len(MESSAGES)} message texts taken in turn; every point "
            f"is `wrk -cN -d{seconds}s` against each server in turn.",
            "durable: a data directory with the default settings (--sync "
            "full, group commit); :memory: is the server of the /healthz "
            "table. durable / :memory: is the cost of durability. writes "
            "per commit: the state store's writes per transaction over the "
            "durable point (from /metrics), how well group commit batches.",
            "before: the thread-per-connection server spindle had before "
            f"its event loops (commit {BASELINE_COMMIT}, built by "
            "bench/build-baseline), durable with the same settings, "
            "measured at each point right after the durable server; "
            f"target: durable / before ≥ {SPEEDUP_TARGET:g}x at 64 "
            "connections ('-': not measured in this run).",
            "errors: socket errors and non-2xx replies of every server "
            "over the point.",
            *errors_note(points, (("durable", "durable"),
                                  ("memory", ":memory:"))),
        ],
    }


def store_report_table(points, seconds, populated):
    rows = []
    for p in points:
        e, f = p["empty"], p["full"]
        rows.append([p["connections"], round(e["requests_per_sec"]),
                     round(f["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     ms_cell(e, "p99"), ms_cell(f, "p99"),
                     e["errors"] + f["errors"]])
    return {
        "title": "POST /v1/threads/{id}/messages (offline provider, "
                 "durable): a store of 1M turns and 100k memories beside an "
                 "empty one",
        "columns": ["connections", "empty req/s", "full req/s",
                    "full / empty", "empty p99 ms", "full p99 ms", "errors"],
        "rows": rows,
        "notes": [
            f"full: a data directory filled by spindle_populate before the "
            f"run ({populated.get('turns', '?')} turns over "
            f"{populated.get('threads', '?')} threads, "
            f"{populated.get('memories', '?')} memory entries in the scopes "
            f"of the {THREADS} measured threads; texts drawn with a Zipf "
            f"law from common English words and 30,000 generated ones); "
            f"empty: a new data directory. Same load as the table above, "
            f"`wrk -cN -d{seconds}s`, each server in turn, the full one "
            f"first.",
            f"Target: full / empty ≥ {STORE_TARGET:g}x.",
        ],
    }


def report_document(result, seconds):
    """{"benchmark", "machine", "tables"} as bench/make_report.py reads
    it, with every raw figure under "figures"."""
    tables = []
    if "healthz" in result:
        tables.append(healthz_report_table(result["healthz"], seconds,
                                           result["versions"]))
    if "messages" in result:
        tables.append(messages_report_table(result["messages"], seconds))
    if "store" in result:
        tables.append(store_report_table(result["store"], seconds,
                                         result.get("populated", {})))
    if "chat" in result:
        tables.append(chat_report_table(result["chat"], seconds))
    return {"benchmark": "http", "machine": machine(), "tables": tables,
            "figures": result}


# ---------------------------------------------------------------- main

def bench_healthz(nginx_url, spindle_url, conns, seconds, rounds, log):
    """Each connection count is measured in `rounds` rounds, the two
    servers one right after the other in each, the order alternating
    (nginx first in even rounds): the machine's load drifts over seconds,
    and a server measured always second would always meet the drift
    later. The point's ratio is the median of the rounds' ratios; each
    server's figures are those of its median round."""
    points = []
    # Warm both up (connections, allocators, caches) before measuring.
    for url in (nginx_url, spindle_url):
        run_wrk(url + "/healthz", conns[-1], 1)
    for c in conns:
        runs = []
        for r in range(rounds):
            order = (("nginx", nginx_url), ("spindle", spindle_url))
            if r % 2:
                order = order[::-1]
            got = {name: run_wrk(url + "/healthz", c, seconds)
                   for name, url in order}
            got["ratio"] = (got["spindle"]["requests_per_sec"]
                            / got["nginx"]["requests_per_sec"])
            runs.append(got)

        def median_run(name):
            by = sorted(runs, key=lambda g: g[name]["requests_per_sec"])
            return by[len(by) // 2][name]

        p = {"connections": c, "nginx": median_run("nginx"),
             "spindle": median_run("spindle"),
             "ratio": statistics.median(g["ratio"] for g in runs),
             "round_ratios": [g["ratio"] for g in runs]}
        log(f"  healthz c={c}: spindle {p['spindle']['requests_per_sec']:,.0f}/s, "
            f"nginx {p['nginx']['requests_per_sec']:,.0f}/s, rounds "
            + " ".join(f"{x:.2f}x" for x in p["round_ratios"])
            + f", median {p['ratio']:.2f}x")
        points.append(p)
    return points


def warm_threads(url, lua, conns):
    # One message per thread first: no measured request creates one.
    for k in range(THREADS):
        status, _ = http_post(f"{url}/v1/threads/bench-{k}/messages",
                              {"content": MESSAGES[k % len(MESSAGES)]})
        if status != 200:
            fail(f"POST messages answered {status} at {url}")
    run_wrk(url, min(8, conns), 1, lua)   # warm-up


def bench_messages(durable_url, memory_url, lua, conns, seconds, log,
                   baseline_url=None):
    for url in (durable_url, memory_url, baseline_url):
        if url:
            warm_threads(url, lua, conns[-1])
    points = []
    for c in conns:
        before = metrics(durable_url)
        d = run_wrk(durable_url, c, seconds, lua)
        after = metrics(durable_url)
        m = run_wrk(memory_url, c, seconds, lua)
        p = {"connections": c, "durable": d, "memory": m,
             "ratio": d["requests_per_sec"] / m["requests_per_sec"]}
        commits = after.get("spindle_storage_commits", 0) - \
            before.get("spindle_storage_commits", 0)
        writes = after.get("spindle_storage_writes", 0) - \
            before.get("spindle_storage_writes", 0)
        p["durable_commits"] = commits
        p["durable_writes"] = writes
        p["writes_per_commit"] = writes / commits if commits else None
        if baseline_url:
            b = run_wrk(baseline_url, c, seconds, lua)
            p["baseline"] = b
            p["speedup"] = d["requests_per_sec"] / b["requests_per_sec"]
            log(f"  messages c={c}: before {b['requests_per_sec']:,.0f}/s, "
                f"durable/before {p['speedup']:.2f}x")
        log(f"  messages c={c}: durable {d['requests_per_sec']:,.0f}/s, "
            f":memory: {m['requests_per_sec']:,.0f}/s, {p['ratio']:.2f}x")
        points.append(p)
    return points


def bench_chat(url, messages_lua, chat_lua, conns, seconds, rounds, log):
    # The threads exist already (bench_messages warmed them); one short
    # warm-up of the chat route.
    run_wrk(url, min(8, conns[-1]), 1, chat_lua)
    points = []
    for c in conns:
        runs = []
        for i in range(rounds):
            order = ("messages", "chat") if i % 2 == 0 else ("chat", "messages")
            r = {}
            for part in order:
                r[part] = run_wrk(url, c, seconds,
                                  messages_lua if part == "messages"
                                  else chat_lua)
            r["ratio"] = r["chat"]["requests_per_sec"] / \
                r["messages"]["requests_per_sec"]
            runs.append(r)
        runs.sort(key=lambda r: r["ratio"])
        median = runs[len(runs) // 2]
        p = {"connections": c, "messages": median["messages"],
             "chat": median["chat"], "ratio": median["ratio"],
             "rounds": [r["ratio"] for r in runs]}
        log(f"  chat c={c}: chat {p['chat']['requests_per_sec']:,.0f}/s, "
            f"messages {p['messages']['requests_per_sec']:,.0f}/s, rounds "
            + " ".join(f"{x:.2f}x" for x in p["rounds"])
            + f", median {p['ratio']:.2f}x")
        points.append(p)
    return points


def chat_table(points):
    rows = []
    for p in points:
        m, ch = p["messages"], p["chat"]
        rows.append([p["connections"], fmt_rps(m), fmt_rps(ch),
                     f"{p['ratio']:.2f}x",
                     " ".join(f"{x:.2f}" for x in p["rounds"]),
                     "yes" if p["ratio"] >= CHAT_TARGET else "**no**",
                     lat(m, "p99"), lat(ch, "p99")])
    return table(["connections", "messages req/s", "chat req/s",
                  "chat/messages", "rounds", f"≥ {CHAT_TARGET}x",
                  "messages p99", "chat p99"], rows)


def chat_report_table(points, seconds):
    rows = []
    for p in points:
        m, ch = p["messages"], p["chat"]
        rows.append([p["connections"], round(m["requests_per_sec"]),
                     round(ch["requests_per_sec"]), f"{p['ratio']:.2f}x",
                     " ".join(f"{x:.2f}x" for x in p["rounds"]),
                     ms_cell(m, "p99"), ms_cell(ch, "p99"),
                     m["errors"] + ch["errors"]])
    return {
        "title": "POST /v1/chat/completions with a thread beside POST "
                 "/v1/threads/{id}/messages (offline provider, durable)",
        "columns": ["connections", "messages req/s", "chat req/s",
                    "chat / messages", "rounds", "messages p99 ms",
                    "chat p99 ms", "errors"],
        "rows": rows,
        "notes": [
            f"The same message texts on the same {THREADS} threads of one "
            f"durable server, each request one exchange (both turns "
            f"stored); the chat route in OpenAI's format with a thread_id "
            f"field. {len(points[0]['rounds']) if points else 0} rounds of "
            f"`wrk -cN -d{seconds}s` per "
            f"route at each connection count, the routes' order "
            f"alternating; the figures are the median round's.",
            f"Target: chat / messages ≥ {CHAT_TARGET:g}x.",
        ],
    }


def bench_store(empty_url, full_url, lua, conns, seconds, log):
    for url in (empty_url, full_url):
        warm_threads(url, lua, conns[-1])
    points = []
    for c in conns:
        f = run_wrk(full_url, c, seconds, lua)
        e = run_wrk(empty_url, c, seconds, lua)
        p = {"connections": c, "empty": e, "full": f,
             "ratio": f["requests_per_sec"] / e["requests_per_sec"]}
        log(f"  store c={c}: full {f['requests_per_sec']:,.0f}/s, empty "
            f"{e['requests_per_sec']:,.0f}/s, {p['ratio']:.2f}x")
        points.append(p)
    return points


def populate(build_dir, data, log):
    exe = os.path.abspath(os.path.join(build_dir, "bench", "spindle_populate"))
    if not os.access(exe, os.X_OK):
        fail(f"{exe} not found: build the benchmarks first")
    log(f"  filling {data} (1M turns, 100k memories; about 90 s)")
    p = subprocess.run([exe, "--data", data], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"spindle_populate exited {p.returncode}: {p.stderr[-2000:]}")
    # The files were just written; let the kernel write them back before
    # anything is measured beside them.
    os.sync()
    return json.loads(p.stdout.strip().splitlines()[-1])


def versions(exe):
    def first_line(argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True,
                               timeout=10)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return None
    return {"spindle": first_line([exe, "--version"]),
            "nginx": first_line([NGINX, "-v"]),
            "wrk": first_line(["wrk", "-v"])}


def main():
    ap = argparse.ArgumentParser(
        description="spindle's HTTP throughput beside nginx, with wrk "
                    "(see the module docstring).")
    ap.add_argument("--build-dir", default="build",
                    help="directory holding the spindle executable "
                         "(default: build)")
    ap.add_argument("--quick", action="store_true",
                    help="2 s per point, fewer points")
    ap.add_argument("--duration", type=int, metavar="S",
                    help="seconds per point (default: 2 with --quick, else 8)")
    ap.add_argument("--rounds", type=int, metavar="N",
                    help="GET /healthz rounds per connection count, the "
                         "servers' order alternating (default: 1 with "
                         "--quick, else 5); the ratio is the rounds' median")
    ap.add_argument("--only", choices=("healthz", "messages", "chat"),
                    help="run one part only")
    ap.add_argument("--json", metavar="PATH",
                    help="write every figure to this JSON file")
    ap.add_argument("--baseline-exe", metavar="PATH",
                    help="the thread-per-connection spindle to measure POST "
                         "messages against (bench/build-baseline builds it)")
    ap.add_argument("--full-store", action="store_true",
                    help="also measure POST messages on a store filled with "
                         "1M turns and 100k memories (spindle_populate) "
                         "beside an empty one, at 64 connections")
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
    health_conns = [8, 64] if args.quick else [1, 8, 64, 512]
    message_conns = [8, 64] if args.quick else [1, 8, 64, 512]
    do_health = args.only in (None, "healthz")
    do_messages = args.only in (None, "messages")
    do_chat = args.only in (None, "chat")
    chat_conns = [8, 64]
    chat_rounds = 1 if args.quick else CHAT_ROUNDS
    baseline = None
    if args.baseline_exe and do_messages:
        baseline = os.path.abspath(args.baseline_exe)
        if not os.access(baseline, os.X_OK):
            fail(f"--baseline-exe {baseline} is not an executable")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C does, so every server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    result = {
        "settings": {
            "quick": args.quick, "seconds_per_point": seconds,
            "healthz_rounds": rounds if do_health else 0,
            "healthz_connections": health_conns if do_health else [],
            "messages_connections": message_conns if do_messages else [],
            "chat_connections": chat_conns if do_chat else [],
            "chat_rounds": chat_rounds if do_chat else 0,
            "message_threads": THREADS, "message_texts": len(MESSAGES),
            "target": {"healthz_spindle_over_nginx": TARGET,
                       "at_connections": list(TARGET_CONNECTIONS)},
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)},
        "versions": versions(exe),
    }

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench_http-"))
        log(f"bench_http: {seconds} s per point, temp dir {tmp}")
        _, mem_url, _ = start_spindle(exe, tmp, "memory", ":memory:", stack)
        log(f"  spindle --data :memory: at {mem_url}")
        if do_health:
            _, nginx_url = start_nginx(tmp, stack)
            log(f"  nginx at {nginx_url}")
            result["healthz"] = bench_healthz(nginx_url, mem_url,
                                              health_conns, seconds,
                                              rounds, log)
        if do_messages:
            data = os.path.join(tmp, "data")
            _, dur_url, _ = start_spindle(exe, tmp, "durable", data, stack)
            log(f"  spindle --data {data} at {dur_url}")
            lua = write_messages_lua(tmp)
            base_url = None
            if baseline:
                _, base_url, _ = start_spindle(
                    baseline, tmp, "before", os.path.join(tmp, "before"),
                    stack)
                log(f"  spindle before the event loops at {base_url}")
            result["messages"] = bench_messages(dur_url, mem_url, lua,
                                                message_conns, seconds, log,
                                                base_url)
        if do_chat:
            if not do_messages:
                data = os.path.join(tmp, "data")
                _, dur_url, _ = start_spindle(exe, tmp, "durable", data,
                                              stack)
                log(f"  spindle --data {data} at {dur_url}")
                warm_threads(dur_url, write_messages_lua(tmp), 8)
            result["chat"] = bench_chat(dur_url, write_messages_lua(tmp),
                                        write_chat_lua(tmp), chat_conns,
                                        seconds, chat_rounds, log)
        if args.full_store:
            lua = write_messages_lua(tmp)
            full = os.path.join(tmp, "full")
            result["populated"] = populate(args.build_dir, full, log)
            _, full_url, _ = start_spindle(exe, tmp, "full", full, stack)
            _, empty_url, _ = start_spindle(exe, tmp, "empty",
                                            os.path.join(tmp, "empty"), stack)
            result["store"] = bench_store(empty_url, full_url, lua, [64],
                                          seconds, log)

    cpus = os.cpu_count()
    print(f"\n## spindle's HTTP throughput beside nginx "
          f"(wrk, {seconds} s per point, {cpus} CPUs shared by client and "
          f"servers)\n")
    v = result["versions"]
    print(f"{v['spindle']}; {v['nginx']}; {v['wrk']}\n")
    if do_health:
        print("### GET /healthz: spindle (--data :memory:) beside nginx "
              "(`return 200` of the same body)\n")
        print(healthz_table(result["healthz"]))
        print(f"\nTarget: spindle/nginx ≥ {TARGET}x at "
              f"{' and '.join(map(str, TARGET_CONNECTIONS))} connections.\n")
    if do_messages:
        print(f"### POST /v1/threads/{{id}}/messages (offline provider, "
              f"{THREADS} threads, {len(MESSAGES)} message texts): durable "
              f"beside --data :memory:\n")
        print(messages_table(result["messages"]))
        print("\ndurable: a data directory with the default settings "
              "(--sync full); writes/commit: state store writes per "
              "transaction over the durable point (/metrics).")
        if baseline:
            print(f"before: the thread-per-connection server (commit "
                  f"{BASELINE_COMMIT}), durable. Target: durable/before ≥ "
                  f"{SPEEDUP_TARGET:g}x at 64 connections.")
        print()
    if do_chat:
        print("### POST /v1/chat/completions with a thread beside POST "
              "/v1/threads/{id}/messages (offline provider, durable, same "
              "threads and texts)\n")
        print(chat_table(result["chat"]))
        print(f"\nTarget: chat/messages ≥ {CHAT_TARGET}x; the median of "
              f"{chat_rounds} rounds in alternating order.\n")
    if "store" in result:
        print("### POST /v1/threads/{id}/messages, durable: a store of "
              f"{result['populated'].get('turns')} turns and "
              f"{result['populated'].get('memories')} memories beside an "
              "empty one\n")
        print(store_table(result["store"]))
        print(f"\nTarget: full/empty ≥ {STORE_TARGET:g}x.\n")
    bad = [f"{part} c={p['connections']}"
           for part in ("healthz", "messages", "store", "chat")
           for p in result.get(part, [])
           for r in p.values() if isinstance(r, dict) and r.get("errors")]
    if bad:
        print("Points with socket errors or non-2xx replies (not valid "
              "measurements): " + ", ".join(bad) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report_document(result, seconds), f, indent=2,
                      ensure_ascii=False)
            f.write("\n")
        log(f"bench_http: figures written to {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("bench_http: interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
