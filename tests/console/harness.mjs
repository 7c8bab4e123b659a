// What the console's test and benchmark share: a `spindle serve` child on
// a free port (stopped on every way out, SIGKILLed with this process), an
// OpenAI-compatible upstream that streams its reply a word at a time, and
// Debian's Chromium through playwright-core with every console error and
// page error collected.
//
// SPINDLE_CONSOLE_FROM_DISK=DIR (runtime/console) serves the console's
// page and files to the browser from DIR instead of the binary, with the
// server's headers: for working on the console without rebuilding spindle.
// Unset (as CTest runs it), the files compiled into the binary are tested.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const servers = new Set();
const dirs = new Set();
const stopAll = () => {
  for (const s of servers) if (s.exitCode === null) s.kill("SIGKILL");
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
};
process.on("exit", stopAll);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(1));

/**
 * Starts `spindle serve --port 0 ...args` with its data in a fresh
 * temporary directory (removed when it stops); resolves to {base, stop}.
 */
export async function startServer(binary, args = []) {
  const data = fs.mkdtempSync(path.join(os.tmpdir(), "spindle-console-"));
  // Through util-linux's setpriv, spindle gets SIGKILL when this process
  // dies, also when it is killed (a CTest timeout) and cannot stop it.
  const proc = spawn("setpriv", ["--pdeathsig", "KILL", binary, "serve", "--port", "0", "--data", data, "--log-level", "warn", ...args], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  servers.add(proc);
  dirs.add(data);
  proc.on("exit", () => {
    fs.rmSync(data, { recursive: true, force: true });
    dirs.delete(data);
  });
  const base = await new Promise((ok, fail) => {
    let out = "";
    const timer = setTimeout(() => fail(new Error("spindle printed no address in 30 s")), 30000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/serving on (http:\/\/[0-9.]+:\d+)/);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
    proc.on("exit", (code) => fail(new Error(`spindle exited with ${code}`)));
  });
  return {
    base,
    stop: () => {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      servers.delete(proc);
    },
  };
}

/** What the upstream reports it spent for a message holding UPSTREAM_USAGE_MARK. */
export const UPSTREAM_USAGE = { prompt_tokens: 4321, completion_tokens: 87, total_tokens: 4408 };
export const UPSTREAM_USAGE_MARK = "[report usage]";
/** A message holding this is answered only once the test releases it. */
export const HOLD_MARK = "[hold]";

/**
 * An OpenAI-compatible upstream: the reply is "echo: <last message>",
 * streamed a word at a time `gapMs` apart; the query rewriter's requests
 * get the latest message back at once. It reports no usage (spindle
 * counts it), except for a last message holding UPSTREAM_USAGE_MARK when
 * asked for it (`stream_options.include_usage`): then a last chunk with no
 * choices carries UPSTREAM_USAGE, as OpenAI streams it. A last message
 * holding HOLD_MARK is not answered while the upstream holds (from the
 * start, and again after `hold()`): the call stays running until
 * `release()`, which answers the held ones and the later ones at once.
 * `held()` counts the calls held now.
 */
export async function startUpstream(gapMs = 60) {
  const holding = new Set(); // the resolvers of the held replies
  let holds = true;
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", async () => {
      const request = JSON.parse(body);
      const last = request.messages[request.messages.length - 1].content;
      const rewrite = request.messages[0].content.startsWith("You rewrite");
      if (!rewrite && holds && last.includes(HOLD_MARK)) await new Promise((r) => holding.add(r));
      const text = rewrite ? last.slice(last.lastIndexOf("Latest message:\n") + 16) : "echo: " + last;
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      const pieces = rewrite ? [text] : text.match(/\S+\s*|\s+/g) || [""];
      for (const piece of pieces) {
        const chunk = { id: "chatcmpl-up", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: piece }, finish_reason: null }] };
        res.write("data: " + JSON.stringify(chunk) + "\n\n");
        if (!rewrite) await new Promise((r) => setTimeout(r, gapMs));
      }
      if (!rewrite && request.stream_options?.include_usage && last.includes(UPSTREAM_USAGE_MARK)) {
        const chunk = { id: "chatcmpl-up", object: "chat.completion.chunk", choices: [], usage: UPSTREAM_USAGE };
        res.write("data: " + JSON.stringify(chunk) + "\n\n");
      }
      res.end("data: [DONE]\n\n");
    });
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => server.close(),
    held: () => holding.size,
    hold: () => (holds = true),
    release: () => {
      holds = false;
      for (const r of holding) r();
      holding.clear();
    },
  };
}

/** Debian's Chromium, headless. */
export function launch(extraArgs = []) {
  return chromium.launch({
    executablePath: process.env.SPINDLE_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", ...extraArgs],
  });
}

/**
 * A page of its own context at `viewport`, collecting console errors and
 * uncaught page errors into `page.errors`. `allowed` matches console
 * errors a scenario provokes on purpose (the browser logs each 4xx
 * answer as "Failed to load resource").
 */
export async function newPage(browser, viewport = { width: 1280, height: 800 }, allowed = null) {
  const context = await browser.newContext({ viewport });
  if (process.env.SPINDLE_CONSOLE_FROM_DISK) await consoleFromDisk(context, process.env.SPINDLE_CONSOLE_FROM_DISK);
  const page = await context.newPage();
  page.errors = [];
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    if (allowed && allowed.test(m.text())) return;
    page.errors.push("console: " + m.text());
  });
  page.on("pageerror", (e) => page.errors.push("pageerror: " + e.message));
  return page;
}

/** JSON over HTTP from the test itself (not the browser). */
export async function call(base, method, path, body, token, tenant) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = "Bearer " + token;
  if (tenant) headers["Spindle-Tenant"] = tenant;
  const res = await fetch(base + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

// The headers routes_console.cpp sends with the console's files.
const CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8" };

/** Answers `/` and `/console/{file}` of every page of `context` from `dir`. */
export async function consoleFromDisk(context, dir) {
  const root = path.resolve(dir);
  await context.route(
    (url) => url.pathname === "/" || /^\/console\/[^/]+$/.test(url.pathname),
    async (route) => {
      const url = new URL(route.request().url());
      const name = url.pathname === "/" ? "index.html" : decodeURIComponent(url.pathname.slice("/console/".length));
      const file = path.join(root, name);
      const type = TYPES[path.extname(name)];
      if (name.includes("/") || name.startsWith(".") || !type || !fs.existsSync(file)) {
        await route.fulfill({ status: 404, contentType: "application/json", body: JSON.stringify({ error: { code: "not_found", message: `the console has no file '${name}'` } }) });
        return;
      }
      const headers = { "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer" };
      if (type.startsWith("text/html")) Object.assign(headers, { "Content-Security-Policy": CSP, "X-Frame-Options": "DENY" });
      await route.fulfill({ status: 200, contentType: type, headers, body: fs.readFileSync(file) });
    },
  );
}

const b64url = (x) => Buffer.from(typeof x === "string" ? x : JSON.stringify(x)).toString("base64url");

/** A JWT signed with HS256 and `secret` carrying `claims` (an end user's token). */
export function signJwt(claims, secret) {
  const unsigned = b64url({ alg: "HS256", typ: "JWT" }) + "." + b64url(claims);
  return unsigned + "." + crypto.createHmac("sha256", secret).update(unsigned).digest("base64url");
}

// -- usage (docs/usage.md) ----------------------------------------------------

/** The `from` of the console's usage rows: today's date and the date 30 days ago (UTC). */
export const usageDay = (daysAgo = 0) => new Date(Date.now() - daysAgo * 86400000).toISOString().slice(0, 10);

/** "412 in · 96 out · counted": the line the console shows under a reply. */
export const usageLine = (u) => `${u.prompt_tokens.toLocaleString("en-US")} in · ${u.completion_tokens.toLocaleString("en-US")} out · ${u.source}`;

/**
 * The console's usage panel, row `key` ("today", "month" or "thread"), as
 * shown: one [name, exchanges, prompt tokens, completion tokens] a table
 * row, name "total", or the source of a row that shows one apart.
 */
export function shownUsage(page, key) {
  return page.$$eval(`#usage-${key} tr.usage-total, #usage-${key} tr.usage-source`, (rows) =>
    rows.map((r) => [r.classList.contains("usage-total") ? "total" : r.dataset.source, ...[...r.querySelectorAll("td.num")].map((td) => Number(td.textContent.replace(/,/g, "")))]),
  );
}

/**
 * What the panel shows for a UsageReport without group_by: its total, and
 * counted and upstream apart when both spent something.
 */
export function usageRows(report) {
  assert.equal(report.data.length, 1, JSON.stringify(report));
  const g = report.data[0];
  const row = (name, f) => [name, f.exchanges, f.prompt_tokens, f.completion_tokens];
  const { counted, upstream } = g.by_source;
  const spent = (f) => f.exchanges > 0 || f.total_tokens > 0;
  return [row("total", g), ...(spent(counted) && spent(upstream) ? [row("counted", counted), row("upstream", upstream)] : [])];
}

/**
 * Waits (10 s at most) until the panel's row `key` shows what `report()`
 * (a GET /v1/usage answer, read again each time) says; fails otherwise.
 * Resolves to the rows.
 */
export async function waitForUsage(page, key, report, timeout = 10000) {
  const until = Date.now() + timeout;
  for (;;) {
    const want = usageRows(await report());
    const shown = await shownUsage(page, key);
    if (JSON.stringify(shown) === JSON.stringify(want) || Date.now() > until) {
      assert.deepEqual(shown, want, `the usage panel's "${key}" row is GET /v1/usage's answer`);
      return want;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}
