#!/usr/bin/env python3
"""Redis baselines for the benchmark report, over loopback.

Drives a running redis-server with redis-benchmark at the client counts the
spindle benchmarks used in the same run, and writes the figures as a
baseline document (redis.json) in the benchmarks' own JSON format:

  - IDs: INCR of one key, beside bench_ids' allocator table;
  - turns: RPUSH of a ~45-byte turn and LRANGE -12 -1 on lists picked at
    random (each prefilled with 12 turns), beside bench_threads'
    add_turn + history(12) table; one pair = one RPUSH + one LRANGE;
  - the server: the same pair and PING at bench_server's connection
    counts, beside POST messages and GET /healthz.

Each baseline table carries "beside" (which spindle table it sits next to
and which columns to compare) and "chart_columns"; see make_report.py.

Usage: redis_baseline.py --port P --results DIR [--quick]
                         [--redis-benchmark PATH]
Python 3 standard library only.
"""

import argparse
import csv
import io
import json
import os
import re
import socket
import subprocess
import sys

TURN = "user:what-is-the-weather-like-in-paris-today?"  # 45 bytes, no quotes


def load(results, name):
    try:
        with open(os.path.join(results, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def find_table(doc, title_prefix):
    for t in (doc or {}).get("tables", []):
        if t.get("title", "").startswith(title_prefix):
            return t
    return None


def counts(table, default):
    """The client counts in a table's first column, or `default`."""
    if not table:
        return default
    out = []
    for row in table.get("rows", []):
        try:
            out.append(int(str(row[0]).replace(",", "")))
        except (ValueError, IndexError):
            pass
    return out or default


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def read_replies(sock, n):
    """Reads `n` simple replies (integers, status or errors)."""
    buf = b""
    seen = 0
    while seen < n:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise RuntimeError("redis closed the connection")
        buf += chunk
        lines = buf.split(b"\r\n")
        buf = lines.pop()
        for line in lines:
            if line.startswith(b"-"):
                raise RuntimeError("redis: " + line.decode(errors="replace"))
            seen += 1


def command(port, *args):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(resp(*args))
        data = s.recv(1 << 16)
        if data.startswith(b"-"):
            raise RuntimeError("redis: " + data.decode(errors="replace"))
        return data


def prefill(port, lists, turns):
    """Deletes the lists and gives each of them `turns` turns."""
    command(port, "FLUSHALL")
    batch = 1000
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        for start in range(0, lists, batch):
            end = min(lists, start + batch)
            s.sendall(b"".join(resp("RPUSH", "turns:%012d" % i,
                                    *([TURN] * turns))
                               for i in range(start, end)))
            read_replies(s, end - start)


def redis_benchmark(exe, port, clients, requests, args, keyspace=None):
    cmd = [exe, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
           "-n", str(requests), "--csv"]
    if keyspace:
        cmd += ["-r", str(keyspace)]
    cmd += args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         timeout=600).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows or "rps" not in rows[-1]:
        raise RuntimeError("unexpected redis-benchmark output: " + out)
    return float(rows[-1]["rps"])


def pair_rate(a, b):
    """Pairs per second when each pair is one `a` op then one `b` op."""
    return 1.0 / (1.0 / a + 1.0 / b) if a > 0 and b > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--redis-benchmark", default="redis-benchmark")
    a = ap.parse_args()

    requests = 4000 if a.quick else 100000
    ids = find_table(load(a.results, "ids"), "IDs per second")
    threads = find_table(load(a.results, "threads"), "add_turn + history")
    server = find_table(load(a.results, "server"), "spindle serve")
    id_clients = counts(ids, [1, 2, 4, 8])
    turn_clients = counts(threads, [1, 2, 4, 8])
    server_clients = counts(server, [1, 8, 64])
    lists = 1000 if a.quick else 10000
    if threads:
        m = re.search(r"over ([\d,]+) threads", threads["title"])
        if m:
            lists = int(m.group(1).replace(",", ""))

    def bench(clients, args, keyspace=None):
        rate = redis_benchmark(a.redis_benchmark, a.port, clients, requests,
                               args, keyspace)
        print("  redis %-8s %3d clients %12.0f/s" % (args[0], clients, rate),
              file=sys.stderr, flush=True)
        return rate

    tables = []

    command(a.port, "FLUSHALL")
    rows = [[c, bench(c, ["INCR", "spindle:ids"])] for c in id_clients]
    tables.append({
        "title": "Redis INCR per second over loopback",
        "columns": ["clients", "Redis INCR"],
        "rows": rows,
        "notes": [
            "redis-benchmark -c CLIENTS -n %d INCR spindle:ids: every "
            "client increments one key, one request in flight per client "
            "(no pipelining), like the allocator's blocking clients."
            % requests],
        "beside": {"benchmark": "ids", "title": "IDs per second",
                   "versus": [["id_allocator", "Redis INCR"]]},
    })

    pair_counts = sorted(set(turn_clients) | set(server_clients))
    pushes, ranges = {}, {}
    for c in pair_counts:
        prefill(a.port, lists, 12)
        pushes[c] = bench(c, ["RPUSH", "turns:__rand_int__", TURN], lists)
        ranges[c] = bench(c, ["LRANGE", "turns:__rand_int__", "-12", "-1"],
                          lists)
    pair_note = (
        "One pair = RPUSH of a 45-byte turn + LRANGE -12 -1 (the last 12 "
        "turns) on lists picked at random among %s, each prefilled with "
        "12 turns: redis-benchmark -c CLIENTS -n %d -r %d, RPUSH and "
        "LRANGE measured separately, pairs/s = 1 / (1/RPUSH + 1/LRANGE). "
        "One request in flight per client (no pipelining)."
        % ("{:,}".format(lists), requests, lists))
    tables.append({
        "title": "Redis RPUSH + LRANGE per second over loopback",
        "columns": ["clients", "Redis RPUSH + LRANGE (pairs)", "RPUSH alone",
                    "LRANGE -12 -1 alone"],
        "rows": [[c, pair_rate(pushes[c], ranges[c]), pushes[c], ranges[c]]
                 for c in turn_clients],
        "notes": [pair_note],
        "chart_columns": ["Redis RPUSH + LRANGE (pairs)"],
        "beside": {"benchmark": "threads", "title": "add_turn + history",
                   "versus": [["handles (blocking)",
                               "Redis RPUSH + LRANGE (pairs)"],
                              ["actors, pipelined",
                               "Redis RPUSH + LRANGE (pairs)"]]},
    })

    pings = {c: bench(c, ["PING"]) for c in server_clients}
    tables.append({
        "title": "Redis per second at the server's connection counts, "
                 "over loopback",
        "columns": ["connections", "Redis RPUSH + LRANGE (pairs)",
                    "Redis PING"],
        "rows": [[c, pair_rate(pushes[c], ranges[c]), pings[c]]
                 for c in server_clients],
        "notes": [
            pair_note,
            "PING: redis-benchmark -c CONNECTIONS -n %d PING, the "
            "protocol's round-trip floor, as GET /healthz is the HTTP "
            "layer's." % requests],
        "beside": {"benchmark": "server", "title": "spindle serve",
                   "versus": [["messages req/s",
                               "Redis RPUSH + LRANGE (pairs)"],
                              ["healthz req/s", "Redis PING"]]},
    })

    version = subprocess.run([a.redis_benchmark, "--version"],
                             capture_output=True, text=True).stdout.strip()
    doc = {"benchmark": "redis", "baseline": True,
           "tool": version, "tables": tables}
    with open(os.path.join(a.results, "redis.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
