#!/usr/bin/env python3
"""Messages per second as threads grow long and users store a lot.

What it measures
----------------
The load of a conversation server whose threads and users grow: wrk with
64 keep-alive connections POSTing /v1/threads/bench-K/messages over 64
thread IDs, each thread belonging to one of 16 users (user_id
`user-(K mod 16)`), each message 12 words drawn at random from 26 words x
1,000 numbers ("kilo417"), the offline provider, durable default settings
(a data directory: --sync full, group commit). Every exchange stores two
turns in its thread and one entry in its user's long-term memory, so at
the end of a 10-minute run each thread holds tens of thousands of turns
and each user hundreds of thousands of memories.

The run is cut into back-to-back wrk periods (10 s each; 5 s with
--quick). For each period it prints messages per second, latency, the
server's CPU microseconds per exchange (its threads' run time from
/proc/PID/task/*/schedstat, in nanoseconds), and the mean turns per thread
and memories per user reached.

Targets (issue: every message costs the same on a thread's 10,000th turn
as on its first):
- flat: the rate of the last minute is at least 0.9x the first minute's,
  with threads past 10,000 turns and users past 50,000 memories;
- speed: with --baseline-exe (the binary of the commit before the flat-cost
  work, built by `bench/build-baseline --commit 9c2246f`), the same load's
  first minute on it, measured in the same run, first: this build's first
  minute at least 1.5x that.

CPU per exchange at 10, 1,000 and 10,000 turns is read from the periods
whose turn range holds those lengths (the first period holds 10: threads
start empty; a --quick run may stop before 10,000).

Usage
-----
    python3 bench/bench_sustained.py --quick                 # ~1 minute
    bench/build-baseline --commit 9c2246f build-baseline-flat
    python3 bench/bench_sustained.py \
        --baseline-exe build-baseline-flat/spindle --json out.json

Options:
    --build-dir DIR     where the spindle executable is (default: build)
    --minutes M         length of the run (default 10; 1 with --quick)
    --period S          seconds per wrk period (default 10; 5 with --quick)
    --baseline-exe EXE  also run EXE's first minute, before this build's
    --data MODE         durable (default) or memory (--data :memory:)
    --json PATH         figures in the benchmark report's format

Needs wrk (.ci/install-deps installs it). Python 3 standard library only.
"""

import argparse
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_http  # noqa: E402  (the servers, wrk and its parser)

THREADS = 64
USERS = 16
CONNECTIONS = 64
FLAT_TARGET = 0.9
SPEED_TARGET = 1.5
MIN_TURNS = 10_000
MIN_MEMORIES = 50_000
MARKS = (10, 1_000, 10_000)

LUA = """-- POST /v1/threads/bench-K/messages, K over {threads} threads, each of
-- one of {users} users; 12 random words of 26 words x 1,000 numbers.
local words = {{"alpha","bravo","charlie","delta","echo","foxtrot","golf",
  "hotel","india","juliett","kilo","lima","mike","november","oscar","papa",
  "quebec","romeo","sierra","tango","uniform","victor","whiskey","xray",
  "yankee","zulu"}}
{preamble}
local seeded = false
function request()
  if not seeded then
    math.randomseed(os.time() + counter)
    seeded = true
  end
  local k = counter % {threads}
  counter = counter + 1
  local parts = {{}}
  for i = 1, 12 do
    parts[i] = words[math.random(26)] .. math.random(0, 999)
  end
  local body = '{{"content":"' .. table.concat(parts, " ")
    .. '","user_id":"user-' .. (k % {users}) .. '"}}'
  return wrk.format("POST", "/v1/threads/bench-" .. k .. "/messages",
                    headers, body)
end
"""


def cpu_ns(pid):
    """Run time of every thread of `pid` so far, in nanoseconds."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(path) as f:
                total += int(f.read().split()[0])
    return total


def run(exe, tmp, name, data_mode, minutes, period, lua, log):
    """Periods of wrk against a fresh server of `exe`: a list of dicts."""
    data = ":memory:" if data_mode == "memory" else os.path.join(tmp, name)
    points = []
    with contextlib.ExitStack() as stack:
        srv, url, _ = bench_http.start_spindle(exe, tmp, name, data, stack)
        pid = srv.proc.pid
        messages = 0
        started = time.monotonic()
        end = started + minutes * 60
        while time.monotonic() + period / 2 < end:
            before_cpu = cpu_ns(pid)
            turns_from = 2 * messages / THREADS
            r = bench_http.run_wrk(url, CONNECTIONS, int(period), lua)
            used = cpu_ns(pid) - before_cpu
            done = r.get("requests", 0)
            messages += done
            point = {
                "at_s": round(time.monotonic() - started, 1),
                "requests_per_sec": r["requests_per_sec"],
                "requests": done,
                "errors": r["errors"],
                "latency_ms": r["latency_ms"],
                "cpu_us_per_exchange": used / 1e3 / done if done else None,
                "turns_from": turns_from,
                "turns_to": 2 * messages / THREADS,
                "memories_per_user": messages / USERS,
            }
            points.append(point)
            log(f"  {name} {point['at_s']:6.1f}s {r['requests_per_sec']:9.0f}/s"
                f"  p99 {r['latency_ms'].get('p99', float('nan')):7.1f} ms"
                f"  cpu {point['cpu_us_per_exchange'] or 0:6.0f} us"
                f"  turns {point['turns_to']:8.0f}"
                f"  memories/user {point['memories_per_user']:8.0f}"
                + (f"  ERRORS {r['errors']}" if r["errors"] else ""))
            # Long-term memory stores that the exchange gave up waiting
            # for (the writer's queue is behind by more than 5 s).
            point["memory_timeouts"] = memory_timeouts(
                os.path.join(tmp, name + ".err"))
            if point["memory_timeouts"]:
                log(f"    memory stores timed out so far: "
                    f"{point['memory_timeouts']}")
            if not srv.alive():
                bench_http.fail(f"{name} exited during the run")
    return points


def memory_timeouts(path):
    """Exchanges whose long-term memory store timed out, from the log."""
    try:
        with open(path, errors="replace") as f:
            return sum(1 for line in f if "not stored: timeout" in line)
    except OSError:
        return 0


def minute_rate(points, period, last=False):
    """Messages per second over the first (or last) minute's periods."""
    n = max(1, round(60 / period))
    sel = points[-n:] if last else points[:n]
    return sum(p["requests"] for p in sel) / sum(
        p["requests"] / p["requests_per_sec"] for p in sel
        if p["requests_per_sec"])


def at_mark(points, turns):
    for p in points:
        if p["turns_from"] <= turns <= p["turns_to"]:
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--period", type=int)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baseline-exe")
    ap.add_argument("--data", choices=("durable", "memory"),
                    default="durable")
    ap.add_argument("--json")
    args = ap.parse_args()
    minutes = args.minutes or (1 if args.quick else 10)
    period = args.period or (5 if args.quick else 10)
    exe = os.path.abspath(os.path.join(args.build_dir, "spindle"))
    if not os.access(exe, os.X_OK):
        bench_http.fail(f"{exe} not found (run .ci/build)")
    bench_http.raise_fd_limit()

    def log(msg):
        print(msg, flush=True)

    result = {"settings": {"connections": CONNECTIONS, "threads": THREADS,
                           "users": USERS, "period_s": period,
                           "minutes": minutes, "data": args.data}}
    with tempfile.TemporaryDirectory(prefix="spindle-sustained-") as tmp:
        lua = os.path.join(tmp, "sustained.lua")
        with open(lua, "w") as f:
            f.write(LUA.format(threads=THREADS, users=USERS,
                               preamble=bench_http.LUA_PREAMBLE))
        if args.baseline_exe:
            log(f"baseline ({args.baseline_exe}): its first minute")
            result["baseline"] = run(os.path.abspath(args.baseline_exe),
                                     tmp, "baseline",
                                     args.data, 1, period, lua, log)
        log(f"this build ({exe}): {minutes:g} minutes")
        result["points"] = run(exe, tmp, "spindle", args.data, minutes,
                               period, lua, log)

    pts = result["points"]
    first = minute_rate(pts, period)
    last = minute_rate(pts, period, last=True)
    flat = last / first
    reached_turns = pts[-1]["turns_to"]
    reached_mem = pts[-1]["memories_per_user"]
    errors = sum(p["errors"] for p in pts)
    timeouts = pts[-1].get("memory_timeouts", 0)
    print()
    print(f"first minute {first:,.0f} messages/s, last minute {last:,.0f}: "
          f"{flat:.2f}x (target >= {FLAT_TARGET}x with threads at "
          f">= {MIN_TURNS:,} turns and users at >= {MIN_MEMORIES:,} "
          f"memories; reached {reached_turns:,.0f} and {reached_mem:,.0f})")
    print(f"long-term memory stores timed out: {timeouts:,} "
          f"(the memory writer fell behind)" if timeouts else
          "long-term memory stores timed out: 0")
    summary = {"memory_timeouts": timeouts,
               "first_minute": first, "last_minute": last, "flat": flat,
               "turns_reached": reached_turns,
               "memories_reached": reached_mem, "errors": errors}
    for mark in MARKS:
        p = at_mark(pts, mark)
        if p:
            print(f"CPU per exchange at {mark:,} turns: "
                  f"{p['cpu_us_per_exchange']:.0f} us (the period of "
                  f"{p['turns_from']:,.0f} to {p['turns_to']:,.0f} turns)")
            summary[f"cpu_us_at_{mark}"] = p["cpu_us_per_exchange"]
        else:
            print(f"CPU per exchange at {mark:,} turns: not reached")
    late = pts[-1]
    print(f"CPU per exchange at the end ({late['turns_to']:,.0f} turns): "
          f"{late['cpu_us_per_exchange']:.0f} us")
    summary["cpu_us_at_end"] = late["cpu_us_per_exchange"]
    ok = (flat >= FLAT_TARGET and reached_turns >= MIN_TURNS
          and reached_mem >= MIN_MEMORIES and errors == 0 and timeouts == 0)
    if args.baseline_exe:
        base = minute_rate(result["baseline"], period)
        speed = first / base
        print(f"first minute beside the baseline's ({base:,.0f} "
              f"messages/s): {speed:.2f}x (target >= {SPEED_TARGET}x)")
        summary["baseline_first_minute"] = base
        summary["speedup"] = speed
        ok = ok and speed >= SPEED_TARGET
    if errors:
        print(f"{errors} requests failed: the figures are not valid")
    print("targets met" if ok else "targets NOT met")
    result["summary"] = summary
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "sustained",
                       "machine": bench_http.machine(),
                       "tables": report_tables(result, period),
                       "figures": result}, f, indent=1)


def report_tables(result, period):
    """The run as the benchmark report's tables: one row a minute."""
    pts = result["points"]
    n = max(1, round(60 / period))
    rows = []
    for i in range(0, len(pts), n):
        sel = pts[i:i + n]
        done = sum(p["requests"] for p in sel)
        secs = sum(p["requests"] / p["requests_per_sec"] for p in sel
                   if p["requests_per_sec"])
        cpu = [p["cpu_us_per_exchange"] for p in sel
               if p["cpu_us_per_exchange"]]
        p99 = [p["latency_ms"].get("p99") for p in sel
               if p["latency_ms"].get("p99") is not None]
        rows.append([i // n + 1, f"{done / secs:,.0f}" if secs else "-",
                     f"{statistics.median(cpu):.0f}" if cpu else "-",
                     f"{max(p99):.1f}" if p99 else "-",
                     f"{sel[-1]['turns_to']:,.0f}",
                     f"{sel[-1]['memories_per_user']:,.0f}"])
    s = result["summary"]
    notes = [f"Long-term memory stores that timed out: "
             f"{s['memory_timeouts']:,}.",
             f"First minute {s['first_minute']:,.0f} messages/s, last "
             f"minute {s['last_minute']:,.0f}: {s['flat']:.2f}x (target "
             f">= {FLAT_TARGET}x)."]
    if "speedup" in s:
        notes.append(f"First minute beside the baseline binary's "
                     f"({s['baseline_first_minute']:,.0f} messages/s, "
                     f"measured first in the same run): {s['speedup']:.2f}x "
                     f"(target >= {SPEED_TARGET}x).")
    marks = [f"{m:,} turns: {s[f'cpu_us_at_{m}']:.0f} us"
             for m in MARKS if f"cpu_us_at_{m}" in s]
    notes.append("Server CPU per exchange at " + ", ".join(
        marks + [f"the end ({s['turns_reached']:,.0f} turns): "
                 f"{s['cpu_us_at_end']:.0f} us"]) + ".")
    return [{"title": "Sustained POST /v1/threads/{id}/messages: 64 "
                      "connections, 64 threads of 16 users, random texts, "
                      "durable, minute by minute",
             "columns": ["minute", "messages/s", "CPU us per exchange "
                         "(median)", "p99 ms (worst period)",
                         "turns per thread", "memories per user"],
             "rows": rows, "notes": notes}]


if __name__ == "__main__":
    main()
