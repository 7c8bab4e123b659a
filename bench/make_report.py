#!/usr/bin/env python3
"""Renders the benchmark report from one run's raw figures.

Reads a results directory written by bench/run-report:
  <area>.json     one per benchmark (build/bench/bench_<area> or
                  bench/bench_<area>.py): {"benchmark", "machine",
                  "tables"}, each table {"title", "columns", "rows",
                  "notes"}; other keys are left alone
  *.json with "baseline": true
                  baseline documents (redis.json); each of their tables
                  names in "beside" the benchmark table it sits next to:
                  {"benchmark", "title" (a prefix of the table's title),
                   "versus": [[spindle column, baseline column], ...],
                   "unit" (optional): "ms" when the columns compared are
                   latencies (lower is faster), else they are rates}
                  A benchmark's own table with "beside" is a baseline too
                  (one the benchmark measured itself, such as Redis BLPOP
                  beside a waiting claim): it moves under the table it
                  names
  run.txt         key=value facts about the run (dates, load, build)
  runs.tsv        benchmark, exit status, seconds, load average (1 min)
                  when it started
  <area>.log      each benchmark's output (quoted when it failed)
and writes the markdown report and one SVG chart per chartable table
(drawn by gnuplot) into the directory named after the report. A
benchmark's section starts with the leading comment of
bench/bench_<area>.cpp, or else the docstring of bench/bench_<area>.py, up
to "Usage" (underlined headings left out).

Which tables get a chart, and which columns are throughput:
  - a table is charted when its first column is "clients", "connections"
    or "workers" and holds at least two distinct numbers;
  - its throughput columns are those listed in its "chart_columns", if
    present; otherwise every column whose cells are all numbers (or
    numbers written with thousands separators) and that is a rate: the
    name contains "/s", or the table's title says "per second"; a name
    containing " / " is a ratio and never plotted;
  - the baseline tables beside it add their throughput columns, by the
    same rule, as dashed lines.

Usage: make_report.py --results DIR --out FILE [--charts DIR]
                      [--source DIR] [--gnuplot PATH]
Python 3 standard library only; gnuplot draws the charts.
"""

import argparse
import ast
import glob
import json
import math
import os
import re
import subprocess
import sys

CLIENT_COLUMNS = ("clients", "connections", "workers")
NUMBER = re.compile(r"^-?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?$")
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
          "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728"]


# ---------------------------------------------------------------- input

def number(cell):
    """The cell as a float, or None when it is not a number."""
    if isinstance(cell, bool):
        return None
    if isinstance(cell, (int, float)):
        return float(cell)
    if isinstance(cell, str) and NUMBER.match(cell.strip()):
        return float(cell.strip().replace(",", ""))
    return None


def read_key_values(path):
    facts = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep:
                    facts[key] = value
    except OSError:
        pass
    return facts


def read_runs(path):
    runs = {}
    try:
        with open(path) as f:
            next(f, None)
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 3:
                    runs[parts[0]] = {"exit": int(parts[1]),
                                      "seconds": int(parts[2]),
                                      "load": (parts[3] if len(parts) > 3
                                               else "")}
    except OSError:
        pass
    return runs


def load_results(results):
    """(benchmarks by name, baseline documents), from the JSON files; a
    benchmark's tables with "beside" are taken out of it into a baseline
    document of their own."""
    benchmarks, baselines = {}, []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit("make_report: cannot read %s: %s" % (path, e))
        if not isinstance(doc, dict) or not isinstance(doc.get("tables"),
                                                       list):
            raise SystemExit("make_report: %s has no tables" % path)
        if doc.get("baseline"):
            baselines.append(doc)
            continue
        name = doc.get("benchmark") or os.path.basename(path)[:-5]
        own = [t for t in doc["tables"] if t.get("beside")]
        if own:
            doc["tables"] = [t for t in doc["tables"] if not t.get("beside")]
            baselines.append({"benchmark": name, "baseline": True,
                              "tables": own})
        benchmarks[name] = doc
    return benchmarks, baselines


def attach_baselines(benchmarks, baselines):
    """Puts each baseline table in the "baselines" list of the benchmark
    table it names; returns the tables that found no place."""
    unplaced = []
    for doc in baselines:
        for table in doc["tables"]:
            beside = table.get("beside") or {}
            target = None
            bench = benchmarks.get(beside.get("benchmark"))
            if bench:
                for t in bench["tables"]:
                    if t.get("title", "").startswith(beside.get("title",
                                                                "\0")):
                        target = t
                        break
            if target is None:
                unplaced.append(table)
            else:
                target.setdefault("baselines", []).append(table)
    return unplaced


def bench_script(source, area):
    """The path of bench/bench_<area>.py under `source` when the benchmark
    is a Python script (no bench/bench_<area>.cpp beside it), else None."""
    bench = os.path.join(source or "", "bench")
    script = os.path.join(bench, "bench_%s.py" % area)
    if os.path.exists(os.path.join(bench, "bench_%s.cpp" % area)) or \
            not os.path.exists(script):
        return None
    return script


def bench_name(source, area):
    """How the report names a benchmark: `bench_<area>` for an executable,
    `bench/bench_<area>.py` for a Python script."""
    return ("bench/bench_%s.py" % area if bench_script(source, area)
            else "bench_%s" % area)


def comment_lines(path):
    """The leading // comment of a C++ file, without the slashes."""
    text = []
    with open(path) as f:
        for line in f.read().splitlines():
            if not line.startswith("//"):
                break
            text.append(line[2:])
    return text


def docstring_lines(path):
    """The module docstring of a Python file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return (ast.get_docstring(tree) or "").splitlines()


def bench_description(source, area):
    """The leading comment of bench/bench_<area>.cpp (or the docstring of
    bench/bench_<area>.py), up to "Usage", as markdown paragraphs: numbered
    and "- " lines become a list, underlined headings are left out."""
    script = bench_script(source, area)
    try:
        if script:
            lines = docstring_lines(script)
        else:
            lines = comment_lines(os.path.join(source or "", "bench",
                                               "bench_%s.cpp" % area))
    except (OSError, SyntaxError, ValueError):
        return ""
    lines = [line.strip() for line in lines]
    text = []
    for i, line in enumerate(lines):
        if line.startswith("Usage"):
            break
        underline = re.compile(r"^[-=]{3,}$")
        if underline.match(line) or (i + 1 < len(lines) and line and
                                     underline.match(lines[i + 1])):
            continue
        text.append(line)
    paragraphs, current = [], []
    for line in text + [""]:
        if not line:
            if current:
                paragraphs.append(current)
            current = []
        elif re.match(r"^(\d+\.|-) ", line) or not current:
            current.append(line)
        else:
            current[-1] += " " + line
    out = []
    for p in paragraphs:
        out.append("\n".join(escape(item) for item in p))
    return "\n\n".join(out)


# ------------------------------------------------------------- tables

def client_column(table):
    cols = table.get("columns") or []
    return bool(cols) and cols[0].strip().lower() in CLIENT_COLUMNS


def throughput_columns(table):
    """Indices of the columns that are throughput (see the module doc)."""
    cols = table.get("columns") or []
    rows = table.get("rows") or []
    if not client_column(table) or not rows:
        return []
    wanted = table.get("chart_columns")
    per_second = "per second" in table.get("title", "").lower()
    out = []
    for i, name in enumerate(cols[1:], 1):
        if wanted is not None:
            if name not in wanted:
                continue
        elif " / " in name or not ("/s" in name or per_second):
            continue
        values = [number(row[i]) if i < len(row) else None for row in rows]
        if all(v is not None for v in values):
            out.append(i)
    return out


def series(table):
    """{column name: {clients: value}} for the throughput columns."""
    out = {}
    for i in throughput_columns(table):
        points = {}
        for row in table["rows"]:
            x = number(row[0])
            if x is not None:
                points[x] = number(row[i])
        out[table["columns"][i]] = points
    return out


def escape(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;")
            .replace(">", "&gt;"))


def fmt_number(v):
    if isinstance(v, int) and not isinstance(v, bool):
        return "{:,}".format(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if abs(v) >= 100:
        return "{:,.0f}".format(v)
    if abs(v) >= 10:
        return "{:.1f}".format(v)
    return "{:.2f}".format(v)


def cell_text(cell):
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        text = fmt_number(cell)
    elif isinstance(cell, str):
        text = cell
    else:
        text = json.dumps(cell)
    return escape(text).replace("|", "\\|")


def markdown_table(columns, rows):
    lines = ["| " + " | ".join(cell_text(c) for c in columns) + " |"]
    align = []
    for i in range(len(columns)):
        # Numbers, and "-" for what was not measured, align right.
        cells = [r[i] for r in rows if i < len(r) and r[i] != "-"]
        numeric = all(number(c) is not None for c in cells)
        align.append("---:" if numeric and cells else "---")
    lines.append("|" + "|".join(align) + "|")
    for r in rows:
        cells = [cell_text(c) for c in r]
        cells += [""] * (len(columns) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def count(x, unit):
    """'1 client', '8 clients' from a client count and its column name."""
    if x == 1 and unit.endswith("s"):
        unit = unit[:-1]
    return "%g %s" % (x, unit)


def ratio(a, b):
    if a is None or b is None or b <= 0:
        return "-"
    return "%.2fx" % (a / b)


def comparisons(table):
    """[(spindle column, baseline title, baseline column,
         [(clients, spindle, baseline)], unit)] for every "versus" pair;
    unit is "ms" for latencies, "/s" for rates."""
    out = []
    mine = {table["columns"][i]: i for i in range(len(table["columns"]))}
    for base in table.get("baselines", []):
        theirs = {c: i for i, c in enumerate(base["columns"])}
        beside = base.get("beside") or {}
        for pair in beside.get("versus", []):
            left, right = pair
            if left not in mine or right not in theirs:
                continue
            values = {}
            for row in base["rows"]:
                x = number(row[0])
                if x is not None:
                    values[x] = number(row[theirs[right]])
            points = []
            for row in table["rows"]:
                x = number(row[0])
                if x in values and mine[left] < len(row):
                    points.append((x, number(row[mine[left]]), values[x]))
            if points:
                out.append((left, base["title"], right, points,
                            beside.get("unit") or "/s"))
    return out


# ------------------------------------------------------------- charts

def gnuplot_string(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def chart(table, path, gnuplot):
    """Draws throughput against clients for `table` and its baselines into
    `path` (SVG). Returns False when the table has nothing to chart."""
    lines = [(name, pts, False) for name, pts in series(table).items()]
    for base in table.get("baselines", []):
        lines += [(name, pts, True) for name, pts in series(base).items()]
    xs = sorted({x for _, pts, _ in lines for x in pts})
    if len(xs) < 2 or not lines:
        return False
    data = []
    for x in xs:
        cells = []
        for _, pts, _ in lines:
            v = pts.get(x)
            cells.append("%.6g" % v if v is not None and v > 0 else "NaN")
        data.append("%g %s" % (x, " ".join(cells)))
    plots = []
    for k, (name, _, dashed) in enumerate(lines):
        plots.append(
            "$data using 1:%d with linespoints lw 2 pt %d ps 0.8 "
            "lc rgb %s dt %d title %s"
            % (k + 2, 7 if not dashed else 5, gnuplot_string(
                COLORS[k % len(COLORS)]), 2 if dashed else 1,
               gnuplot_string(name)))
    xlabel = table["columns"][0]
    keyrows = (len(lines) + 1) // 2
    height = 380 + 18 * keyrows
    script = "\n".join([
        "set terminal svg size 760,%d dynamic noenhanced "
        "font 'sans,11' background rgb 'white'" % height,
        "set output %s" % gnuplot_string(path),
        "set title %s" % gnuplot_string(table["title"]),
        "set xlabel %s offset 0,0.6" % gnuplot_string(xlabel),
        "set ylabel 'per second (log scale)'",
        "set logscale x 2",
        "set logscale y 10",
        "set xtics (%s)" % ", ".join("%s %g" % (gnuplot_string("%g" % x), x)
                                     for x in xs),
        "set xrange [%g:%g]" % (xs[0] / 1.25, xs[-1] * 1.25),
        "set format y '%.0s%c'",
        "set grid xtics ytics mytics lc rgb '#dddddd'",
        "set key outside below left Left reverse maxrows %d width 2"
        % keyrows,
        "$data << EOD",
        *data,
        "EOD",
        "plot " + ", \\\n     ".join(plots),
        "",
    ])
    try:
        run = subprocess.run([gnuplot], input=script, text=True,
                             capture_output=True, timeout=120)
    except FileNotFoundError:
        raise SystemExit("make_report: %s not found (Debian package "
                         "gnuplot-nox; .ci/install-deps installs it)"
                         % gnuplot)
    if run.returncode != 0 or not os.path.exists(path):
        raise SystemExit("make_report: gnuplot failed on %s:\n%s"
                         % (path, run.stderr))
    return True


# ------------------------------------------------------------- report

def machine_rows(benchmarks, run):
    machine = {}
    for doc in benchmarks.values():
        machine = doc.get("machine") or {}
        if machine:
            break
    rows = []

    def add(name, value):
        if value not in (None, ""):
            rows.append([name, value])

    add("CPU", machine.get("cpu"))
    add("cores", machine.get("cores"))
    if machine.get("memory_gib") is not None:
        add("memory", "%.1f GiB" % machine["memory_gib"])
    add("kernel", machine.get("kernel"))
    add("compiler", run.get("compiler"))
    build = run.get("build_type")
    add("build type", build or "unknown (no CMakeCache.txt)")
    spindle = re.sub(r"^spindle\s+", "", run.get("spindle", ""))
    commit = run.get("commit")
    if spindle or commit:
        add("spindle", ", ".join(x for x in (spindle, commit and
                                             "commit " + commit) if x))
    add("Redis", re.sub(r"\s+sha=.*", "", run.get("redis", "")))
    add("PostgreSQL", run.get("postgres"))
    add("charts", run.get("gnuplot"))
    if run.get("started"):
        add("date", "%s to %s" % (run["started"],
                                  run.get("finished", "?")))
    if run.get("load_start"):
        add("load average (1, 5, 15 min)",
            "%s at the start, %s at the end" % (run["load_start"],
                                                run.get("load_end", "?")))
    return rows


def busy_note(benchmarks, run):
    """A warning when the machine was already busy before the first
    benchmark started (1-minute load average above half the cores)."""
    cores = next((d["machine"].get("cores") for d in benchmarks.values()
                  if (d.get("machine") or {}).get("cores")), None)
    try:
        load = float(run.get("load_start", "").split()[0])
    except (IndexError, ValueError):
        return ""
    if not cores or load <= cores / 2:
        return ""
    return ("**The machine was busy before the run started** (load average "
            "%.2f on %d cores): other work competed with the benchmarks "
            "and with Redis, so these figures are lower and noisier than "
            "an idle machine's; compare figures within this run, not "
            "with another run's." % (load, cores))


def render(benchmarks, unplaced, run, runs, results, charts_dir,
           charts_rel, source, gnuplot):
    quick = run.get("quick") == "1"
    command = run.get("command") or "bench/run-report"
    md = []
    md.append("# Benchmarks\n")
    md.append("<!-- Generated by bench/run-report (bench/make_report.py); "
              "edit those, not this file. -->\n")
    md.append(
        "Figures from one run of every benchmark under `bench/`, each table "
        "beside its baselines measured in the same run: Redis over "
        "loopback, nginx answering the same HTTP request, the model "
        "upstream alone, the seed's bash protocols, and the `std::mutex` "
        "structures a C++ program would otherwise use. Made by `%s`."
        % command)
    if quick:
        md.append(
            "\n**This is a quick run** (`--quick`): sizes small enough for "
            "CI; the figures show that everything runs, not how fast.")
    md.append("")

    md.append("## The machine\n")
    md.append(markdown_table(["what", "this run"],
                             machine_rows(benchmarks, run)))
    md.append(
        "\nThe benchmarks ran one after another; in each, the clients, the "
        "actors (or Redis and redis-benchmark) share the machine's cores, "
        "so figures beyond the core count measure contention as much as "
        "throughput. Other work on the machine shows in the load average.")
    busy = busy_note(benchmarks, run)
    if busy:
        md.append("\n" + busy)
    md.append("")

    md.append("## Reproducing it\n")
    md.append("```sh\n"
              ".ci/build          # dependencies, a RelWithDebInfo build in "
              "build/\n"
              "bench/run-report   # every benchmark, the baselines, this "
              "file and its charts\n"
              "```\n")
    md.append(
        "`bench/run-report --quick` makes a CI-sized report; "
        "`--build-dir DIR` benchmarks another build, `--out FILE` writes "
        "elsewhere (charts go to the directory named after the file), "
        "`--results DIR` keeps the raw figures (default "
        "`BUILD_DIR/bench-report/`: one JSON and one log per benchmark). "
        "One benchmark alone: `build/bench/bench_ids [--quick] "
        "[--json PATH]`, or for a Python one `python3 bench/bench_http.py "
        "[--quick] [--build-dir build] [--json PATH]`.\n")

    md.append("## How the report is made\n")
    md.append(
        "- `bench/run-report` runs every executable `bench_*` of the "
        "build's `bench/` directory (one per `bench/bench_<area>.cpp`, so "
        "a new benchmark is picked up when it is built), from the source "
        "root, each with `--json`; then every `bench/bench_*.py` with "
        "`python3` and `--build-dir` (spindle serve over HTTP beside "
        "nginx with wrk, streamed exchanges through `--llm openai` "
        "beside the upstream alone).\n"
        "- Before them it starts Debian's `redis-server` on a free "
        "loopback port (no persistence) and gives its port to "
        "`bench_orchestration` (`--redis-port`), which measures Redis "
        "BLPOP's wake-up with the client code it measures a waiting "
        "claim's with; after them it runs `bench/redis_baseline.py` "
        "(redis-benchmark at the client counts the benchmarks used) and "
        "stops the server, also when something fails or the run is "
        "interrupted.\n"
        "- It also starts a throwaway PostgreSQL (`.ci/postgres`: "
        "loopback, fsync off, synchronous_commit on) and gives every "
        "`bench_*` executable a new database of it as `SPINDLE_BENCH_PG`, "
        "so that their PostgreSQL parts run (`bench_storage` beside "
        "pgbench, `bench_ids`, `bench_threads`' memory); it is stopped "
        "when they are done, also on errors. With `SPINDLE_BENCH_PG` set "
        "already, that database is used and no server is started.\n"
        "- `bench/make_report.py` writes this file. A baseline table "
        "follows the table it compares to, then the ratios and a chart.\n"
        "- Charts: a table gets one when its first column is "
        "`clients`, `connections` or `workers`. Plotted are its "
        "throughput columns: all-numeric columns whose name contains "
        "`/s`, or all of them when the title says \"per second\"; a name "
        "with ` / ` is a ratio and is left out. Baselines are dashed; "
        "both axes are logarithmic.\n"
        "- What the Redis lines measure: `bench_ids` and `bench_threads` "
        "call spindle inside the process, as a program embedding the "
        "library does; Redis is a separate server reached over loopback "
        "TCP, as a program using it would. `bench_server` is spindle "
        "over loopback HTTP, beside Redis at the same connection "
        "counts; `bench/bench_http.py` puts it beside nginx, both driven by "
        "wrk.\n"
        "- Wake-up latency (`bench_orchestration`, waiting claim beside "
        "Redis BLPOP): connections wait (a claim with `wait_s`, a BLPOP), "
        "and one client thread times each item from the producer sending "
        "it (POST /v1/orchestrations, LPUSH) to the complete answer of the "
        "waiter that got it, with raw sockets and poll() for both servers; "
        "each item comes 20 ms after the previous waiter waited again, "
        "which the servers' own counters confirm (claims the server held "
        "under 10 ms, clients INFO did not count as blocked: both must be "
        "0).\n")

    # Headline: every comparison at its largest shared client count,
    # rates and latencies in tables of their own.
    kinds = [("/s", ["comparison", "clients", "spindle /s", "baseline /s",
                     "spindle / baseline"],
              "At the largest client count both measured; every count is "
              "in the sections below."),
             ("ms", ["comparison", "at", "spindle ms", "baseline ms",
                     "spindle / baseline"],
              "Latencies, lower is faster (a ratio above 1x: spindle takes "
              "longer), at the largest count both measured; every count is "
              "in the sections below.")]
    headline = {unit: [] for unit, _, _ in kinds}
    for area in sorted(benchmarks):
        for table in benchmarks[area]["tables"]:
            for left, _, right, points, unit in comparisons(table):
                x, a, b = points[-1]
                if unit == "/s":
                    at, cells = "%g" % x, [a, b]
                else:  # milliseconds, to the microsecond
                    at = count(x, table["columns"][0])
                    cells = ["%.3f" % v if v is not None else None
                             for v in (a, b)]
                headline.setdefault(unit, []).append(
                    ["%s: %s vs %s" % (area, left, right), at] +
                    [v if v is not None else "-" for v in cells] +
                    [ratio(a, b)])
    if any(headline.values()):
        md.append("## Headline\n")
    for unit, columns, note in kinds:
        if headline[unit]:
            md.append(markdown_table(columns, headline[unit]))
            md.append("\n" + note + "\n")

    failed = []
    os.makedirs(charts_dir, exist_ok=True)
    written = set()
    for area in sorted(set(benchmarks) | set(runs)):
        info = runs.get(area, {})
        doc = benchmarks.get(area)
        if doc is None or info.get("exit", 0) != 0:
            failed.append(area)
        if doc is None:
            continue
        md.append("## %s\n" % area)
        about = bench_description(source, area)
        if about:
            md.append(about + "\n")
        if info:
            md.append("_`%s%s` ran in %d s%s._\n"
                      % (bench_name(source, area), " --quick" if quick else "",
                         info["seconds"],
                         ", load average %s when it started" % info["load"]
                         if info["load"] else ""))
        for index, table in enumerate(doc["tables"], 1):
            md.append("### %s\n" % escape(table.get("title", "")))
            md.append(markdown_table(table.get("columns", []),
                                     table.get("rows", [])))
            for note in table.get("notes", []):
                md.append("\n" + escape(note))
            md.append("")
            for base in table.get("baselines", []):
                md.append("**Baseline: %s**\n" % escape(base["title"]))
                md.append(markdown_table(base["columns"], base["rows"]))
                for note in base.get("notes", []):
                    md.append("\n" + escape(note))
                md.append("")
            for left, _, right, points, _ in comparisons(table):
                md.append("**%s / %s:** %s\n" % (
                    escape(left), escape(right),
                    "; ".join("%s: %s" % (count(x, table["columns"][0]),
                                          ratio(a, b))
                              for x, a, b in points)))
            name = "%s-%d.svg" % (area, index)
            if chart(table, os.path.join(charts_dir, name), gnuplot):
                written.add(name)
                md.append("![%s](%s/%s)\n" % (
                    escape(table.get("title", "")).replace("]", ")"),
                    charts_rel, name))

    if unplaced:
        md.append("## Other baselines\n")
        for base in unplaced:
            md.append("### %s\n" % escape(base.get("title", "")))
            md.append(markdown_table(base.get("columns", []),
                                     base.get("rows", [])))
            for note in base.get("notes", []):
                md.append("\n" + escape(note))
            md.append("")

    if failed or run.get("redis", "").startswith(("failed", "not run")):
        md.append("## What did not run\n")
        if run.get("redis", "").startswith(("failed", "not run")):
            md.append("- Redis baselines: %s\n" % escape(run["redis"]))
        for area in failed:
            info = runs.get(area, {})
            md.append("- `%s`: exit status %s%s\n" % (
                bench_name(source, area), info.get("exit", "?"),
                "" if area in benchmarks else ", no figures"))
            tail = log_tail(os.path.join(results, area + ".log"))
            if tail:
                md.append("```text\n%s\n```\n" % tail)

    # Charts of tables that no longer exist would mislead: remove them.
    for path in glob.glob(os.path.join(charts_dir, "*.svg")):
        name = os.path.basename(path)
        if re.match(r"^[A-Za-z0-9_]+-\d+\.svg$", name) and \
                name not in written:
            os.remove(path)
    return "\n".join(md).rstrip("\n") + "\n"


def log_tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--charts", help="default: FILE without .md")
    ap.add_argument("--source", default=os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--gnuplot", default="gnuplot")
    a = ap.parse_args()

    benchmarks, baselines = load_results(a.results)
    runs = read_runs(os.path.join(a.results, "runs.tsv"))
    if not benchmarks and not runs:
        raise SystemExit("make_report: no benchmark figures in " + a.results)
    run = read_key_values(os.path.join(a.results, "run.txt"))
    unplaced = attach_baselines(benchmarks, baselines)
    out = os.path.abspath(a.out)
    charts = os.path.abspath(a.charts or os.path.splitext(out)[0])
    charts_rel = os.path.relpath(charts, os.path.dirname(out))
    text = render(benchmarks, unplaced, run, runs, a.results, charts,
                  charts_rel, a.source, a.gnuplot)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
