#!/usr/bin/env python3
"""Writes the crash-matrix table of docs/reliability.md from
tests/crash/runs.tsv.

usage: report.py --add SUMMARY_LINE RUNS_TSV
       report.py RUNS_TSV MARKDOWN

--add appends one run: the summary line test_crash prints ("crash matrix:
seed S, K kills, T s, ... V violations"), dated today. Without it the table
of every recorded run goes between the markers `<!-- crash-table -->` and
`<!-- /crash-table -->` of MARKDOWN; the rest of the file is left as it is.
Python 3 standard library only.
"""

import datetime
import re
import sys

BEGIN = "<!-- crash-table -->"
END = "<!-- /crash-table -->"

SUMMARY = re.compile(
    r"crash matrix: seed (?P<seed>\d+), (?P<kills>\d+) kills, (?P<seconds>\d+) s, "
    r"(?P<folds>\d+) journal folds before the kills; acknowledged: "
    r"(?P<messages>\d+) messages, (?P<items>\d+) items, (?P<memories>\d+) memories, "
    r"(?P<tasks>\d+) tasks created, (?P<claims>\d+) claims, "
    r"(?P<completions>\d+) completions, (?P<ids>\d+) IDs; checked after restarts: "
    r"(?P<c_messages>\d+) messages, (?P<c_items>\d+) items, "
    r"(?P<c_memories>\d+) memories, (?P<c_trees>\d+) trees \((?P<c_tasks>\d+) tasks, "
    r"(?P<c_claims>\d+) claims, (?P<c_completions>\d+) completions\), "
    r"(?P<integrity>\d+) integrity checks; (?P<invariants>\d+) invariants, "
    r"(?P<violations>\d+) violations")

FIELDS = ["seed", "kills", "seconds", "folds", "messages", "items", "memories",
          "tasks", "claims", "completions", "ids", "c_messages", "c_items",
          "c_memories", "c_trees", "c_tasks", "c_claims", "c_completions",
          "integrity", "invariants", "violations"]


def n(x):
    return f"{int(x):,}"


def row(date, r):
    return (f"| {date} | {r['kills']} | {r['seed']} | {n(r['seconds'])} s | "
            f"{n(r['messages'])} messages, {n(r['items'])} items, "
            f"{n(r['memories'])} memories, {n(r['tasks'])} tasks created, "
            f"{n(r['claims'])} claims, {n(r['completions'])} completions, "
            f"{n(r['ids'])} IDs; {n(r['folds'])} journal folds before the kills "
            f"| {n(r['c_messages'])} of messages, {n(r['c_items'])} of items, "
            f"{n(r['c_memories'])} of memories, {n(r['c_trees'])} tree reads "
            f"({n(r['c_tasks'])} of tasks, {n(r['c_claims'])} of claims, "
            f"{n(r['c_completions'])} of completions); {n(r['integrity'])} "
            f"integrity checks; {n(r['invariants'])} invariants in all "
            f"| {r['violations']} |")


def main():
    args = sys.argv[1:]
    if args and args[0] == "--add":
        summary, runs_path = args[1], args[2]
        m = SUMMARY.search(summary)
        if not m:
            sys.exit("crash report: not a crash-matrix summary line")
        date = datetime.date.today().isoformat()
        with open(runs_path, "a") as f:
            f.write("\t".join([date] + [m.group(k) for k in FIELDS]) + "\n")
        return
    runs_path, doc_path = args
    lines = ["| date | kills | seed | duration | acknowledged | checks after "
             "the restarts, summed over them | violations |",
             "|---|---:|---:|---:|---|---|---:|"]
    with open(runs_path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            cells = line.rstrip("\n").split("\t")
            lines.append(row(cells[0], dict(zip(FIELDS, cells[1:]))))
    with open(doc_path) as f:
        doc = f.read()
    start = doc.index(BEGIN) + len(BEGIN)
    end = doc.index(END)
    doc = doc[:start] + "\n" + "\n".join(lines) + "\n" + doc[end:]
    with open(doc_path, "w") as f:
        f.write(doc)


if __name__ == "__main__":
    main()
