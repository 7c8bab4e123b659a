#!/usr/bin/env python3
"""Figures of a soak run (.ci/soak): its summary, the curve of the server's
memory, open files and threads, and the bounds it was judged by.

usage: report.py --print SAMPLES_TSV SUMMARY_JSON
       report.py --doc MARKDOWN [--chart SVG] [--status N] SAMPLES_TSV SUMMARY_JSON

SAMPLES_TSV is what tests/test_soak.cpp writes (seconds, rss_kib, anon_kib,
file_kib, fds, threads: one line a second); SUMMARY_JSON the line it prints
after "soak summary: ". --doc writes the figures between the markers
`<!-- soak-table -->` and `<!-- /soak-table -->` of MARKDOWN and leaves the
rest of the file as it is; --chart draws the curve with gnuplot (skipped,
with a word, when gnuplot is missing). Python 3 standard library only.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys

BEGIN = "<!-- soak-table -->"
END = "<!-- /soak-table -->"
ROWS = 15


def read_samples(path):
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        rows = []
        for line in f:
            if line.strip():
                values = line.rstrip("\n").split("\t")
                rows.append({k: float(v) for k, v in zip(header, values)})
    return rows


def mib(kib):
    return kib / 1024.0


def curve_rows(samples):
    """About ROWS samples, evenly spread, the last one included."""
    if not samples:
        return []
    step = max(1, len(samples) // ROWS)
    picked = samples[::step]
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    return picked


def verdicts(s):
    warm, later = s["anon_kib_warmup_max"], s["anon_kib_after_max"]
    first, last = s["anon_kib_first_third_mean"], s["anon_kib_last_third_mean"]
    return [
        ("heap (RssAnon) after the warm-up, at most its warm-up peak x 1.10 + 16 MiB",
         f"{mib(later):.1f} MiB against {mib(warm * 1.10 + 16 * 1024):.1f} MiB",
         later <= warm * 1.10 + 16 * 1024),
        ("heap drift, mean of the last third after the warm-up at most the "
         "first third's x 1.05 + 8 MiB",
         f"{mib(last):.1f} MiB against {mib(first * 1.05 + 8 * 1024):.1f} MiB",
         last <= first * 1.05 + 8 * 1024),
        ("open files after the warm-up, at most its peak + 16",
         f"{s['fds_after_max']} against {s['fds_warmup_max'] + 16}",
         s["fds_after_max"] <= s["fds_warmup_max"] + 16),
        ("threads after the warm-up, at most its peak + 2",
         f"{s['threads_after_max']} against {s['threads_warmup_max'] + 2}",
         s["threads_after_max"] <= s["threads_warmup_max"] + 2),
        ("stress: errors and invariant violations",
         f"{s['errors']} errors, {s['violations']} violations",
         s["errors"] == 0 and s["violations"] == 0),
    ]


def text(samples, s):
    out = [f"soak: {s['seconds']} s, {s['clients']} clients, "
           f"{s['operations']:,} operations ({s['throughput']:,.0f}/s), "
           f"warm-up {s['warmup_seconds']:.0f} s"]
    out.append(f"{'min':>6} {'RSS MiB':>9} {'heap MiB':>9} {'files MiB':>9} "
               f"{'fds':>5} {'threads':>7}")
    for r in curve_rows(samples):
        out.append(f"{r['seconds'] / 60:6.1f} {mib(r['rss_kib']):9.1f} "
                   f"{mib(r['anon_kib']):9.1f} {mib(r['file_kib']):9.1f} "
                   f"{int(r['fds']):5d} {int(r['threads']):7d}")
    for what, figure, ok in verdicts(s):
        out.append(f"{'ok  ' if ok else 'FAIL'} {what}: {figure}")
    return "\n".join(out)


def markdown(samples, s, status, chart):
    date = datetime.date.today().isoformat()
    ops = ", ".join(f"{k} {v['count']:,}"
                    for k, v in sorted(s["operations_by_kind"].items()))
    out = [f"Last run ({date}, `.ci/soak {s['seconds']} --clients "
           f"{s['clients']} --report`): {s['operations']:,} operations in "
           f"{s['seconds']} s ({s['throughput']:,.0f}/s: {ops}), "
           f"{s['errors']} errors, {s['violations']} invariant violations; "
           f"warm-up {s['warmup_seconds']:.0f} s, {s['samples']} samples; "
           f"the test {'passed' if status == 0 else 'FAILED'}.", ""]
    out.append("| bound | this run | held |")
    out.append("|---|---|---|")
    for what, figure, ok in verdicts(s):
        out.append(f"| {what} | {figure} | {'yes' if ok else 'no'} |")
    out.append("")
    # The allocator's figures, when the samples have them (jemalloc's
    # stats from /metrics): live objects and the pages holding them.
    alloc = bool(samples) and "allocated_kib" in samples[0]
    head = ("| minute | RSS (MiB) | heap, RssAnon (MiB) | mapped files, "
            "RssFile (MiB) | open files | threads |")
    rule = "|---:|---:|---:|---:|---:|---:|"
    if alloc:
        head += (" live objects, jemalloc allocated (MiB) | their pages, "
                 "active (MiB) | freed, not returned, dirty (MiB) |")
        rule += "---:|---:|---:|"
    out.append(head)
    out.append(rule)
    for r in curve_rows(samples):
        row = (f"| {r['seconds'] / 60:.1f} | {mib(r['rss_kib']):.1f} | "
               f"{mib(r['anon_kib']):.1f} | {mib(r['file_kib']):.1f} | "
               f"{int(r['fds'])} | {int(r['threads'])} |")
        if alloc:
            row += (f" {mib(r['allocated_kib']):.1f} | "
                    f"{mib(r['active_kib']):.1f} | "
                    f"{mib(r['dirty_kib']):.1f} |")
        out.append(row)
    if chart:
        out.append("")
        out.append(f"![The server's memory, open files and threads over the "
                   f"soak]({chart})")
    return "\n".join(out)


def draw(samples, path, warmup):
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("soak report: no gnuplot, no chart", file=sys.stderr)
        return False
    # At most about 600 points a line: the chart stays small to commit.
    samples = samples[::max(1, len(samples) // 600)]
    data = "\n".join(f"{r['seconds'] / 60:.3f} {mib(r['rss_kib']):.2f} "
                     f"{mib(r['anon_kib']):.2f} {mib(r['file_kib']):.2f} "
                     f"{int(r['fds'])} {int(r['threads'])}" for r in samples)
    script = f"""
set terminal svg size 820,420 dynamic font 'sans,11'
set output '{path}'
set xlabel 'minutes'
set ylabel 'MiB'
set y2label 'open files, threads'
set y2tics
set ytics nomirror
set key top left
set grid
set arrow from {warmup / 60:.3f}, graph 0 to {warmup / 60:.3f}, graph 1 nohead dt 2
$d << EOD
{data}
EOD
plot $d using 1:2 with lines lw 2 title 'RSS', \\
     $d using 1:3 with lines lw 2 title 'heap (RssAnon)', \\
     $d using 1:4 with lines lw 1 title 'mapped files (RssFile)', \\
     $d using 1:5 axes x1y2 with lines dt 3 title 'open files', \\
     $d using 1:6 axes x1y2 with lines dt 4 title 'threads'
"""
    subprocess.run([gnuplot], input=script, text=True, check=True)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--print", action="store_true")
    ap.add_argument("--doc")
    ap.add_argument("--chart")
    ap.add_argument("--status", type=int, default=0)
    ap.add_argument("samples")
    ap.add_argument("summary")
    args = ap.parse_args()
    samples = read_samples(args.samples)
    summary = json.loads(args.summary)
    if args.print:
        print(text(samples, summary))
    if args.doc:
        chart = None
        if args.chart and draw(samples, args.chart, summary["warmup_seconds"]):
            chart = os.path.relpath(args.chart, os.path.dirname(args.doc))
        with open(args.doc) as f:
            doc = f.read()
        start = doc.index(BEGIN) + len(BEGIN)
        end = doc.index(END)
        doc = (doc[:start] + "\n" + markdown(samples, summary, args.status,
                                             chart) + "\n" + doc[end:])
        with open(args.doc, "w") as f:
            f.write(doc)


if __name__ == "__main__":
    main()
