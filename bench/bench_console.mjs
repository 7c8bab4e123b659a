// The console's benchmark (docs/console.md, "Figures"), in Debian's
// Chromium through playwright-core, against `spindle serve` on loopback:
//
// 1. First load, a fresh browser context each time (no cache): bytes
//    transferred (the browser's Resource Timing transferSize: headers and
//    bodies of the page, its modules and stylesheet, and the first API
//    answers) and the time from navigation start to the first data on
//    screen (the page's own `spindle:interactive` mark, User Timing).
//    Targets: under 200 KB and under 300 ms.
// 2. A tree of 2,000 tasks updating at 100 events/s (claims and
//    completions) for 10 s: frame times from Chromium's tracing (the
//    intervals between the page's main-thread frames, BeginMainThreadFrame),
//    p50, p95 and max, the work in each frame (AnimationFrame spans),
//    dropped frames and main-thread tasks over 50 ms; beside them the
//    page's own requestAnimationFrame intervals and its measure of
//    applying each read of the tree. Target: p95 under 50 ms.
//
// usage: tests/console/run.sh --bench SPINDLE_BINARY SCRATCH_DIR
// Prints each figure beside its target, and the figures as JSON last.

import { call, launch, newPage, startServer } from "./harness.mjs";

const [binary] = process.argv.slice(2);
const LOADS = 7;
const TASKS = 2000;
const RATE = 100; // events per second
const SECONDS = 10;

const pct = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)] : NaN;
};
const figures = {};
const line = (name, value, unit, target, ok) => console.log(`${name.padEnd(44)} ${String(value).padStart(9)} ${unit.padEnd(4)} target ${target.padEnd(10)} ${ok ? "ok" : "MISSED"}`);

const server = await startServer(binary);
const browser = await launch();
try {
  // -- 1. first load ----------------------------------------------------------
  // A few threads so the first page of the list has data.
  for (let i = 0; i < 5; ++i) await call(server.base, "POST", "/v1/threads", { metadata: { n: String(i) } });
  const bytes = [];
  const tti = [];
  const assets = [];
  for (let i = 0; i < LOADS; ++i) {
    const page = await newPage(browser);
    await page.goto(server.base + "/");
    await page.waitForFunction(() => performance.getEntriesByName("spindle:interactive").length > 0);
    const m = await page.evaluate(() => {
      const nav = performance.getEntriesByType("navigation")[0];
      const res = performance.getEntriesByType("resource");
      const all = [nav, ...res];
      return {
        bytes: all.reduce((n, e) => n + (e.transferSize || 0), 0),
        assets: all.filter((e) => !e.name.includes("/v1/")).reduce((n, e) => n + (e.transferSize || 0), 0),
        interactive: performance.getEntriesByName("spindle:interactive")[0].startTime,
      };
    });
    if (page.errors.length) throw new Error(page.errors.join("\n"));
    bytes.push(m.bytes);
    assets.push(m.assets);
    tti.push(m.interactive);
    await page.context().close();
  }
  figures.first_load_bytes = Math.max(...bytes);
  figures.first_load_asset_bytes = Math.max(...assets);
  figures.first_load_interactive_ms_median = +pct(tti, 0.5).toFixed(1);
  figures.first_load_interactive_ms_max = +Math.max(...tti).toFixed(1);
  line("first load: bytes transferred (max of " + LOADS + ")", (figures.first_load_bytes / 1024).toFixed(1), "KB", "< 200 KB", figures.first_load_bytes < 200 * 1024);
  line("  of which the page, modules and stylesheet", (figures.first_load_asset_bytes / 1024).toFixed(1), "KB", "", true);
  line("first load: time to interactive, median", figures.first_load_interactive_ms_median, "ms", "< 300 ms", figures.first_load_interactive_ms_median < 300);
  line("first load: time to interactive, max", figures.first_load_interactive_ms_max, "ms", "< 300 ms", figures.first_load_interactive_ms_max < 300);

  // -- 2. a tree of 2,000 tasks at 100 events/s ---------------------------------
  const o = (await call(server.base, "POST", "/v1/orchestrations", { payload: "bench" })).body.id;
  let made = 1;
  const parents = [];
  for (let i = 0; i < 40; ++i) parents.push((await call(server.base, "POST", `/v1/tasks/${o}/subtasks`, { payload: i })).body.id), ++made;
  for (let i = 0; made < TASKS; ++i, ++made) await call(server.base, "POST", `/v1/tasks/${parents[i % parents.length]}/subtasks`, { payload: i });
  const page = await newPage(browser);
  await page.goto(server.base + "/#/tasks");
  await page.waitForFunction((n) => document.querySelectorAll("li.task").length >= n, TASKS, { timeout: 60000 });
  await page.waitForFunction(() => document.querySelector("#live")?.dataset.state === "live");
  await browser.startTracing(page, { categories: ["devtools.timeline", "disabled-by-default-devtools.timeline.frame", "toplevel"] });
  // The page's own frames too (requestAnimationFrame intervals), as a check.
  await page.evaluate(() => {
    window.__frames = [];
    let last = performance.now();
    const tick = (t) => {
      window.__frames.push(t - last);
      last = t;
      if (!window.__stop) requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  });
  const start = Date.now();
  let events = 0;
  const claims = [];
  while (Date.now() - start < SECONDS * 1000) {
    // Half the events are claims, half completions of an earlier claim.
    const due = start + (events * 1000) / RATE;
    if (due > Date.now()) await new Promise((r) => setTimeout(r, due - Date.now()));
    if (claims.length && events % 2 === 1) {
      const c = claims.shift();
      await call(server.base, "POST", `/v1/tasks/${c.id}/complete`, { lease: c.lease.token, result: 1 });
    } else {
      const c = await call(server.base, "POST", "/v1/tasks/claim", { worker: "bench", lease_s: 600 });
      if (c.status === 200) claims.push(c.body);
    }
    ++events;
  }
  const elapsed = (Date.now() - start) / 1000;
  await page.waitForTimeout(1500); // the last events and the refresh after them
  const raw = await browser.stopTracing();
  if (process.env.SPINDLE_TRACE_OUT) (await import("node:fs")).writeFileSync(process.env.SPINDLE_TRACE_OUT, raw);
  const trace = JSON.parse(raw.toString("utf8"));
  const raf = await page.evaluate(() => ((window.__stop = true), window.__frames.slice(1)));
  // The page's own measure of applying each read of the tree.
  const applies = await page.evaluate(() => performance.getEntriesByName("spindle:tree-apply").slice(1).map((e) => e.duration));
  if (page.errors.length) throw new Error(page.errors.join("\n"));
  const list = trace.traceEvents || trace;
  // Frame times of the page's main thread: the intervals between its
  // frames (BeginMainThreadFrame), and the work of each frame (an
  // AnimationFrame span: from the first task of the frame to its render).
  const begins = list.filter((e) => e.name === "BeginMainThreadFrame").map((e) => e.ts).sort((a, b) => a - b);
  const frameMs = begins.slice(1).map((t, i) => (t - begins[i]) / 1000);
  const open = new Map();
  const workMs = [];
  for (const e of list) {
    if (e.name !== "AnimationFrame") continue;
    if (e.ph === "b") open.set(e.id2?.local ?? e.id, e.ts);
    else if (e.ph === "e" && open.has(e.id2?.local ?? e.id)) workMs.push((e.ts - open.get(e.id2?.local ?? e.id)) / 1000);
  }
  const dropped = list.filter((e) => e.name === "DroppedFrame").length;
  // Tasks of the page's main thread (the renderer that made the frames)
  // over 50 ms.
  const renderer = list.find((e) => e.name === "BeginMainThreadFrame")?.pid;
  const longTasks = list.filter((e) => e.pid === renderer && e.name === "ThreadControllerImpl::RunTask" && e.dur > 50000).length;
  figures.tree_tasks = TASKS;
  figures.tree_events_per_s = +(events / elapsed).toFixed(1);
  figures.tree_frames = frameMs.length + 1;
  figures.tree_frame_ms_p50 = +pct(frameMs, 0.5).toFixed(1);
  figures.tree_frame_ms_p95 = +pct(frameMs, 0.95).toFixed(1);
  figures.tree_frame_ms_max = +Math.max(...frameMs).toFixed(1);
  figures.tree_frame_work_ms_p95 = +pct(workMs, 0.95).toFixed(1);
  figures.tree_frame_work_ms_max = +Math.max(...workMs).toFixed(1);
  figures.tree_dropped_frames = dropped;
  figures.tree_raf_ms_p95 = +pct(raf, 0.95).toFixed(1);
  figures.tree_long_tasks_over_50ms = longTasks;
  figures.tree_apply_ms_p50 = +pct(applies, 0.5).toFixed(1);
  figures.tree_apply_ms_max = +Math.max(...applies).toFixed(1);
  line(`tree of ${TASKS} tasks: events per second`, figures.tree_events_per_s, "/s", ">= 100/s", figures.tree_events_per_s >= 95);
  line(`tree: frames traced in ${elapsed.toFixed(1)} s`, figures.tree_frames, "", "", true);
  line("tree: frame time p50 (tracing)", figures.tree_frame_ms_p50, "ms", "", true);
  line("tree: frame time p95 (tracing)", figures.tree_frame_ms_p95, "ms", "< 50 ms", figures.tree_frame_ms_p95 < 50);
  line("tree: frame time max (tracing)", figures.tree_frame_ms_max, "ms", "", true);
  line("tree: work in a frame p95 (tracing)", figures.tree_frame_work_ms_p95, "ms", "", true);
  line("tree: work in a frame max (tracing)", figures.tree_frame_work_ms_max, "ms", "", true);
  line("tree: dropped frames (tracing)", figures.tree_dropped_frames, "", "", true);
  line("tree: frame time p95 (requestAnimationFrame)", figures.tree_raf_ms_p95, "ms", "< 50 ms", figures.tree_raf_ms_p95 < 50);
  line("tree: main-thread tasks over 50 ms (tracing)", figures.tree_long_tasks_over_50ms, "", "", true);
  line(`tree: applying a read of ${TASKS} tasks, p50 (page)`, figures.tree_apply_ms_p50, "ms", "", true);
  line(`tree: applying a read of ${TASKS} tasks, max (page)`, figures.tree_apply_ms_max, "ms", "", true);
  await page.context().close();
} finally {
  await browser.close();
  server.stop();
}
console.log(JSON.stringify(figures));
