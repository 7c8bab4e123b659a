#!/usr/bin/env python3
"""Writes the fuzzing table of docs/reliability.md from tests/fuzz/runs.tsv.

usage: report.py RUNS_TSV MARKDOWN

RUNS_TSV holds one line per run of one target, as .ci/fuzz writes it:
date, target, seconds, executions, result (ok or finding). The table goes
between the markers `<!-- fuzz-table -->` and `<!-- /fuzz-table -->` of
MARKDOWN; everything else of the file is left as it is.
"""

import collections
import sys

BEGIN = "<!-- fuzz-table -->"
END = "<!-- /fuzz-table -->"


def duration(seconds):
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def table(rows):
    total = collections.OrderedDict()
    for date, target, seconds, execs, result in rows:
        t = total.setdefault(target, {"runs": 0, "seconds": 0, "execs": 0,
                                      "findings": 0, "last": ""})
        t["runs"] += 1
        t["seconds"] += int(seconds)
        t["execs"] += int(execs)
        t["findings"] += result != "ok"
        t["last"] = max(t["last"], date)
    lines = ["| target | runs | time run (h:mm:ss) | executions | "
             "executions/s | runs with a finding | last run |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for target, t in sorted(total.items()):
        rate = t["execs"] / t["seconds"] if t["seconds"] else 0
        lines.append(f"| `{target}` | {t['runs']} | {duration(t['seconds'])} "
                     f"| {t['execs']:,} | {rate:,.0f} | {t['findings']} "
                     f"| {t['last']} |")
    seconds = sum(t["seconds"] for t in total.values())
    lines.append("")
    lines.append(f"{len(total)} targets, {duration(seconds)} in all "
                 f"({seconds / 3600:.2f} hours).")
    return "\n".join(lines)


def main():
    runs_path, doc_path = sys.argv[1:3]
    with open(runs_path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f
                if line.strip() and not line.startswith("#")]
    with open(doc_path) as f:
        doc = f.read()
    start = doc.index(BEGIN) + len(BEGIN)
    end = doc.index(END)
    doc = doc[:start] + "\n" + table(rows) + "\n" + doc[end:]
    with open(doc_path, "w") as f:
        f.write(doc)


if __name__ == "__main__":
    main()
