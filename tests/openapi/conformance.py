#!/usr/bin/env python3
"""Conformance: every answer the test suite's servers sent, as they
recorded it (SPINDLE_RECORD_RESPONSES, runtime/server/recorder.hpp), is an
answer docs/openapi.yaml declares (contract.py's rules).

Usage: conformance.py RECORD_DIR [--document docs/openapi.yaml]

Prints how many answers were checked per operation and status, every
operation no answer reached, and each undeclared answer with its request;
exits 1 on any undeclared answer."""
import argparse
import collections
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contract import Contract  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("record_dir")
    ap.add_argument("--document",
                    default=os.path.join(HERE, "..", "..", "docs",
                                         "openapi.yaml"))
    ap.add_argument("--show", type=int, default=40,
                    help="undeclared answers to print in full")
    args = ap.parse_args()
    contract = Contract(args.document)
    seen = collections.Counter()
    failures = []
    checked = set()
    total = 0
    for path in sorted(glob.glob(os.path.join(args.record_dir, "*.jsonl"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a killed server
                total += 1
                found = contract.match(r["method"],
                                       r["target"].split("?")[0])
                name = found[0] if found else f"{r['method']} (no route)"
                seen[(name, r["status"])] += 1
                # An answer the same as one checked already (the same
                # operation, status, media type, headers and body: a load
                # test's thousands of /healthz) is checked once.
                key = hash((name, r["status"], r.get("content_type", ""),
                            json.dumps(r.get("headers", [])),
                            r.get("body", ""), r.get("complete", True),
                            r.get("truncated", False)))
                if key in checked:
                    continue
                checked.add(key)
                problems = contract.check(
                    r["method"], r["target"], r["status"],
                    r.get("content_type", ""), r.get("headers", []),
                    r.get("body", ""), r.get("streamed", False),
                    r.get("complete", True), r.get("truncated", False))
                if problems:
                    failures.append((os.path.basename(path), n, r, problems))
    by_op = collections.defaultdict(dict)
    for (name, status), count in seen.items():
        by_op[name][status] = count
    for name in sorted(by_op):
        statuses = ", ".join(f"{s}: {c}" for s, c in sorted(by_op[name].items()))
        print(f"  {name}  {statuses}")
    unreached = [n for n, _ in contract.operations() if n not in by_op]
    if unreached:
        print(f"operations no answer reached ({len(unreached)}): "
              + ", ".join(unreached))
    print(f"{total} answers ({len(checked)} distinct) checked against "
          f"{args.document}: {total - len(failures)} as declared, "
          f"{len(failures)} undeclared")
    for file, n, r, problems in failures[:args.show]:
        print(f"UNDECLARED {file}:{n}: {r['method']} {r['target'][:200]} -> "
              f"{r['status']} {r.get('content_type', '')}")
        for p in problems:
            print(f"    {p}")
        print(f"    body: {r.get('body', '')[:300]!r}")
    if total == 0:
        # The tests that ran started no server (ctest -R of a few): nothing
        # to check. test_openapi shows that a server does record.
        print("no answers were recorded")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
