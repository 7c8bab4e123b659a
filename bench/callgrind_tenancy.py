#!/usr/bin/env python3
"""Instructions per read with and without tenancy, counted by callgrind.

A steadier view than requests per second on a shared machine: the number
of instructions `spindle serve` executes (all of its threads) for one
GET /v1/threads/{id}, with tenancy off, with a tenant's key, and with an
end user's HS256 token (docs/tenants.md, "What it costs").

For each mode a server runs under `valgrind --tool=callgrind
--instr-atstart=no` with a data directory of its own: one tenant, one key
or token, one thread with one message; 200 GETs warm it up, collection is
turned on and zeroed, N GETs (default 2,000) are counted, and the counts
are dumped. It prints instructions per read for each mode and the
difference over off; with --diff, the functions whose own cost differs
the most. The scheduler's spinning moves the totals by about 2,000 per
read from run to run; the functions of the authentication path do not
move.

Usage
-----
    python3 bench/callgrind_tenancy.py [--build-dir build] [--reads N] [--diff]

Needs valgrind (callgrind_control, callgrind_annotate). Takes about a
minute; every server is stopped on exit and failure.
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ADMIN = "admin-secret-token-0123456789"
SECRET = "0123456789abcdef0123456789abcdef"


def b64(x):
    return base64.urlsafe_b64encode(x).rstrip(b"=")


def hs256_token(issuer, sub):
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"iss": issuer, "sub": sub,
                           "exp": int(time.time()) + 3600}).encode())
    sig = b64(hmac.new(SECRET.encode(), head + b"." + body,
                       hashlib.sha256).digest())
    return (head + b"." + body + b"." + sig).decode()


def count(exe, mode, reads, tmp):
    out_file = os.path.join(tmp, f"{mode}.callgrind")
    data = os.path.join(tmp, mode + "-data")
    args = [exe, "serve", "--port", "0", "--data", data, "--llm", "offline",
            "--log-level", "warn"]
    if mode != "off":
        args += ["--admin-token", ADMIN]
    log_path = os.path.join(tmp, mode + ".log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out_file}"] + args,
            stdout=log, stderr=subprocess.STDOUT)
    try:
        port = None
        for _ in range(1200):
            time.sleep(0.1)
            with open(log_path) as f:
                m = re.search(r"serving on http://[0-9.]+:(\d+)", f.read())
            if m:
                port = int(m.group(1))
                break
        if port is None:
            raise SystemExit(f"{mode}: the server printed no address")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

        def req(method, path, body=None, token=None):
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = "Bearer " + token
            conn.request(method, path,
                         json.dumps(body) if body is not None else None,
                         headers)
            r = conn.getresponse()
            return r.status, r.read()

        token, path = None, "/v1/threads/t0-bench-0"
        if mode != "off":
            _, d = req("POST", "/v1/tenants", {"name": "bench-0"}, ADMIN)
            tenant = json.loads(d)["id"]
            _, d = req("POST", f"/v1/tenants/{tenant}/keys", {}, ADMIN)
            token, path = json.loads(d)["key"], "/v1/threads/bench-0"
            if mode == "user":
                s, d = req("PUT", f"/v1/tenants/{tenant}/auth",
                           {"issuer": "https://b.example",
                            "hs256_secret": SECRET}, ADMIN)
                if s != 200:
                    raise SystemExit(f"PUT auth answered {s}: {d!r}")
                token = hs256_token("https://b.example", "u0")
                time.sleep(1)  # the settings reach the store's cache
        s, d = req("POST", path + "/messages", {"content": "hello"}, token)
        if s != 200:
            raise SystemExit(f"{mode}: the message answered {s}: {d!r}")
        for _ in range(200):
            req("GET", path, None, token)
        pid = str(proc.pid)
        subprocess.run(["callgrind_control", "-i", "on", pid],
                       capture_output=True, check=True)
        subprocess.run(["callgrind_control", "-z", pid],
                       capture_output=True, check=True)
        for _ in range(reads):
            s, _ = req("GET", path, None, token)
            if s != 200:
                raise SystemExit(f"{mode}: a read answered {s}")
        subprocess.run(["callgrind_control", "-d", pid],
                       capture_output=True, check=True)
    finally:
        proc.terminate()
        proc.wait()
    dumped = sorted(f for f in os.listdir(tmp)
                    if f.startswith(f"{mode}.callgrind."))
    if not dumped:
        raise SystemExit(f"{mode}: callgrind dumped nothing")
    return os.path.join(tmp, dumped[-1])


def own_costs(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no",
                          "--tree=none", "--auto=no", "--threshold=100",
                          path], capture_output=True, text=True,
                         check=True).stdout
    costs, total = {}, None
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9,]+)\s+\([^)]*\)\s+(.*)$", line)
        if not m:
            continue
        n, name = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in name:
            total = n
            continue
        name = re.sub(r"\s*\[[^\]]*\]$", "", name)
        costs[name] = costs.get(name, 0) + n
    return total, costs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--diff", action="store_true")
    a = ap.parse_args()
    exe = os.path.abspath(os.path.join(a.build_dir, "spindle"))
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"callgrind_tenancy: no spindle at {exe} "
                         "(build it, or give --build-dir)")
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"callgrind_tenancy: {tool} is missing "
                             "(apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="callgrind_tenancy-") as tmp:
        results = {m: own_costs(count(exe, m, a.reads, tmp))
                   for m in ("off", "key", "user")}
    off_total, off_costs = results["off"]
    print("| mode | instructions per read | over off |")
    print("|---|---:|---:|")
    for mode in ("off", "key", "user"):
        total = results[mode][0] / a.reads
        over = total - off_total / a.reads
        print(f"| {mode} | {total:,.0f} | {over:+,.0f} "
              f"({over * a.reads / off_total:+.1%}) |")
    if a.diff:
        for mode in ("key", "user"):
            costs = results[mode][1]
            diff = sorted(((costs.get(k, 0) - off_costs.get(k, 0)) / a.reads,
                           k) for k in set(costs) | set(off_costs))
            print(f"\n{mode} over off, by function (instructions per read):")
            for v, k in diff[::-1][:15]:
                print(f"  {v:+8.0f}  {k[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
