#!/usr/bin/env python3
"""spindle clusters on PostgreSQL: what coordination costs, failover, and
claims from one scheduler.

What it measures
----------------
A throwaway PostgreSQL (`.ci/postgres start DIR`: loopback, fsync off,
synchronous_commit on) serves every cluster of the run, each in a database
of its own (CREATE DATABASE), so no measured configuration sees another's
rows. docs/cluster.md says how a cluster works.

1. Messages per second. POST /v1/threads/{id}/messages with the offline
   provider (instant replies, no delay), each request a whole exchange
   (user turn stored, reply generated, assistant turn stored, exchange
   handed to long-term memory), spread over 64 thread IDs (bench-0 ..
   bench-63, created by one message each through the balancer before the
   first measured point) with varied texts: the load of bench_http.py's
   messages table, driven by wrk with the same Lua script. Every
   configuration sits behind Debian's nginx, with the upstream of
   docs/cluster/nginx.conf (a consistent hash on the thread ID taken from
   the path, keep-alive to the nodes, proxy_buffering off):

   - sqlite: one node on SQLite (`--data DIR`, no --store), the default
     --sync full: what one process does without any cluster;
   - sqlite-normal: the same with --sync normal, whose durability is the
     throwaway PostgreSQL's (a commit survives the crash of any process,
     not of the machine);
   - pg-1, pg-2, pg-3: 1, 2 and 3 nodes on PostgreSQL (`--store URL`), each
     configuration on a database of its own;
   - pg-3-rr: the nodes of pg-3 behind round-robin instead of the hash, so
     about two requests in three reach a node that does not own the thread
     and are forwarded to the owner: the cost of forwarding.

   All nodes run at once; at each connection count (8 and 64; 64 only with
   --quick) the configurations are measured one right after the other, in
   three rounds (one with --quick) whose order rotates, since the machine's
   load drifts over seconds. Each configuration's figures are those of its
   median round; the ratios (to sqlite and to pg-1) are the medians of the
   rounds' ratios. On a machine of 2 cores shared by wrk, nginx, the nodes
   and PostgreSQL, more nodes cannot add throughput: the table shows what
   coordination costs (a node's lease per thread activation, the fence
   before every write, PostgreSQL's commits over a socket instead of
   SQLite's in the process), not what a cluster of machines would gain.
   On a shared machine one figure varies by up to 2x from round to round
   (in the run of docs/benchmarks.md, with other compiles keeping both
   cores busy, one configuration gave 542 to 1,149 messages/s at 8
   connections): the ratios, taken within a round, are what counts.

2. Failover. Three nodes on PostgreSQL with --node-lease-ms 2000 (a node
   renews every 400 ms; docs/cluster.md). In each of 20 rounds (3 with
   --quick) a victim (the nodes in turn) is made the owner of a new thread
   by a message sent straight to it, which the thread_leases table
   confirms; a client then sends a message for that thread through another
   node every 10 ms (forwarded to the victim), and the victim is killed
   with SIGKILL. The client keeps sending, retrying every 50 ms after a
   failure (503 not_owner while the victim's lease runs, or a connection
   or reply broken by the kill). Failover time: from the kill to the first
   200 answer to a request sent after it. Then the victim is started again
   under the same name (it waits for its old lease to run out, which by
   then it has) and the time until it serves again is noted too, before
   the next round. The table gives the median and the largest of both,
   and the answers the client got meanwhile. Expected: the lease (2 s)
   from the victim's last renewal the database committed, so 1.6 to 2 s
   after the kill, plus the retry interval and the request itself; a
   renewal still on its way when the node died, or a loaded machine, adds
   a little.

3. Claims per second. The scheduler is one queue for the whole cluster
   (docs/cluster.md, "One scheduler"): one node holds the seat and every
   task request reaching another node is forwarded to it. One SQLite node
   (--sync full) and clusters of 1, 2 and 3 PostgreSQL nodes (databases of
   their own) each get, before each point, a flat orchestration: a root
   and its children, created through the seat's holder by wrk for 1.5x the
   point's length plus a second (more than the point can claim; a point
   that runs out says so). Then 12 workers, spread evenly over the nodes
   and talking to them directly (12 on one node, 6 on each of two, 4 on
   each of three: one wrk process per node, its connections the workers),
   claim a task with a 60 s lease (POST /v1/tasks/claim), complete it with
   the lease's token, and claim again, for the point's length; a wrk Lua
   script counts the claims that returned a task. Claims per second are
   those claims over the point's length; the configurations are measured
   one after the other in rounds whose order rotates, each figure its
   median round, the ratios (to the SQLite node and to the 1-node
   cluster) the medians of the rounds' ratios, as in part 1. On nodes
   without the seat every request is forwarded to it, so 2 and 3 nodes
   add a hop to most claims but no second scheduler: the ratios show what
   the one queue costs, not a gain.

Every throughput point is `wrk -t2 -cN -dSs --latency --timeout 10s`; the
tables give messages per second, latency percentiles, non-2xx answers and
socket errors (a point with errors is flagged: its figure is not a valid
measurement), and the state stores' writes per commit over the point
(summed over the configuration's nodes, from /metrics).

Usage
-----
    python3 bench/bench_cluster.py --quick            # about 2 minutes
    python3 bench/bench_cluster.py --json out.json    # full run, ~12 minutes

Options:
    --build-dir DIR   where the spindle executable is (default: build)
    --quick           2 s per point, 64 connections only, one round, 3 kills
                      (the full run: 8 s per point, 8 and 64 connections,
                      three rounds, 20 kills)
    --duration S      seconds per throughput or claims point, overriding
                      the above
    --rounds N        throughput rounds per connection count, and claims
                      rounds
    --kills N         failover rounds, overriding the above
    --only WHAT       throughput, failover or claims: run one part only
    --json PATH       write the tables as JSON in the benchmark report's
                      format ({"benchmark": "cluster", "machine", "tables"},
                      see bench/make_report.py), with every raw figure and
                      the run's settings beside them under "figures"

Needs PostgreSQL (run by .ci/postgres as the postgres system user, psql),
/usr/sbin/nginx and wrk (.ci/install-deps installs them all). nginx runs
from a config written into a temporary directory, as bench_http.py's does.
Every process the script starts (PostgreSQL, nginx, the nodes) is stopped
on exit, failure and Ctrl-C, and the temporary directories are removed.

Python 3 standard library only; shares bench_http.py's wrk and process
helpers.
"""

import argparse
import contextlib
import http.client
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error

import bench_http as bh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_SCRIPT = os.path.join(ROOT, ".ci", "postgres")
THREADS = bh.THREADS           # thread IDs the message requests go to
LEASE_MS = 2000                # --node-lease-ms of the failover cluster
RETRY_S = 0.05                 # the failover client's pause after a failure
PACE_S = 0.01                  # its pause after a success
START_TIMEOUT = 60.0           # a node's start, a restart's wait included
FAILOVER_TIMEOUT = 30.0        # a round gives up after this long

CLAIM_WORKERS = 12             # claims part: workers, spread over the nodes
CLAIM_LEASE_S = 60             # each claim's lease (none runs out in a point)
BUILD_CONNECTIONS = 8          # wrk connections creating a point's tasks

# The configurations of the claims part, in its table's order.
CLAIM_CONFIGS = [
    ("sqlite", "SQLite, 1 node"),
    ("pg-1", "PostgreSQL, 1 node"),
    ("pg-2", "PostgreSQL, 2 nodes"),
    ("pg-3", "PostgreSQL, 3 nodes"),
]

# The configurations of the throughput part, in the tables' order.
CONFIGS = [
    ("sqlite", "SQLite, 1 node"),
    ("sqlite-normal", "SQLite --sync normal, 1 node"),
    ("pg-1", "PostgreSQL, 1 node"),
    ("pg-2", "PostgreSQL, 2 nodes"),
    ("pg-3", "PostgreSQL, 3 nodes"),
    ("pg-3-rr", "PostgreSQL, 3 nodes, round-robin"),
]
LABEL = dict(CONFIGS)
LABEL_CLAIMS = dict(CLAIM_CONFIGS)


def fail(msg):
    raise SystemExit("bench_cluster: " + msg)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- PostgreSQL

class Postgres:
    """The throwaway cluster of .ci/postgres, in a directory of its own
    under /tmp (its server runs as the postgres user, who must reach it)."""

    def __init__(self, stack):
        self.dir = tempfile.mkdtemp(prefix="bench_cluster-pg-")
        stack.callback(self.stop)
        p = subprocess.run([PG_SCRIPT, "start", self.dir],
                           capture_output=True, text=True)
        if p.returncode != 0:
            fail(f".ci/postgres start exited with {p.returncode}:\n"
                 + p.stdout + p.stderr)
        self.url = subprocess.run([PG_SCRIPT, "url", self.dir],
                                  capture_output=True, text=True,
                                  check=True).stdout.strip()
        # .../spindle -> .../postgres, where CREATE DATABASE is run.
        self.admin = self.url.rsplit("/", 1)[0] + "/postgres"

    def stop(self):
        if os.path.isdir(self.dir):
            subprocess.run([PG_SCRIPT, "stop", self.dir],
                           capture_output=True, text=True)
            shutil.rmtree(self.dir, ignore_errors=True)

    def create_database(self, name):
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name)
        self.psql(self.admin, f"CREATE DATABASE {name};")
        return self.url.rsplit("/", 1)[0] + "/" + name

    @staticmethod
    def psql(url, sql):
        p = subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-Atqc",
                            sql], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            fail(f"psql: {sql}: {p.stderr.strip()}")
        return p.stdout.strip()

    def version(self):
        return self.psql(self.url, "SHOW server_version;")


# ---------------------------------------------------------------- nodes

class Node:
    """One `spindle serve` on a port of its own; started again under the
    same name and port after a kill."""

    def __init__(self, exe, tmp, name, store=None, lease_ms=None,
                 extra=(), log_level="warn"):
        self.exe, self.tmp, self.name = exe, tmp, name
        self.store, self.lease_ms = store, lease_ms
        self.extra, self.log_level = list(extra), log_level
        self.data = os.path.join(tmp, name + "-data")
        self.port = None
        self.srv = None
        self.starts = 0

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def argv(self):
        argv = [self.exe, "serve", "--port", str(self.port),
                "--data", self.data, "--log-level", self.log_level]
        if self.store:
            argv += ["--store", self.store, "--node-name", self.name,
                     "--advertise", self.url]
            if self.lease_ms:
                argv += ["--node-lease-ms", str(self.lease_ms)]
        return argv + self.extra

    def start(self, stack):
        """Starts the node (on a new free port the first time, on its own
        port after that) and waits until it serves; returns the seconds
        that took."""
        attempts = 5 if self.port is None else 1
        for attempt in range(attempts):
            if self.starts == 0:
                self.port = bh.free_port()
            self.starts += 1
            out = os.path.join(self.tmp, f"{self.name}.{self.starts}.out")
            err = os.path.join(self.tmp, f"{self.name}.{self.starts}.err")
            began = time.monotonic()
            self.srv = bh.Server(f"spindle ({self.name})", self.argv(), out,
                                 err, cwd=self.tmp)
            stack.callback(self.srv.stop)
            deadline = began + START_TIMEOUT
            while time.monotonic() < deadline and self.srv.alive():
                try:
                    with open(out, errors="replace") as f:
                        serving = "serving on" in f.read()
                except OSError:
                    serving = False
                if serving:
                    with contextlib.suppress(urllib.error.URLError, OSError):
                        status, _ = bh.http_get(self.url + "/healthz")
                        if status == 200:
                            return time.monotonic() - began
                time.sleep(0.02)
            self.srv.stop()
            text = bh.tail(out) + bh.tail(err)
            if "in use" in text and attempt + 1 < attempts:
                self.starts = 0
                continue
            fail(f"spindle ({self.name}) did not start "
                 f"(exit {self.srv.proc.returncode}):\n{text}")
        fail(f"spindle ({self.name}) found no free port")

    def kill(self):
        """SIGKILL, as a crash: returns the moment it was sent."""
        t = time.monotonic()
        os.kill(self.srv.proc.pid, signal.SIGKILL)
        self.srv.proc.wait()
        return t


# ---------------------------------------------------------------- nginx

def nginx_conf(tmp, sites):
    """bench_http.py's throwaway nginx (temp paths, limits, logs) with one
    site per configuration in place of its server: sites are (listen
    port, [node ports], "hash" or "round-robin"), each an upstream as in
    docs/cluster/nginx.conf."""
    base = bh.nginx_conf(tmp, 0)
    head = base[:base.index("    server {")].replace(
        "bench/bench_http.py", "bench/bench_cluster.py")
    parts = ["""    # Requests for one thread go to one node: the hash is the thread's ID
    # where the path names one, else anything.
    map $uri $spindle_key {
        ~^/v1/threads/(?<thread>[^/]+) $thread;
        default $request_id;
    }
"""]
    for i, (listen, ports, balance) in enumerate(sites):
        how = "        hash $spindle_key consistent;\n" \
            if balance == "hash" else ""
        members = "".join(f"        server 127.0.0.1:{p} max_fails=1 "
                          f"fail_timeout=2s;\n" for p in ports)
        parts.append(f"""    upstream site{i} {{
{how}{members}        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{listen};
        client_max_body_size 1m;
        location / {{
            proxy_pass http://site{i};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout;
        }}
    }}
""")
    return head + "\n".join(parts) + "}\n"


def start_nginx(tmp, backends, stack):
    """backends: {config: ([node ports], balance)}; returns {config: URL}."""
    if not os.access(bh.NGINX, os.X_OK):
        fail(f"{bh.NGINX} not found: install nginx-light (.ci/install-deps)")
    names = list(backends)
    for attempt in range(5):
        listens = [bh.free_port() for _ in names]
        sites = [(listens[i], *backends[n]) for i, n in enumerate(names)]
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(nginx_conf(tmp, sites))
        srv = bh.Server("nginx", [bh.NGINX, "-p", tmp, "-c", conf, "-e",
                                  os.path.join(tmp, "nginx-error.log")],
                        os.path.join(tmp, "nginx.out"),
                        os.path.join(tmp, "nginx.err"))
        stack.callback(srv.stop)
        urls = {n: f"http://127.0.0.1:{listens[i]}"
                for i, n in enumerate(names)}
        deadline = time.monotonic() + 10
        ready = set()
        while time.monotonic() < deadline and srv.alive():
            for n, url in urls.items():
                if n in ready:
                    continue
                with contextlib.suppress(urllib.error.URLError, OSError):
                    if bh.http_get(url + "/healthz", timeout=1)[0] == 200:
                        ready.add(n)
            if len(ready) == len(urls):
                return urls
            time.sleep(0.05)
        srv.stop()
        text = bh.tail(os.path.join(tmp, "nginx-error.log")) + \
            bh.tail(os.path.join(tmp, "nginx.err"))
        if "Address already in use" in text and attempt < 4:
            continue
        fail("nginx did not start or pass requests on; its error log:\n"
             + text)
    fail("nginx found no free ports")


# ---------------------------------------------------------------- throughput

def storage_counters(nodes):
    """Commits and writes of the nodes' state stores, summed."""
    total = {}
    for node in nodes:
        for k, v in bh.metrics(node.url).items():
            total[k] = total.get(k, 0.0) + v
    return total


def create_threads(url):
    # One message per thread first, through the balancer (so the hash's
    # node takes each lease): no measured request creates a thread.
    for k in range(THREADS):
        status, _ = bh.http_post(f"{url}/v1/threads/bench-{k}/messages",
                                 {"content": bh.MESSAGES[k % len(bh.MESSAGES)]})
        if status != 200:
            fail(f"POST messages answered {status} at {url}")


def median_rounds(runs, names, key):
    """Each configuration's figures of its median round by `key`, with
    over_sqlite and over_pg-1: the medians over the rounds of its `key`
    divided by that of sqlite and of pg-1 in the same round."""
    configs = {}
    for c in names:
        by = sorted(runs, key=lambda g: g[c][key])
        fig = dict(by[len(by) // 2][c])
        for ref in ("sqlite", "pg-1"):
            fig["over_" + ref] = statistics.median(
                g[c][key] / g[ref][key] for g in runs)
        configs[c] = fig
    return configs


def bench_throughput(exe, tmp, pg, conns, seconds, rounds, stack):
    sqlite = Node(exe, tmp, "sqlite")
    normal = Node(exe, tmp, "sqlite-normal", extra=["--sync", "normal"])
    clusters = {}
    for n in (1, 2, 3):
        store = pg.create_database(f"bench_pg{n}")
        clusters[n] = [Node(exe, tmp, f"pg{n}-node{i}", store=store)
                       for i in range(1, n + 1)]
    members = {"sqlite": [sqlite], "sqlite-normal": [normal],
               "pg-1": clusters[1], "pg-2": clusters[2], "pg-3": clusters[3],
               "pg-3-rr": clusters[3]}
    for node in [sqlite, normal] + [x for c in clusters.values() for x in c]:
        node.start(stack)
    log("  nodes: " + ", ".join(
        f"{c}: " + " ".join(str(n.port) for n in members[c])
        for c, _ in CONFIGS if c != "pg-3-rr"))
    urls = start_nginx(tmp, {
        c: ([n.port for n in members[c]],
            "round-robin" if c == "pg-3-rr" else "hash")
        for c, _ in CONFIGS}, stack)
    log("  nginx: " + ", ".join(f"{c} {u}" for c, u in urls.items()))
    lua = bh.write_messages_lua(tmp)
    for c, _ in CONFIGS:
        if c != "pg-3-rr":
            create_threads(urls[c])
    for c, _ in CONFIGS:          # warm-up: connections, caches, leases
        bh.run_wrk(urls[c], min(8, conns[-1]), 1, lua)

    names = [c for c, _ in CONFIGS]
    points = []
    for conn in conns:
        runs = []
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            got = {}
            for c in order:
                before = storage_counters(members[c])
                res = bh.run_wrk(urls[c], conn, seconds, lua)
                after = storage_counters(members[c])
                commits = after.get("spindle_storage_commits", 0) - \
                    before.get("spindle_storage_commits", 0)
                writes = after.get("spindle_storage_writes", 0) - \
                    before.get("spindle_storage_writes", 0)
                res["writes_per_commit"] = writes / commits if commits \
                    else None
                got[c] = res
                log(f"  c={conn} round {r + 1} {c}: "
                    f"{res['requests_per_sec']:,.0f}/s"
                    + (f" ({res['errors']} errors)" if res["errors"]
                       else ""))
            runs.append(got)
        points.append({"connections": conn, "rounds": runs,
                       "configs": median_rounds(runs, names,
                                                "requests_per_sec")})
    return points


# ---------------------------------------------------------------- failover

def post_message(base, thread, text, timeout=5.0):
    """(status, error code or None); status 0 when no answer came."""
    host, port = base.replace("http://", "").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", f"/v1/threads/{thread}/messages",
                     json.dumps({"content": text}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        body = r.read()
        code = None
        if r.status != 200:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                code = json.loads(body)["error"]["code"]
        return r.status, code
    except (OSError, http.client.HTTPException) as e:
        return 0, type(e).__name__
    finally:
        conn.close()


class Client(threading.Thread):
    """Sends a message for one thread through one node, again and again:
    PACE_S after a success, RETRY_S after a failure. After `killed` is
    set it records what it got, and stops at the first 200 answer to a
    request sent after the kill (and a few more, which must all be 200)."""

    def __init__(self, base, thread):
        super().__init__(daemon=True)
        self.base, self.thread = base, thread
        self.kill_time = None
        self.first_ok = None
        self.after = {}             # answers to requests sent after the kill
        self.confirm = []           # the statuses after the first 200
        self.before_ok = 0
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            kill = self.kill_time
            sent = time.monotonic()
            status, code = post_message(self.base, self.thread,
                                        bh.MESSAGES[i % len(bh.MESSAGES)])
            got = time.monotonic()
            i += 1
            if kill is None or sent < kill:
                if status == 200:
                    self.before_ok += 1
                    self.ready.set()
            elif self.first_ok is None:
                key = str(status) + (f" {code}" if code else "")
                self.after[key] = self.after.get(key, 0) + 1
                if status == 200:
                    self.first_ok = got
                    self.after[key] -= 1     # the 200 is the end, not a retry
                    if not self.after[key]:
                        del self.after[key]
            else:
                self.confirm.append(status)
                if len(self.confirm) >= 5:
                    return
            time.sleep(PACE_S if status == 200 else RETRY_S)


def lease_holder(pg_url, thread):
    return Postgres.psql(pg_url, "SELECT coalesce(node, '') FROM "
                         f"thread_leases WHERE thread_id = '{thread}';")


def wait_serving(node, timeout=10.0):
    """Until GET /v1/cluster through the node lists it as serving."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            _, body = bh.http_get(node.url + "/v1/cluster")
            for n in json.loads(body)["nodes"]:
                if n["name"] == node.name and n["state"] == "serving":
                    return
        time.sleep(0.05)
    fail(f"{node.name} is not listed as serving by GET /v1/cluster")


def bench_failover(exe, tmp, pg, kills, stack):
    store = pg.create_database("bench_failover")
    nodes = [Node(exe, tmp, f"fo-node{i}", store=store, lease_ms=LEASE_MS,
                  log_level="info")
             for i in (1, 2, 3)]
    for node in nodes:
        node.start(stack)
    for node in nodes:
        wait_serving(node)
    rounds = []
    for r in range(kills):
        victim = nodes[r % 3]
        via = nodes[(r + 1) % 3]
        thread = f"failover-{r}"
        status, code = post_message(victim.url, thread, "Who owns this?")
        if status != 200:
            fail(f"round {r + 1}: POST to {victim.name} answered {status} "
                 f"{code}")
        holder = lease_holder(store, thread)
        if holder != victim.name:
            fail(f"round {r + 1}: thread {thread} is held by {holder!r}, "
                 f"not by {victim.name}, after a message sent to it")
        client = Client(via.url, thread)
        client.start()
        if not client.ready.wait(10):
            client.stop.set()
            fail(f"round {r + 1}: no 200 through {via.name} (forwarded to "
                 f"{victim.name}) within 10 s")
        time.sleep(0.2)
        client.kill_time = victim.kill()
        client.join(FAILOVER_TIMEOUT)
        if client.is_alive() or client.first_ok is None:
            client.stop.set()
            client.join(10)
            fail(f"round {r + 1}: no 200 for {thread} through {via.name} "
                 f"within {FAILOVER_TIMEOUT:.0f} s of killing "
                 f"{victim.name}; answers meanwhile: {client.after}")
        failover = client.first_ok - client.kill_time
        new_holder = lease_holder(store, thread)
        restart = victim.start(stack)
        wait_serving(victim)
        rnd = {"round": r + 1, "victim": victim.name, "client_via": via.name,
               "thread": thread, "failover_s": failover,
               "restart_s": restart, "answers_meanwhile": client.after,
               "after_failover": client.confirm,
               "requests_before_kill": client.before_ok,
               "new_holder": new_holder}
        log(f"  kill {r + 1}/{kills}: {victim.name} killed, {thread} served "
            f"through {via.name} after {failover * 1000:.0f} ms (now held "
            f"by {new_holder}); restart {restart * 1000:.0f} ms; meanwhile "
            + (", ".join(f"{k} x{v}" for k, v in client.after.items())
               or "nothing"))
        rounds.append(rnd)
    fo = [x["failover_s"] for x in rounds]
    rs = [x["restart_s"] for x in rounds]
    answers = {}
    for x in rounds:
        for k, v in x["answers_meanwhile"].items():
            answers[k] = answers.get(k, 0) + v
    return {"lease_ms": LEASE_MS, "kills": kills, "rounds": rounds,
            "failover_median_s": statistics.median(fo),
            "failover_max_s": max(fo), "failover_min_s": min(fo),
            "restart_median_s": statistics.median(rs),
            "restart_max_s": max(rs), "answers_meanwhile": answers,
            "not_200_after_failover": sum(
                1 for x in rounds for s in x["after_failover"] if s != 200)}


# ---------------------------------------------------------------- claims

# wrk's workers: each connection claims a task and completes it with its
# lease's token, then claims again. A thread's connections share its queue
# of claimed tasks (wrk does not say which connection an answer came on),
# so a completion may leave on another connection of the thread than its
# claim did; the counts are kept per thread and summed in done().
CLAIMS_LUA = """-- POST /v1/tasks/claim (lease {lease} s), then POST
-- /v1/tasks/{{id}}/complete with the lease's token, over and over.
local headers = {{ ["Content-Type"] = "application/json" }}
local threads = {{}}
function setup(thread)
  thread:set("index", #threads)
  table.insert(threads, thread)
end

function init(args)
  worker = "bench-" .. (args[1] or "w") .. "-" .. (index or 0)
  todo = {{}}
  claims, completions, empty, failed = 0, 0, 0, 0
end

function request()
  local t = table.remove(todo)
  if t then
    return wrk.format("POST", "/v1/tasks/" .. t[1] .. "/complete", headers,
                      '{{"lease":"' .. t[2] .. '"}}')
  end
  return wrk.format("POST", "/v1/tasks/claim", headers,
                    '{{"worker":"' .. worker .. '","lease_s":{lease}}}')
end

function response(status, headers, body)
  if status == 204 then
    empty = empty + 1
  elseif status ~= 200 then
    failed = failed + 1
  else
    local token = body:match('"token"%s*:%s*"([^"]+)"')
    if token then
      claims = claims + 1
      table.insert(todo, {{body:match('"id"%s*:%s*"([^"]+)"'), token}})
    else
      completions = completions + 1
    end
  end
end

function done(summary, latency, requests)
  local c, d, e, f = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    c = c + t:get("claims")
    d = d + t:get("completions")
    e = e + t:get("empty")
    f = f + t:get("failed")
  end
  io.write(string.format("claims %d\\ncompletions %d\\nempty %d\\n"
                         .. "failed %d\\n", c, d, e, f))
end
"""

SUBTASKS_LUA = """-- POST /v1/tasks/ROOT/subtasks, ROOT the first argument.
local headers = { ["Content-Type"] = "application/json" }
local path
function init(args)
  path = "/v1/tasks/" .. args[1] .. "/subtasks"
end

function request()
  return wrk.format("POST", path, headers, '{"payload":"bench"}')
end
"""


def write_claim_scripts(tmp):
    claims = os.path.join(tmp, "claims.lua")
    with open(claims, "w") as f:
        f.write(CLAIMS_LUA.format(lease=CLAIM_LEASE_S))
    subtasks = os.path.join(tmp, "subtasks.lua")
    with open(subtasks, "w") as f:
        f.write(SUBTASKS_LUA)
    return claims, subtasks


def wrk_argv(url, connections, seconds, script, args):
    return (["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
             "--timeout", "10s", "-s", script, url, "--"] + list(args))


def run_wrks(runs, seconds):
    """Runs the wrk command lines of `runs` at once; their outputs, parsed
    by bench_http.py's parse_wrk, with the Lua script's counts added."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              preexec_fn=bh.raise_fd_limit)
             for argv in runs]
    out = []
    for argv, p in zip(runs, procs):
        stdout, stderr = p.communicate(timeout=seconds + 60)
        if p.returncode != 0:
            fail(f"{' '.join(argv)} exited with {p.returncode}:\n"
                 + stdout + stderr)
        r = bh.parse_wrk(stdout)
        for key in ("claims", "completions", "empty", "failed"):
            m = re.search(rf"^{key} (\d+)$", stdout, re.M)
            if m:
                r[key] = int(m.group(1))
        out.append(r)
    return out


def seat_holder(nodes, timeout=15.0):
    """The node GET /v1/cluster names as the scheduler seat's holder."""
    names = {n.name: n for n in nodes}
    deadline = time.monotonic() + timeout
    said = None
    while time.monotonic() < deadline:
        for node in nodes:
            with contextlib.suppress(urllib.error.URLError, OSError,
                                     ValueError):
                _, body = bh.http_get(node.url + "/v1/cluster")
                said = json.loads(body).get("scheduler")
                if said in names:
                    return names[said]
        time.sleep(0.05)
    fail(f"no node of {', '.join(names)} holds the scheduler seat (GET "
         f"/v1/cluster says {said!r}): this build has no cluster-wide "
         f"scheduler")


def claims_point(nodes, seat, claims_lua, subtasks_lua, seconds):
    """One point: a flat orchestration built through `seat`, then
    CLAIM_WORKERS workers spread over `nodes` claiming for `seconds`."""
    status, body = bh.http_post(seat.url + "/v1/orchestrations",
                                {"payload": "bench"})
    if status != 201:
        fail(f"POST /v1/orchestrations answered {status} at {seat.url}")
    root = json.loads(body)["id"]
    build_s = int(seconds * 1.5) + 1
    built = run_wrks([wrk_argv(seat.url, BUILD_CONNECTIONS, build_s,
                               subtasks_lua, [root])], build_s)[0]
    if built["errors"]:
        fail(f"creating the tasks of {root} through {seat.name}: "
             f"{built['errors']} errors")
    per_node = CLAIM_WORKERS // len(nodes)
    runs = run_wrks([wrk_argv(n.url, per_node, seconds, claims_lua,
                              [n.name]) for n in nodes], seconds)
    fig = {"orchestration": root, "tasks_built": built["requests"],
           "build_s": build_s, "workers_per_node": per_node,
           "per_node": runs}
    for key in ("claims", "completions", "empty", "failed", "requests",
                "non_2xx"):
        fig[key] = sum(r.get(key, 0) for r in runs)
    fig["socket_errors"] = sum(sum(r["socket_errors"].values())
                               for r in runs)
    fig["errors"] = fig["failed"] + fig["socket_errors"]
    duration = statistics.mean(r.get("duration_s", seconds) for r in runs)
    fig["claims_per_sec"] = fig["claims"] / duration
    fig["completions_per_sec"] = fig["completions"] / duration
    fig["latency_ms"] = {p: max(r["latency_ms"].get(p, 0.0) for r in runs)
                         for p in ("p50", "p99")}
    return fig


def bench_claims(exe, tmp, pg, seconds, rounds, stack):
    members = {"sqlite": [Node(exe, tmp, "claims-sqlite")]}
    for n in (1, 2, 3):
        store = pg.create_database(f"bench_claims{n}")
        members[f"pg-{n}"] = [Node(exe, tmp, f"claims{n}-node{i}",
                                   store=store)
                              for i in range(1, n + 1)]
    for nodes in members.values():
        for node in nodes:
            node.start(stack)
    for c in ("pg-1", "pg-2", "pg-3"):
        for node in members[c]:
            wait_serving(node)
    seats = {c: nodes[0] if c == "sqlite" else seat_holder(nodes)
             for c, nodes in members.items()}
    log("  seats: " + ", ".join(f"{c}: {s.name} ({s.port})"
                                for c, s in seats.items()))
    claims_lua, subtasks_lua = write_claim_scripts(tmp)
    names = [c for c, _ in CLAIM_CONFIGS]
    runs = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {}
        for c in order:
            fig = claims_point(members[c], seats[c], claims_lua,
                               subtasks_lua, seconds)
            got[c] = fig
            log(f"  claims round {r + 1} {c}: "
                f"{fig['claims_per_sec']:,.0f}/s over {len(members[c])} "
                f"node(s), {fig['tasks_built']:,} tasks built"
                + (f", ran out ({fig['empty']} empty claims)"
                   if fig["empty"] else "")
                + (f" ({fig['errors']} errors)" if fig["errors"] else ""))
        runs.append(got)
    return {"workers": CLAIM_WORKERS, "rounds": runs,
            "configs": median_rounds(runs, names, "claims_per_sec")}


# ---------------------------------------------------------------- tables

def rate(fig):
    return round(fig["requests_per_sec"])


def ratio(v):
    return f"{v:.2f}x"


def throughput_report_tables(points, seconds, rounds):
    wide = {
        "title": "POST /v1/threads/{id}/messages per second through nginx "
                 "(offline provider): one SQLite node beside clusters of 1, "
                 "2 and 3 nodes on PostgreSQL",
        "columns": ["connections"] + [f"{c} msgs/s" for c, _ in CONFIGS]
        + ["errors"],
        "rows": [[p["connections"]]
                 + [rate(p["configs"][c]) for c, _ in CONFIGS]
                 + [sum(f["errors"] for f in p["configs"].values())]
                 for p in points],
        "notes": [
            "; ".join(f"{c}: {label}" for c, label in CONFIGS) + ". "
            "Every configuration behind the same nginx (the upstream of "
            "docs/cluster/nginx.conf: a consistent hash on the thread ID, "
            "keep-alive, proxy_buffering off; round-robin for pg-3-rr, "
            "whose requests mostly reach a node that forwards them to the "
            "owner). Each PostgreSQL cluster on a database of its own in "
            "one throwaway server (.ci/postgres: fsync off, "
            "synchronous_commit on); SQLite with the default --sync full, "
            "and with --sync normal, the same durability as that server.",
            f"Each request one exchange (both turns stored), {THREADS} "
            f"thread IDs created through nginx before the first point, "
            f"{len(bh.MESSAGES)} message texts taken in turn; `wrk -t2 -cN "
            f"-d{seconds}s`, the configurations one right after the other, "
            f"{rounds} round(s) in rotating order; each figure is the "
            f"configuration's median round.",
            "wrk, nginx, every node and PostgreSQL share the machine's 2 "
            "cores: more nodes cannot add throughput here; the ratios show "
            "what coordination costs.",
        ],
        "chart_columns": [f"{c} msgs/s" for c, _ in CONFIGS],
    }
    rows = []
    for p in points:
        for c, _ in CONFIGS:
            f = p["configs"][c]
            se = f["socket_errors"]
            wpc = f.get("writes_per_commit")
            rows.append([LABEL[c], p["connections"], rate(f),
                         ratio(f["over_sqlite"]), ratio(f["over_pg-1"]),
                         bh.ms_cell(f, "p50"), bh.ms_cell(f, "p90"),
                         bh.ms_cell(f, "p99"), bh.ms_cell(f, "max"),
                         f["non_2xx"], sum(se.values()),
                         f"{wpc:.1f}" if wpc else "-"])
    bad = [f"{LABEL[c]} at {p['connections']}" for p in points
           for c, _ in CONFIGS if p["configs"][c]["errors"]]
    detail = {
        "title": "POST /v1/threads/{id}/messages through nginx, by "
                 "configuration: ratios, latency, errors",
        "columns": ["configuration", "connections", "msgs/s", "/ SQLite",
                    "/ PostgreSQL 1 node", "p50 ms", "p90 ms", "p99 ms",
                    "max ms", "non-2xx", "socket errors",
                    "writes per commit"],
        "rows": rows,
        "notes": [
            "/ SQLite and / PostgreSQL 1 node: the median over the rounds "
            "of the configuration's messages per second divided by that "
            "of the single SQLite node (--sync full) and of the 1-node "
            "PostgreSQL cluster in the same round.",
            "writes per commit: the state stores' writes per transaction "
            "over the point, summed over the configuration's nodes (from "
            "/metrics): how well group commit batches.",
        ] + (["Points with socket errors or non-2xx answers, not valid "
              "measurements: " + ", ".join(bad) + "."] if bad else []),
    }
    return [wide, detail]


def failover_report_table(fo):
    answers = ", ".join(f"{k}: {v}" for k, v in
                        sorted(fo["answers_meanwhile"].items())) or "none"
    return {
        "title": f"Failover: a node killed with SIGKILL to the first 200 "
                 f"for its thread through another node, --node-lease-ms "
                 f"{fo['lease_ms']}",
        "columns": ["lease ms", "kills", "failover median ms",
                    "failover max ms", "failover min ms",
                    "restart median ms", "restart max ms",
                    "non-200 after failover"],
        "rows": [[fo["lease_ms"], fo["kills"],
                  round(fo["failover_median_s"] * 1000),
                  round(fo["failover_max_s"] * 1000),
                  round(fo["failover_min_s"] * 1000),
                  round(fo["restart_median_s"] * 1000),
                  round(fo["restart_max_s"] * 1000),
                  fo["not_200_after_failover"]]],
        "notes": [
            f"Three nodes on PostgreSQL, --node-lease-ms {fo['lease_ms']} "
            f"(renewed every {fo['lease_ms'] // 5} ms). Each round makes "
            f"the victim (the nodes in turn) own a new thread by a message "
            f"sent to it (checked in thread_leases), starts a client "
            f"sending that thread a message through another node every "
            f"{PACE_S * 1000:.0f} ms, retrying {RETRY_S * 1000:.0f} ms "
            f"after a failure, and kills the victim with SIGKILL. "
            f"failover: from the kill to the first 200 answer to a request "
            f"sent after it; the victim's lease must run out first, at "
            f"most {fo['lease_ms']} ms after its last renewal.",
            "restart: the victim started again under the same name and "
            "port, from its start to its first /healthz 200 (its old lease "
            "has run out by then); the next round waits until GET "
            "/v1/cluster lists it as serving.",
            f"Answers to the client between the kill and the first 200, "
            f"over all rounds: {answers} (status and error code; 0: the "
            f"connection or the reply broke). non-200 after failover: "
            f"answers other than 200 to the five requests after the first "
            f"200 of each round.",
        ],
    }


def claims_report_table(point, seconds, rounds):
    rows = []
    for c, label in CLAIM_CONFIGS:
        f = point["configs"][c]
        nodes = CLAIM_WORKERS // f["workers_per_node"]
        rows.append([point["workers"], label, nodes,
                     round(f["claims_per_sec"]),
                     ratio(f["over_sqlite"]), ratio(f["over_pg-1"]),
                     round(f["completions_per_sec"]),
                     f"{f['latency_ms']['p50']:.2f}",
                     f"{f['latency_ms']['p99']:.2f}",
                     f["tasks_built"], f["empty"], f["errors"]])
    bad = [LABEL_CLAIMS[c] for c, _ in CLAIM_CONFIGS
           if point["configs"][c]["errors"] or point["configs"][c]["empty"]]
    return {
        "title": "Claims per second: workers spread over 1, 2 and 3 "
                 "PostgreSQL nodes (one scheduler seat) beside one SQLite "
                 "node",
        "columns": ["workers", "configuration", "nodes", "claims/s",
                    "/ SQLite", "/ PostgreSQL 1 node", "completions/s",
                    "p50 ms", "p99 ms", "tasks built", "empty claims",
                    "errors"],
        "rows": rows,
        "notes": [
            f"{CLAIM_WORKERS} workers (wrk connections, one wrk process "
            f"per node, each node's share of them talking to it directly): "
            f"claim with a {CLAIM_LEASE_S} s lease, complete with the "
            f"lease's token, claim again, for {seconds} s, in {rounds} "
            f"round(s) of rotating order; each figure the configuration's "
            f"median round. Before each point, a flat orchestration (a "
            f"root and the tasks built below it) created through the "
            f"scheduler seat's holder by wrk with {BUILD_CONNECTIONS} "
            f"connections.",
            "/ SQLite and / PostgreSQL 1 node: the median over the rounds "
            "of the configuration's claims per second divided by that of "
            "the SQLite node (--sync full) and of the 1-node PostgreSQL "
            "cluster in the same round. On 2 and 3 nodes the workers on "
            "nodes without the seat are forwarded to it: one scheduler "
            "serves every claim.",
            "p50 and p99: the latency of every request (claims and "
            "completions), the largest over the configuration's wrk "
            "processes. empty claims: 204 answers, the point ran out of "
            "tasks.",
        ] + (["Points with errors or empty claims, not valid "
              "measurements: " + ", ".join(bad) + "."] if bad else []),
    }


def report_document(result, seconds, rounds):
    tables = []
    if "throughput" in result:
        tables += throughput_report_tables(result["throughput"], seconds,
                                           rounds)
    if "failover" in result:
        tables.append(failover_report_table(result["failover"]))
    if "claims" in result:
        tables.append(claims_report_table(result["claims"], seconds,
                                          rounds))
    return {"benchmark": "cluster", "machine": bh.machine(),
            "tables": tables, "figures": result}


def markdown(t):
    lines = ["| " + " | ".join(t["columns"]) + " |",
             "|" + "---:|" * len(t["columns"])]
    lines += ["| " + " | ".join(f"{c:,}" if isinstance(c, int) and
                                 not isinstance(c, bool) and c >= 10000
                                 else str(c) for c in row) + " |"
              for row in t["rows"]]
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(
        description="spindle clusters on PostgreSQL: throughput through "
                    "nginx beside one SQLite node, failover time, and "
                    "claims per second from workers on 1, 2 and 3 nodes "
                    "(see the module docstring).")
    ap.add_argument("--build-dir", default="build",
                    help="directory holding the spindle executable "
                         "(default: build)")
    ap.add_argument("--quick", action="store_true",
                    help="2 s per point, 64 connections, one round, 3 kills")
    ap.add_argument("--duration", type=int, metavar="S",
                    help="seconds per throughput or claims point (default: "
                         "2 with --quick, else 8)")
    ap.add_argument("--rounds", type=int, metavar="N",
                    help="throughput rounds per connection count, and "
                         "claims rounds (default: 1 with --quick, else 3)")
    ap.add_argument("--kills", type=int, metavar="N",
                    help="failover rounds (default: 3 with --quick, else 20)")
    ap.add_argument("--only", choices=("throughput", "failover", "claims"),
                    help="run one part only")
    ap.add_argument("--json", metavar="PATH",
                    help="write every figure to this JSON file")
    args = ap.parse_args()

    exe = os.path.abspath(os.path.join(args.build_dir, "spindle"))
    if not os.access(exe, os.X_OK):
        fail(f"{exe} not found: build spindle first, or pass --build-dir")
    help_text = subprocess.run([exe, "serve", "--help"], capture_output=True,
                               text=True).stdout
    if "--node-name" not in help_text:
        fail(f"{exe} has no cluster (serve --help lists no --node-name)")
    for tool in ("wrk", "psql"):
        if not shutil.which(tool):
            fail(f"{tool} not found: install it (.ci/install-deps)")
    seconds = args.duration or (2 if args.quick else 8)
    rounds = args.rounds or (1 if args.quick else 3)
    kills = args.kills or (3 if args.quick else 20)
    if seconds < 1 or rounds < 1 or kills < 1:
        fail("--duration, --rounds and --kills must be at least 1")
    conns = [64] if args.quick else [8, 64]
    do_throughput = args.only in (None, "throughput")
    do_failover = args.only in (None, "failover")
    do_claims = args.only in (None, "claims")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = {
        "settings": {
            "quick": args.quick, "seconds_per_point": seconds,
            "rounds": rounds if do_throughput else 0,
            "connections": conns if do_throughput else [],
            "configurations": dict(CONFIGS) if do_throughput else {},
            "message_threads": THREADS, "message_texts": len(bh.MESSAGES),
            "kills": kills if do_failover else 0,
            "failover_lease_ms": LEASE_MS,
            "failover_retry_ms": RETRY_S * 1000,
            "claim_rounds": rounds if do_claims else 0,
            "claim_workers": CLAIM_WORKERS if do_claims else 0,
            "claim_configurations": dict(CLAIM_CONFIGS) if do_claims
            else {},
            "claim_lease_s": CLAIM_LEASE_S,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)},
        "versions": bh.versions(exe),
    }
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench_cluster-"))
        log(f"bench_cluster: temp dir {tmp}; starting PostgreSQL")
        pg = Postgres(stack)
        result["versions"]["postgresql"] = pg.version()
        log(f"  PostgreSQL {result['versions']['postgresql']} at {pg.url}")
        parts = []
        if do_throughput:
            parts.append(("throughput", f"{seconds} s per point, {rounds} "
                          f"round(s)", lambda sub, part: bench_throughput(
                              exe, sub, pg, conns, seconds, rounds, part)))
        if do_failover:
            parts.append(("failover", f"{kills} kills, --node-lease-ms "
                          f"{LEASE_MS}", lambda sub, part: bench_failover(
                              exe, sub, pg, kills, part)))
        if do_claims:
            parts.append(("claims", f"{seconds} s per point, {rounds} "
                          f"round(s), {CLAIM_WORKERS} workers",
                          lambda sub, part: bench_claims(
                              exe, sub, pg, seconds, rounds, part)))
        for name, what, run in parts:
            # Each part in a directory of its own; its nodes and nginx are
            # stopped before the next part starts.
            log(f"bench_cluster: {name}, {what}")
            sub = os.path.join(tmp, name)
            os.mkdir(sub)
            with contextlib.ExitStack() as part:
                result[name] = run(sub, part)
    result["seconds"] = time.monotonic() - began

    doc = report_document(result, seconds, rounds)
    v = result["versions"]
    print(f"\n## spindle clusters on PostgreSQL ({os.cpu_count()} CPUs "
          f"shared by client, nginx, nodes and PostgreSQL)\n")
    print(f"{v['spindle']}; PostgreSQL {v['postgresql']}; {v['nginx']}; "
          f"{v['wrk']}\n")
    for t in doc["tables"]:
        print(f"### {t['title']}\n")
        print(markdown(t))
        print()
        for note in t["notes"]:
            print(note + "\n")
    if "failover" in result:
        print("Failover rounds (ms): " + ", ".join(
            f"{x['victim']} {x['failover_s'] * 1000:.0f}"
            f" (restart {x['restart_s'] * 1000:.0f})"
            for x in result["failover"]["rounds"]) + "\n")
    if args.json:
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        with open(args.json, "w") as f:
            f.write(text)
        log(f"bench_cluster: figures written to {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("bench_cluster: interrupted; every process stopped",
              file=sys.stderr)
        sys.exit(130)
