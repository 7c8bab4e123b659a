#!/usr/bin/env python3
"""Checks of the benchmark report (bench/run-report, bench/make_report.py).

  Generator  renders tests/golden/bench-report/ with make_report.py and
             checks the markdown (every table, baselines beside their
             tables, ratios, the Python benchmarks' sections, the failed
             benchmark, a benchmark's own baseline and the latency
             headline) and the SVG charts; unit checks of the
             throughput-column rule and of the sections' descriptions.
  RunReport  runs bench/run-report --quick on a fake build whose bench_*
             executables copy the fixture's figures (one fails), with a
             real redis-server whose port bench_orchestration is given:
             the Redis tables are measured, the Python benchmarks run on
             the fake build and fail (it has no spindle), the report is
             written and says so, the exit status is 1 and Redis is
             stopped. Where PostgreSQL is installed, every bench_*
             executable gets a database of its own on a throwaway server
             as SPINDLE_BENCH_PG, and the server is stopped.

Usage: bench_report_test.py [Generator|RunReport ...] (unittest names)
Python 3 standard library only.
"""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(SOURCE, "tests", "golden", "bench-report")
MAKE_REPORT = os.path.join(SOURCE, "bench", "make_report.py")
RUN_REPORT = os.path.join(SOURCE, "bench", "run-report")

spec = importlib.util.spec_from_file_location("make_report", MAKE_REPORT)
make_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_report)


def fixture(name):
    with open(os.path.join(FIXTURE, name + ".json")) as f:
        return json.load(f)


def section(text, heading):
    """The text from `heading` to the next heading of the same level."""
    start = text.index(heading)
    level = heading.split(" ")[0] + " "
    end = text.find("\n" + level, start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def svg_texts(path):
    root = ET.parse(path).getroot()
    return {"".join(e.itertext()).strip()
            for e in root.iter("{http://www.w3.org/2000/svg}text")}


class Generator(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.out = os.path.join(self.dir, "docs", "benchmarks.md")
        self.charts = os.path.join(self.dir, "docs", "benchmarks")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def render(self, results=FIXTURE):
        run = subprocess.run([sys.executable, MAKE_REPORT, "--results",
                              results, "--out", self.out],
                             capture_output=True, text=True, timeout=120)
        return run

    def test_report_has_every_table_with_its_baselines_and_charts(self):
        os.makedirs(self.charts)
        stale = os.path.join(self.charts, "ids-9.svg")
        other = os.path.join(self.charts, "diagram.svg")
        for path in (stale, other):
            with open(path, "w") as f:
                f.write("<svg/>")

        run = self.render()
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(self.out) as f:
            md = f.read()

        # The machine, the run and how to reproduce it.
        for text in ("## The machine", "| cores | 2 |", "RelWithDebInfo",
                     "c++ (Debian 12.2.0-14) 12.2.0", "commit 0000000",
                     "| Redis | Redis server v=7.0.15 |",
                     "0.50 0.40 0.30 at the start", "## Reproducing it",
                     "bench/run-report", "**This is a quick run**"):
            self.assertIn(text, md)

        # Every table of every benchmark, as a markdown table.
        for name in ("http", "ids", "server", "streams", "threads"):
            for table in fixture(name)["tables"]:
                part = section(md, "### " + make_report.escape(
                    table["title"]))
                header = "| " + " | ".join(
                    make_report.escape(c) for c in table["columns"]) + " |"
                self.assertIn(header, part)
                block = part[part.index(header):].split("\n\n")[0]
                self.assertEqual(len(block.splitlines()),
                                 len(table["rows"]) + 2, table["title"])

        # Each Redis table right after the table it compares to.
        ids = section(md, "### IDs per second")
        self.assertIn("**Baseline: Redis INCR per second over loopback**",
                      ids)
        threads = section(md, "### add_turn + history(12) per second")
        self.assertIn("**Baseline: Redis RPUSH + LRANGE", threads)
        server = section(md, "### spindle serve:")
        self.assertIn("**Baseline: Redis per second at the server's", server)
        self.assertNotIn("Baseline", section(md, "### File-counter"))

        # Ratios, from the fixture's own figures.
        ids_rows = fixture("ids")["tables"][0]["rows"]
        incr_rows = fixture("redis")["tables"][0]["rows"]
        expected = "%.2fx" % (ids_rows[-1][1] / incr_rows[-1][1])
        self.assertIn("| ids: id_allocator vs Redis INCR | 8 |", md)
        self.assertIn(expected, section(md, "## Headline"))
        self.assertIn("_`bench_ids --quick` ran in 9 s, load average 0.50 "
                      "when it started._", md)
        self.assertIn("**id_allocator / Redis INCR:** 1 client: ", ids)
        self.assertIn("8 clients: " + expected, ids)

        # The Python benchmarks: their docstrings up to "Usage", named as
        # scripts, their own ratio and target columns, no Redis beside.
        http = section(md, "## http")
        self.assertTrue(http.startswith(
            "## http\n\nspindle's HTTP throughput beside nginx, measured "
            "with wrk.\n\n1. GET /healthz on a throwaway nginx"), http[:300])
        for text in ("What it measures", "----", "Usage", "--quick"):
            self.assertNotIn(text, http.split("_`")[0])
        self.assertIn("_`bench/bench_http.py --quick` ran in 24 s, load "
                      "average 1.30 when it started._", http)
        healthz = fixture("http")["tables"][0]
        self.assertIn("| spindle req/s | nginx req/s | spindle / nginx | "
                      "target met (≥ 0.9x) |", http)
        self.assertIn("| 8 | %s | %s | %s | %s |" % (
            make_report.fmt_number(healthz["rows"][0][1]),
            make_report.fmt_number(healthz["rows"][0][2]),
            healthz["rows"][0][3], healthz["rows"][0][4]), http)
        self.assertIn("Target: spindle / nginx at least 0.9x", http)
        self.assertNotIn("Baseline", http)
        streams = section(md, "## streams")
        self.assertIn("Concurrent streamed exchanges through `spindle serve "
                      "--llm openai`.", streams)
        self.assertIn("the script reports\n\n- the time from sending", streams)
        self.assertIn("_`bench/bench_streams.py --quick` ran in 11 s", streams)
        self.assertIn("| upstream alone (baseline) |", streams)
        self.assertIn("_`bench_ids --quick` ran in", md)

        # The failed benchmark, with the end of its log.
        failed = section(md, "## What did not run")
        self.assertIn("`bench_broken`: exit status 134, no figures", failed)
        self.assertIn("fixture: failed on purpose", failed)

        # One chart per table with a client column, every line in it.
        expected_charts = {"ids-1.svg": ["id_allocator", "std::atomic counter",
                                         "Redis INCR"],
                           "threads-1.svg": ["mutex store",
                                             "actors, pipelined",
                                             "Redis RPUSH + LRANGE (pairs)"],
                           "server-1.svg": ["messages req/s", "healthz req/s",
                                            "Redis PING"],
                           "http-1.svg": ["spindle req/s", "nginx req/s"],
                           "http-2.svg": ["durable req/s", ":memory: req/s"]}
        self.assertEqual(sorted(os.listdir(self.charts)),
                         sorted(list(expected_charts) + ["diagram.svg"]))
        for name, lines in expected_charts.items():
            self.assertIn("](benchmarks/%s)" % name, md)
            texts = svg_texts(os.path.join(self.charts, name))
            for line in lines:
                self.assertIn(line, texts, name)
        texts = svg_texts(os.path.join(self.charts, "threads-1.svg"))
        self.assertNotIn("best actors / mutex", texts)
        self.assertNotIn("RPUSH alone", texts)
        self.assertNotIn("messages p50 ms",
                         svg_texts(os.path.join(self.charts, "server-1.svg")))
        texts = svg_texts(os.path.join(self.charts, "http-1.svg"))
        for column in ("spindle / nginx", "spindle p50 ms", "errors"):
            self.assertNotIn(column, texts)

    def test_a_benchmarks_own_baseline_and_latencies(self):
        run = self.render()
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(self.out) as f:
            md = f.read()
        spindle, redis = fixture("orchestration")["tables"]
        self.assertEqual(redis["beside"]["unit"], "ms")

        # Redis BLPOP, measured by bench_orchestration itself, follows the
        # waiting claim's table as its baseline, with the ratios.
        wakeup = section(md, "### Waiting claim wake-up")
        self.assertIn("**Baseline: %s**" % redis["title"], wakeup)
        self.assertNotIn("### " + redis["title"], md)
        self.assertNotIn("## Other baselines", md)
        p50 = [make_report.number(r[2]) / make_report.number(b[2])
               for r, b in zip(spindle["rows"], redis["rows"])]
        self.assertIn("**spindle p50 ms / Redis BLPOP p50 ms:** 1 waiter: "
                      "%.2fx; 64 waiters: %.2fx" % tuple(p50), wakeup)
        self.assertIn("**spindle p99 ms / Redis BLPOP p99 ms:**", wakeup)

        # Latencies have a headline table of their own, in milliseconds,
        # at the largest waiter count; no chart (waiters are no clients).
        headline = section(md, "## Headline")
        self.assertIn("| comparison | at | spindle ms | baseline ms | "
                      "spindle / baseline |", headline)
        self.assertIn("| orchestration: spindle p50 ms vs Redis BLPOP p50 "
                      "ms | 64 waiters | %s | %s | %.2fx |"
                      % (spindle["rows"][-1][2], redis["rows"][-1][2],
                         p50[-1]), headline)
        self.assertIn("lower is faster", headline)
        self.assertNotIn("orchestration", headline.split("| at |")[0])
        self.assertNotIn("orchestration-1.svg", md)

    def test_a_busy_machine_is_stated(self):
        results = os.path.join(self.dir, "busy")
        shutil.copytree(FIXTURE, results)
        with open(os.path.join(results, "run.txt"), "a") as f:
            f.write("load_start=5.25 3.00 2.00\n")
        run = self.render(results)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(self.out) as f:
            self.assertIn("**The machine was busy before the run started** "
                          "(load average 5.25 on 2 cores)", f.read())
        run = self.render()
        with open(self.out) as f:
            self.assertNotIn("busy", f.read())

    def test_no_figures_is_an_error(self):
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        run = self.render(empty)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("no benchmark figures", run.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_throughput_rule(self):
        cols = make_report.throughput_columns
        per_second = {"title": "Things per second", "columns": [
            "clients", "a", "a / b", "label", "c"],
            "rows": [[1, 10, 0.5, "x", "1,000"], [2, 20, 0.6, "y", "2,000.5"]]}
        self.assertEqual(cols(per_second), [1, 4])
        rates = {"title": "Load", "columns": [
            "connections", "req/s", "p50 ms", "errors"],
            "rows": [[1, 5.0, "0.1", 0], [8, 7.0, "0.2", 0]]}
        self.assertEqual(cols(rates), [1])
        not_clients = dict(per_second, columns=["window"] +
                           per_second["columns"][1:])
        self.assertEqual(cols(not_clients), [])
        chosen = dict(per_second, chart_columns=["c"])
        self.assertEqual(cols(chosen), [4])
        self.assertEqual(make_report.number("12,345.5"), 12345.5)
        self.assertIsNone(make_report.number("1.5x"))
        self.assertIsNone(make_report.number(True))

    def test_descriptions(self):
        bench = os.path.join(self.dir, "bench")
        os.makedirs(bench)
        with open(os.path.join(bench, "bench_py.py"), "w") as f:
            f.write('#!/usr/bin/env python3\n'
                    '"""Things & more, measured.\n\n'
                    'What it measures\n----------------\n'
                    '1. one thing, over two\n   lines;\n'
                    '2. another.\n\n'
                    'It reports\n- a list\n  item\n- another\n\n'
                    'Usage\n-----\n    python3 bench/bench_py.py\n"""\n')
        with open(os.path.join(bench, "bench_both.py"), "w") as f:
            f.write('"""The script."""\n')
        with open(os.path.join(bench, "bench_both.cpp"), "w") as f:
            f.write("// The executable:\n// one line.\n//\n"
                    "// Usage: bench_both\n")
        self.assertEqual(make_report.bench_description(self.dir, "py"),
                         "Things &amp; more, measured.\n\n"
                         "1. one thing, over two lines;\n2. another.\n\n"
                         "It reports\n- a list item\n- another")
        self.assertEqual(make_report.bench_name(self.dir, "py"),
                         "bench/bench_py.py")
        self.assertEqual(make_report.bench_description(self.dir, "both"),
                         "The executable: one line.")
        self.assertEqual(make_report.bench_name(self.dir, "both"),
                         "bench_both")
        self.assertEqual(make_report.bench_description(self.dir, "none"), "")
        self.assertEqual(make_report.bench_name(self.dir, "none"),
                         "bench_none")


def listening(url):
    """True if something accepts connections at the host and port of
    `url` (postgres://user@host:port/db)."""
    authority = url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    host, port = authority.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def redis_stopped(port):
    """True if nothing listens on `port`; otherwise shuts that Redis down
    (so a failing check leaves nothing behind) and returns False."""
    with socket.socket() as s:
        s.settimeout(1)
        if s.connect_ex(("127.0.0.1", port)) != 0:
            return True
        s.sendall(b"SHUTDOWN NOSAVE\r\n")
        return False


class RunReport(unittest.TestCase):
    def test_quick_run_on_a_fake_build(self):
        if not shutil.which("redis-server"):
            self.fail("redis-server is missing (.ci/install-deps)")
        work = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, work)
        bench = os.path.join(work, "build", "bench")
        os.makedirs(bench)
        args = os.path.join(work, "orchestration-args")
        for name in ("ids", "orchestration", "server", "threads"):
            path = os.path.join(bench, "bench_" + name)
            with open(path, "w") as f:
                f.write('#!/bin/sh\n'
                        '[ %s = orchestration ] && echo "$@" > "%s"\n'
                        'echo "${SPINDLE_BENCH_PG:-}" > "%s"\n'
                        'while [ $# -gt 0 ]; do\n'
                        '  [ "$1" = --json ] && cp "%s" "$2"\n'
                        '  shift\n'
                        'done\n' % (name, args,
                                     os.path.join(work, name + "-pg"),
                                     os.path.join(FIXTURE, name + ".json")))
            os.chmod(path, 0o755)
        broken = os.path.join(bench, "bench_broken")
        with open(broken, "w") as f:
            f.write("#!/bin/sh\necho 'broken on purpose' >&2\nexit 3\n")
        os.chmod(broken, 0o755)
        with open(os.path.join(bench, "bench_notes.txt"), "w") as f:
            f.write("not a benchmark\n")

        out = os.path.join(work, "out", "benchmarks.md")
        results = os.path.join(work, "results")
        # Output to a file, not a pipe: a Redis left running would hold a
        # pipe open and hang the check instead of failing it.
        log = os.path.join(work, "run-report.log")
        with open(log, "w") as f:
            code = subprocess.run([RUN_REPORT, "--quick", "--build-dir",
                                   os.path.join(work, "build"), "--out", out,
                                   "--results", results], stdout=f,
                                  stderr=subprocess.STDOUT,
                                  timeout=600).returncode
        facts = make_report.read_key_values(os.path.join(results,
                                                         "run.txt"))
        self.assertIn("redis_port", facts)
        # Redis is stopped once the report is written.
        self.assertTrue(redis_stopped(int(facts["redis_port"])))
        with open(log) as f:
            self.assertEqual(code, 1, f.read())

        with open(out) as f:
            md = f.read()
        self.assertIn("`bench_broken`: exit status 3", md)
        self.assertIn("broken on purpose", md)
        with open(os.path.join(results, "runs.tsv")) as f:
            runs = f.read()
        self.assertNotIn("notes", runs)
        # The Python benchmarks ran after the executables, on the fake
        # build (--build-dir), and their failures are in the report.
        areas = [line.split("\t")[0] for line in runs.splitlines()[1:]]
        scripts = ["cluster", "http", "limits", "streams", "sustained",
                   "tenants", "token_overshoot"]
        # bench_usage.py runs only beside the binary of the commit before
        # usage, when bench/build-baseline built it in this tree.
        if os.access(os.path.join(SOURCE, "build-baseline-usage",
                                  "spindle"), os.X_OK):
            scripts.append("usage")
        self.assertEqual(areas, ["broken", "ids", "orchestration",
                                 "server", "threads"] + scripts)
        # bench_orchestration got the running Redis, for BLPOP beside a
        # waiting claim.
        with open(args) as f:
            self.assertIn("--redis-port %s " % facts["redis_port"],
                          f.read())
        missing = os.path.join(work, "build", "spindle") + " not found"
        for name in scripts:
            self.assertIn("- `bench/bench_%s.py`: exit status 1, no figures"
                          % name, md)
            with open(os.path.join(results, name + ".log")) as f:
                self.assertIn(missing, f.read())
        # Redis was measured in this run, at the fixture's client counts.
        with open(os.path.join(results, "redis.json")) as f:
            redis = json.load(f)
        self.assertEqual([r[0] for r in redis["tables"][0]["rows"]],
                         [1, 2, 4, 8])
        self.assertEqual([r[0] for r in redis["tables"][2]["rows"]],
                         [1, 8, 64])
        for table in redis["tables"]:
            for row in table["rows"]:
                self.assertTrue(all(v > 0 for v in row[1:]), row)
        incr = "| %s |" % make_report.fmt_number(
            redis["tables"][0]["rows"][0][1])
        self.assertIn(incr, section(md, "### IDs per second"))
        for chart in ("ids-1.svg", "server-1.svg", "threads-1.svg"):
            self.assertTrue(os.path.exists(
                os.path.join(work, "out", "benchmarks", chart)), chart)
        self.assertTrue(facts["redis"].startswith("Redis server"))
        # PostgreSQL: each executable got a database of its own on the
        # throwaway server, which is stopped now.
        if facts["postgres"].startswith("PostgreSQL"):
            urls = {}
            for name in ("ids", "orchestration", "server", "threads"):
                with open(os.path.join(work, name + "-pg")) as f:
                    urls[name] = f.read().strip()
                self.assertRegex(urls[name], r"^postgres://.*/spindle_bench_"
                                 + name + "$")
            self.assertFalse(listening(urls["ids"]), urls["ids"])
            self.assertIn("| PostgreSQL | %s |" % facts["postgres"], md)
        else:
            self.assertTrue(facts["postgres"].startswith("not run"),
                            facts["postgres"])

    def test_usage_errors(self):
        run = subprocess.run([RUN_REPORT, "--frobnicate"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2)
        work = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, work)
        run = subprocess.run([RUN_REPORT, "--build-dir", work, "--out",
                              os.path.join(work, "x.md")],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2)
        self.assertIn("no bench_* executables", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
