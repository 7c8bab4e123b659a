#!/usr/bin/env python3
"""How far a tenant's tokens in any minute can pass its tokens_per_min.

What it measures
----------------
A tenant's calls to the model reserve their prompt's exact count plus
their reply's reserve when admitted, and are charged what they used when
they end (docs/limits.md, "The window, and what it guarantees"). The
guarantee: in any 60 consecutive whole seconds a tenant is charged at most
its tokens_per_min, as long as a reply uses no more than its reserve. The
target (the fair-use issue): the overshoot per tenant per minute is at
most one request's reservation. This measures it against a real upstream
over more than 60 s.

The upstream is spindle_fake_upstream (tests/fake_upstream.cpp) with
--use-max-tokens: an OpenAI-compatible server on the network whose reply
is "the" said from half of the request's max_tokens to all of it, in turn
(so each call uses between half and all of its reply's reserve, as real
replies do), streamed over --stream-seconds 0.4 (calls overlap and hold
reservations while they stream). spindle serve reaches it with --llm
openai. Tenancy is on, with five tenants, each with tokens_per_min 6,000
and reply_reserve 200 (PATCH /v1/tenants/{id} {"limits": ...}): with
tokens_per_min, a reply that sets no max_tokens is sent with max_tokens =
reply_reserve, its bound.

The load, the shape users give it, a hot tenant and others: 32 client
threads of this script, each on a keep-alive connection, for 75 s; 16 of
them on the hot tenant, 4 on each other. Each POSTs
/v1/threads/tI-K/messages (K over 8 threads per client) with the
tenant's key and
a message of 12 words drawn from bench_usage.py's vocabulary (about one
in four a random number); a 429
(the tenant's window is full: the load keeps every tenant at its limit)
is followed by a pause of 50 ms, never the Retry-After, so that calls
arrive the moment the window lets one through.

Each answer with 200 carries the exchange's usage (prompt_tokens,
completion_tokens, total_tokens: what it was charged). The script files
each charge in the whole second of CLOCK_MONOTONIC at which its answer
arrived (the clock the server's window counts in, so the seconds are the
server's), and for each tenant takes every run of 60 consecutive seconds
of the load: the largest sum of charges in one is the tenant's worst
minute. overshoot = worst minute - tokens_per_min (0 when under); the
largest reservation is the largest prompt charged plus the reply
reserve. An answer arrives a few milliseconds after the server charged
it, so a charge made at the very end of a second can be filed in the
next one: the figure is the server's to within such a charge. Also shown: the
worst minute as a share of the limit (how much of its limit a saturated
tenant gets), the calls admitted and refused.

Usage
-----
    python3 bench/bench_token_overshoot.py                  # ~90 s
    python3 bench/bench_token_overshoot.py --json out.json

Options:
    --build-dir DIR   where spindle and tests/spindle_fake_upstream are
                      (default: build)
    --duration S      seconds of load (default 75; at least 61)
    --quick           62 s of load (a minute is the least it can measure)
    --json PATH       write the table as JSON in the benchmark report's
                      format ({"benchmark": "token_overshoot", "machine",
                      "tables"}, bench/make_report.py), with every
                      tenant's per-second charges under "figures"

Python 3 standard library only. Both servers run from a temporary
directory removed at the end and are stopped on exit, failure and Ctrl-C.
"""

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_http as bh  # noqa: E402  (servers, machine, tables)
import bench_usage as bu  # noqa: E402  (the messages' vocabulary)

ADMIN = "bench-admin-token-0123456789abcdef"
TENANTS = 5
CLIENTS = {0: 16, 1: 4, 2: 4, 3: 4, 4: 4}  # tenant -> client threads
THREADS_PER_CLIENT = 8
TOKENS_PER_MIN = 6000
REPLY_RESERVE = 200
STREAM_SECONDS = 0.4
PAUSE_AFTER_429 = 0.05
WINDOW = 60


def fail(msg):
    raise SystemExit("bench_token_overshoot: " + msg)


def wait_for_line(path, pattern, proc, what, timeout=30):
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with open(path, errors="replace") as f:
                m = rx.search(f.read())
            if m:
                return m
        if not proc.alive():
            fail(f"{what} exited with {proc.proc.returncode}:\n"
                 + bh.tail(path))
        time.sleep(0.05)
    fail(f"{what} printed nothing matching {pattern!r} in {timeout} s:\n"
         + bh.tail(path))


def call(conn, method, path, token, body=None):
    headers = {"Authorization": "Bearer " + token}
    data = None
    if body is not None:
        data = json.dumps(body)
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    text = r.read()
    return r.status, (json.loads(text) if text else None)


def client(host, port, key, tenant, index, until, out, lock):
    rng = random.Random(1000 * tenant + index)
    conn = http.client.HTTPConnection(host, port, timeout=30)
    admitted = refused = 0
    charges = []
    n = 0
    while time.monotonic() < until:
        thread = f"t{index}-{n % THREADS_PER_CLIENT}"
        n += 1
        words = bu.setup_message(rng)
        status, body = call(conn, "POST", f"/v1/threads/{thread}/messages",
                            key, {"content": words})
        arrived = time.monotonic()
        if status == 200:
            admitted += 1
            u = body["usage"]
            charges.append((arrived, u["total_tokens"], u["prompt_tokens"]))
        elif status == 429:
            refused += 1
            time.sleep(PAUSE_AFTER_429)
        else:
            fail(f"tenant {tenant} got {status}: {body}")
    conn.close()
    with lock:
        out[tenant]["admitted"] += admitted
        out[tenant]["refused"] += refused
        out[tenant]["charges"].extend(charges)


def worst_minute(charges, start, end):
    """The largest sum of charges over 60 consecutive whole seconds of
    [start, end), and the per-second sums."""
    first, last = int(start), int(end)
    per_second = {s: 0 for s in range(first, last + 1)}
    for at, tokens, _ in charges:
        per_second[int(at)] = per_second.get(int(at), 0) + tokens
    seconds = sorted(per_second)
    worst = 0
    for s in seconds:
        total = sum(per_second.get(s + k, 0) for k in range(WINDOW))
        worst = max(worst, total)
    return worst, per_second


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--duration", type=float)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.duration is None:
        args.duration = 62 if args.quick else 75
    if args.duration < WINDOW + 1:
        fail("--duration must be at least 61 s")
    exe = os.path.abspath(os.path.join(args.build_dir, "spindle"))
    fake = os.path.abspath(os.path.join(args.build_dir, "tests",
                                        "spindle_fake_upstream"))
    for p in (exe, fake):
        if not os.access(p, os.X_OK):
            fail(f"{p} not found: build first (.ci/build)")

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(
            prefix="bench_token_overshoot."))
        up_out = os.path.join(tmp, "upstream.out")
        up = bh.Server("spindle_fake_upstream",
                       [fake, "--port", "0", "--use-max-tokens",
                        "--stream-seconds", str(STREAM_SECONDS),
                        "--chunks", "8", "--exit-with-parent"],
                       up_out, os.path.join(tmp, "upstream.err"), cwd=tmp)
        stack.callback(up.stop)
        m = wait_for_line(up_out, r"(\d+)", up, "spindle_fake_upstream")
        up_port = int(m.group(1))
        out = os.path.join(tmp, "spindle.out")
        err = os.path.join(tmp, "spindle.err")
        srv = bh.Server("spindle",
                        [exe, "serve", "--port", "0", "--data", ":memory:",
                         "--admin-token", ADMIN, "--llm", "openai",
                         "--llm-url", f"http://127.0.0.1:{up_port}",
                         "--llm-model", "fake", "--log-level", "warn"],
                        out, err, cwd=tmp)
        stack.callback(srv.stop)
        m = wait_for_line(out, r"serving on http://([0-9.]+):(\d+)", srv,
                          "spindle")
        host, port = m.group(1), int(m.group(2))
        admin = http.client.HTTPConnection(host, port, timeout=30)
        keys = {}
        for t in range(TENANTS):
            status, tenant = call(admin, "POST", "/v1/tenants", ADMIN,
                                  {"name": f"tenant {t}",
                                   "limits": {"tokens_per_min": TOKENS_PER_MIN,
                                              "reply_reserve": REPLY_RESERVE}})
            if status != 201:
                fail(f"POST /v1/tenants answered {status}: {tenant}")
            status, key = call(admin, "POST",
                               f"/v1/tenants/{tenant['id']}/keys", ADMIN, {})
            if status != 201:
                fail(f"POST .../keys answered {status}: {key}")
            keys[t] = key["key"]

        results = {t: {"admitted": 0, "refused": 0, "charges": []}
                   for t in range(TENANTS)}
        lock = threading.Lock()
        start = time.monotonic()
        until = start + args.duration
        threads = []
        for t, n in CLIENTS.items():
            for i in range(n):
                th = threading.Thread(target=client, args=(
                    host, port, keys[t], t, i, until, results, lock))
                th.start()
                threads.append(th)
        for th in threads:
            th.join()
        end = time.monotonic()

    rows = []
    figures = {}
    worst_over = 0
    worst_reservation = 0
    for t in range(TENANTS):
        r = results[t]
        worst, per_second = worst_minute(r["charges"], start, end)
        biggest_prompt = max((p for _, _, p in r["charges"]), default=0)
        reservation = biggest_prompt + REPLY_RESERVE
        over = max(0, worst - TOKENS_PER_MIN)
        worst_over = max(worst_over, over)
        worst_reservation = max(worst_reservation, reservation)
        rows.append([f"tenant {t}" + (" (hot)" if t == 0 else ""),
                     CLIENTS[t], f"{TOKENS_PER_MIN:,}", f"{worst:,}",
                     f"{worst / TOKENS_PER_MIN:.2f}", over,
                     reservation, f"{r['admitted']:,}", f"{r['refused']:,}"])
        figures[f"tenant {t}"] = {
            "per_second": {str(s - int(start)): v
                           for s, v in sorted(per_second.items())},
            "admitted": r["admitted"], "refused": r["refused"]}
    columns = ["tenant", "clients", "tokens_per_min", "worst minute",
               "worst / limit", "overshoot", "largest reservation",
               "admitted", "refused (429)"]
    print(bh.table(columns, rows))
    verdict = ("met" if worst_over <= worst_reservation else "NOT met")
    note = (f"{args.duration:.0f} s of load against spindle_fake_upstream "
            f"(--use-max-tokens, {STREAM_SECONDS} s streams) through "
            f"--llm openai; target: overshoot at most one request's "
            f"reservation ({worst_reservation} tokens here): {verdict} "
            f"(largest overshoot {worst_over}).")
    print(note)
    if args.json:
        doc = {"benchmark": "token_overshoot", "machine": bh.machine(),
               "tables": [{"title": "Token accounting: each tenant's worst "
                                    "60 s beside its tokens_per_min",
                           "columns": columns, "rows": rows,
                           "notes": [note]}],
               "figures": figures}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if worst_over > worst_reservation:
        sys.exit(1)


if __name__ == "__main__":
    main()
