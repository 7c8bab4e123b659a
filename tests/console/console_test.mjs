// The console (docs/console.md) in Debian's Chromium, driven by
// playwright-core: every scenario through the page as a user would, with
// the API only to set the scene. Run by run.sh:
//   node console_test.mjs SPINDLE_BINARY SCREENSHOT_DIR
// Exits 0 when every check passed; a failed check throws and exits 1.
// Every scenario fails on any console error or uncaught page error,
// except the 4xx answers a scenario provokes on purpose.

import assert from "node:assert/strict";
import path from "node:path";
import { call, launch, newPage, shownUsage, startServer, startUpstream, UPSTREAM_USAGE, UPSTREAM_USAGE_MARK, usageDay, usageLine, waitForUsage } from "./harness.mjs";

const [binary, shots] = process.argv.slice(2);
if (!binary || !shots) {
  console.error("usage: node console_test.mjs SPINDLE_BINARY SCREENSHOT_DIR");
  process.exit(2);
}

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const upstream = await startUpstream(60);
const open = await startServer(binary, ["--llm", "openai", "--llm-url", upstream.url, "--llm-model", "m"]);
const base = open.base;
const browser = await launch();

// Desktop and phone screenshots of the page as it is now.
async function screenshots(page, name) {
  await page.screenshot({ path: path.join(shots, `${name}-desktop.png`) });
  await page.setViewportSize(PHONE);
  await page.waitForTimeout(150);
  await page.screenshot({ path: path.join(shots, `${name}-phone.png`), fullPage: false });
  await page.setViewportSize(DESKTOP);
}

async function opened(page, hash = "") {
  await page.goto(base + "/" + hash);
  await page.waitForSelector("html[data-ready]");
}

let checks = 0;
async function scenario(name, f, allowed = null) {
  const page = await newPage(browser, DESKTOP, allowed);
  try {
    await f(page);
    assert.deepEqual(page.errors, [], "console or page errors");
  } finally {
    await page.context().close();
  }
  ++checks;
  console.log("ok - " + name);
}

// Records each text the streamed reply shows, as it changes, and keeps
// the streamed reply's element (window.__reply), also once the turns are
// read again.
async function recordStream(page) {
  await page.evaluate(() => {
    window.__seen = [];
    new MutationObserver(() => {
      const reply = document.querySelector("#streaming-turn");
      if (reply) window.__reply = reply;
      const el = reply?.querySelector(".content");
      if (el && el.textContent !== window.__seen.at(-1)) window.__seen.push(el.textContent);
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
}

// The usage line the streamed reply showed (from the stream's `done` event).
const streamedUsage = (page) => page.evaluate(() => window.__reply?.querySelector(".turn-usage")?.textContent ?? null);

// GET /v1/usage over the API, as the console's panel asks it.
const usage = (query) => async () => {
  const r = await call(base, "GET", "/v1/usage?" + new URLSearchParams(query));
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body;
};

try {
  await scenario("console: served at / with its own files, the API's routes untouched", async (page) => {
    const res = await fetch(base + "/");
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type"), /^text\/html/);
    assert.match(res.headers.get("content-security-policy"), /script-src 'self'/);
    const etag = res.headers.get("etag");
    assert.ok(etag);
    const again = await fetch(base + "/", { headers: { "If-None-Match": etag } });
    assert.equal(again.status, 304);
    const js = await fetch(base + "/console/main.js");
    assert.match(js.headers.get("content-type"), /^text\/javascript/);
    assert.equal((await fetch(base + "/console/nope.js")).status, 404);
    assert.equal((await fetch(base + "/healthz")).status, 200);
    assert.equal((await fetch(base + "/metrics")).status, 200);
    await opened(page);
    await page.waitForSelector("#thread-items");
    assert.equal(await page.getAttribute('nav a[data-view="threads"]', "aria-current"), "page");
  });

  await scenario("console: create a thread, send a message and see the reply stream in token by token", async (page) => {
    await opened(page);
    await page.click("#new-thread");
    await page.waitForSelector("#message");
    const id = await page.textContent(".thread-head h2 .tid");
    assert.match(id, /^[0-9a-f-]{36}$/);
    await recordStream(page);
    const message = "hello **world** from the console, one word at a time";
    await page.fill("#message", message);
    await page.click("#send");
    await page.waitForSelector("#turns .turn.role-assistant:not(#streaming-turn)", { timeout: 20000 });
    const seen = await page.evaluate(() => window.__seen.filter((t) => t.length > 0));
    const reply = "echo: " + message;
    // Progressively: many partial texts, each a prefix of the next, ending whole.
    assert.ok(seen.length >= 5, `the reply appeared in ${seen.length} steps: ${JSON.stringify(seen)}`);
    for (let i = 1; i < seen.length; ++i) assert.ok(seen[i].startsWith(seen[i - 1]) && seen[i].length > seen[i - 1].length, JSON.stringify(seen));
    assert.equal(seen.at(-1), reply);
    // Stored: the history shows both turns; the markdown is rendered.
    const turns = await call(base, "GET", `/v1/threads/${id}/history`);
    assert.deepEqual(turns.body.turns.map((t) => t.role), ["user", "assistant"]);
    assert.equal(turns.body.turns[1].content, reply);
    const strong = await page.textContent("#turns .turn.role-assistant .content strong");
    assert.equal(strong, "world");
    // What the exchange spent (the upstream reports nothing: counted): the
    // streamed reply showed it from the `done` event, as the history has it.
    const spent = turns.body.turns[1].usage;
    assert.ok(spent && spent.source === "counted" && spent.prompt_tokens > 0 && spent.completion_tokens > 0, JSON.stringify(spent));
    assert.equal(turns.body.turns[0].usage, undefined);
    assert.equal(await streamedUsage(page), usageLine(spent));
    assert.equal(await page.textContent("#turns .turn.role-assistant .turn-usage"), usageLine(spent));
    assert.equal(await page.locator("#turns .turn.role-user .turn-usage").count(), 0);
    // The usage panel: the tenant's today and 30 days, and this thread.
    await waitForUsage(page, "thread", usage({ thread_id: id }));
    assert.deepEqual(await shownUsage(page, "thread"), [["total", 1, spent.prompt_tokens, spent.completion_tokens]]);
    assert.equal(await page.textContent("#usage-thread .usage-period th"), "This conversation");
    assert.equal(await page.textContent("#usage-thread .usage-total .source"), "counted");
    await waitForUsage(page, "today", usage({ from: usageDay() }));
    await waitForUsage(page, "month", usage({ from: usageDay(30) }));
    // Each period's range is the answer's (in its tooltip): from today's
    // first hour, and from the first hour of the day 30 days ago (UTC).
    assert.match(await page.getAttribute("#usage-today .usage-period th", "title"), new RegExp(`^From ${usageDay()}T00:00:00Z to `));
    assert.match(await page.getAttribute("#usage-month .usage-period th", "title"), new RegExp(`^From ${usageDay(30)}T00:00:00Z to `));
    // The list shows the new thread.
    await page.waitForSelector(`#thread-items li[data-thread="${id}"]`);
    await call(base, "POST", `/v1/threads/${id}/items`, { type: "text", content: "## Notes\n\nThe user greets the **console**." });
    await screenshots(page, "threads");
  });

  await scenario("console: each reply shows what its exchange spent, and the usage panel the tenant's and the thread's totals, counted and upstream apart", async (page) => {
    // One exchange over the API (counted), then one from the console whose
    // upstream reports its usage.
    const first = (await call(base, "POST", "/v1/threads/new/messages", { content: "counted by spindle" })).body;
    const id = first.thread_id;
    assert.equal(first.usage.source, "counted");
    await opened(page, `#/threads/${id}`);
    await page.waitForSelector("#turns .turn.role-assistant .turn-usage");
    assert.equal(await page.textContent("#turns .turn.role-assistant .turn-usage"), usageLine(first.usage));
    await waitForUsage(page, "thread", usage({ thread_id: id }));
    await recordStream(page);
    await page.fill("#message", "and this one the upstream counts " + UPSTREAM_USAGE_MARK);
    await page.click("#send");
    await page.waitForFunction(() => document.querySelectorAll("#turns .turn.role-assistant:not(#streaming-turn)").length === 2, null, { timeout: 20000 });
    const history = (await call(base, "GET", `/v1/threads/${id}/history`)).body.turns;
    const spent = history.filter((t) => t.role === "assistant").map((t) => t.usage);
    assert.deepEqual(spent[1], { ...UPSTREAM_USAGE, source: "upstream" });
    assert.equal(await streamedUsage(page), "4,321 in · 87 out · upstream");
    assert.deepEqual(await page.$$eval("#turns .turn.role-assistant .turn-usage", (els) => els.map((e) => e.textContent)), spent.map(usageLine));
    // The thread's total shows both sources apart.
    const rows = await waitForUsage(page, "thread", usage({ thread_id: id }));
    assert.deepEqual(rows, [
      ["total", 2, first.usage.prompt_tokens + 4321, first.usage.completion_tokens + 87],
      ["counted", 1, first.usage.prompt_tokens, first.usage.completion_tokens],
      ["upstream", 1, 4321, 87],
    ]);
    assert.deepEqual(await page.$$eval("#usage-thread .source", (els) => els.map((e) => e.textContent)), ["both", "counted", "upstream"]);
    await screenshots(page, "usage");
    await waitForUsage(page, "today", usage({ from: usageDay() }));
    await waitForUsage(page, "month", usage({ from: usageDay(30) }));
    // Read again (a reload): the history's usage on each reply.
    await opened(page, `#/threads/${id}`);
    await page.waitForFunction(() => document.querySelectorAll("#turns .turn-usage").length === 2);
    assert.deepEqual(await page.$$eval("#turns .turn.role-assistant .turn-usage", (els) => els.map((e) => e.textContent)), spent.map(usageLine));
    await waitForUsage(page, "thread", usage({ thread_id: id }));
    // Without a thread open, no thread row.
    await page.evaluate(() => (location.hash = "#/threads"));
    await page.waitForSelector("#usage-thread", { state: "hidden" });
    assert.deepEqual(await shownUsage(page, "thread"), []);
  });

  await scenario("console: a 51st context item evicts the first, visibly", async (page) => {
    const t = (await call(base, "POST", "/v1/threads", { metadata: { project: "apollo" } })).body;
    const ids = [];
    for (let i = 1; i <= 50; ++i) {
      const r = await call(base, "POST", `/v1/threads/${t.thread_id}/items`, { type: i % 2 ? "text" : "code", content: i % 2 ? `Item **${i}**` : `let x = ${i};` });
      ids.push(r.body.item.id);
    }
    await opened(page, `#/threads/${t.thread_id}/context`);
    await page.waitForSelector(`#items li[data-item="${ids[0]}"]`);
    assert.equal(await page.locator("#items > li.item").count(), 50);
    await page.fill("#item-content", "# The 51st\n\nwith `code` and *emphasis*");
    await page.click("#add-item");
    await page.waitForFunction((first) => document.querySelector("#evicted")?.textContent.includes("evicted " + first), ids[0]);
    await page.waitForSelector(`#items li[data-item="${ids[0]}"]`, { state: "detached" });
    const shown = await page.$$eval("#items > li.item", (els) => els.map((e) => e.dataset.item));
    assert.equal(shown.length, 50);
    assert.equal(shown[0], ids[1]);
    assert.ok(!shown.includes(ids[0]));
    assert.equal(await page.textContent("#items > li.item:last-child .md-h"), "The 51st");
    // Search by metadata finds it; by ID too.
    await page.fill("#thread-search", "project=apollo");
    await page.press("#thread-search", "Enter");
    await page.waitForSelector(`#thread-items li[data-thread="${t.thread_id}"]`);
    assert.equal(await page.locator("#thread-items li[data-thread]").count(), 1);
    await screenshots(page, "context");
  });

  await scenario("console: fork, clear and delete a thread, each after a confirmation", async (page) => {
    const sent = await call(base, "POST", "/v1/threads/new/messages", { content: "to be forked" });
    const id = sent.body.thread_id;
    await opened(page, `#/threads/${id}`);
    await page.waitForSelector("#turns .turn.role-assistant");
    await page.click("#fork");
    await page.waitForFunction((src) => {
      const h = document.querySelector(".thread-head h2 .tid");
      return h && h.textContent !== src && /^[0-9a-f-]{36}$/.test(h.textContent);
    }, id);
    const fork = await page.textContent(".thread-head h2 .tid");
    assert.equal((await call(base, "GET", `/v1/threads/${fork}`)).body.turns, 2);
    // Clear: cancelled first, then confirmed.
    await page.click("#clear");
    await page.click("#confirm-no");
    assert.equal((await call(base, "GET", `/v1/threads/${fork}`)).body.turns, 2);
    await page.click("#clear");
    await page.click("#confirm-yes");
    await page.waitForSelector("#turns li.empty");
    assert.equal((await call(base, "GET", `/v1/threads/${fork}`)).body.turns, 0);
    await page.click("#delete");
    await page.click("#confirm-yes");
    await page.waitForFunction(() => location.hash === "#/threads");
    assert.equal((await call(base, "GET", `/v1/threads/${fork}`)).status, 404);
    assert.equal((await call(base, "GET", `/v1/threads/${id}`)).status, 200);
  });

  await scenario("console: an orchestration built over the API changes its tree live with claims and completions", async (page) => {
    await opened(page, "#/tasks");
    await page.waitForSelector("#orchestrations");
    await page.evaluate(() => (window.__notReloaded = true));
    const o = (await call(base, "POST", "/v1/orchestrations", { payload: { goal: "ship it" } })).body.id;
    const sub = async (parent, payload) => (await call(base, "POST", `/v1/tasks/${parent}/subtasks`, { payload, max_attempts: 2 })).body.id;
    const t1 = await sub(o, "design");
    const t2 = await sub(o, "build");
    const t11 = await sub(t1, "sketch");
    const t12 = await sub(t1, "review");
    const row = (id) => `li[data-task="${id}"] > .task-row`;
    for (const id of [o, t1, t2, t11, t12]) await page.waitForSelector(row(id));
    // D1: the deepest, highest sequence first.
    await page.waitForSelector(`${row(t12)}.next`);
    assert.equal(await page.textContent("#next-task"), t12);
    await page.waitForSelector(`${row(t12)}.state-pending`);
    const claim = (await call(base, "POST", "/v1/tasks/claim", { worker: "w1", lease_s: 30 })).body;
    assert.equal(claim.id, t12);
    await page.waitForSelector(`${row(t12)}.state-running`);
    await page.waitForFunction((sel) => /worker w1/.test(document.querySelector(sel)?.textContent), row(t12));
    await page.waitForFunction((sel) => /lease \d+ s/.test(document.querySelector(sel + " .lease")?.textContent), row(t12));
    await page.waitForSelector(`${row(t11)}.next`);
    await call(base, "POST", `/v1/tasks/${t12}/complete`, { lease: claim.lease.token, result: "ok" });
    await page.waitForSelector(`${row(t12)}.state-completed`);
    // A lease of one second runs out: pending again (two attempts allowed);
    // the second claim's lease running out leaves it stale.
    const c2 = (await call(base, "POST", "/v1/tasks/claim", { worker: "w2", lease_s: 1 })).body;
    assert.equal(c2.id, t11);
    await page.waitForSelector(`${row(t11)}.state-running`);
    await page.waitForSelector(`${row(t11)}.state-pending`, { timeout: 10000 });
    const c3 = (await call(base, "POST", "/v1/tasks/claim", { worker: "w2", lease_s: 1 })).body;
    assert.equal(c3.id, t11);
    await page.waitForSelector(`${row(t11)}.state-stale`, { timeout: 10000 });
    await page.waitForFunction((sel) => /attempt 2\/2/.test(document.querySelector(sel)?.textContent), row(t11));
    // Requeued from the console.
    await page.click(`${row(t11)} button:has-text("Requeue")`);
    await page.waitForSelector(`${row(t11)}.state-pending`);
    assert.equal((await call(base, "GET", `/v1/tasks/${t11}`)).body.state, "pending");
    const c4 = (await call(base, "POST", "/v1/tasks/claim", { worker: "w3", lease_s: 60 })).body;
    assert.equal(c4.id, t11);
    await page.waitForSelector(`${row(t11)}.state-running`);
    await page.waitForFunction((sel) => /lease (5[0-9]|60) s/.test(document.querySelector(sel + " .lease")?.textContent), row(t11));
    assert.equal(await page.evaluate(() => window.__notReloaded), true);
    await page.waitForSelector(`${row(t2)}.next`);
    await screenshots(page, "orchestration");
  });

  await scenario("console: health shows this node and live charts fed by GET /v1/stats", async (page) => {
    const stats = (await call(base, "GET", "/v1/stats")).body;
    assert.equal(stats.nodes.length, 1);
    assert.equal(stats.nodes[0].address, base.replace("http://", ""));
    assert.ok(stats.http.requests_total > 0);
    assert.ok(stats.storage.commits >= 0);
    await opened(page, "#/health");
    await page.waitForFunction(() => /this node/.test(document.querySelector("#nodes")?.textContent));
    // Load for the charts: a few hundred requests and an exchange.
    const until = Date.now() + 6000;
    for (let i = 0; Date.now() < until; ++i) {
      await fetch(base + "/healthz");
      if (i % 20 === 0) await call(base, "POST", "/v1/threads/charts/messages", { content: "for the charts " + i });
    }
    await page.waitForFunction(() => parseFloat(document.querySelector("#value-rps")?.textContent) > 1, null, { timeout: 10000 });
    await page.waitForFunction(() => parseFloat(document.querySelector("#value-wpc")?.textContent) >= 1, null, { timeout: 10000 });
    await screenshots(page, "health");
  });

  await scenario(
    "console: bad input is shown as text and the server's refusal as an error",
    async (page) => {
      await opened(page);
      await page.click("#new-thread");
      await page.waitForSelector("#message");
      const hostile = [
        '<img src=x onerror="window.__injected=1">',
        "<script>window.__injected=2</script>",
        "[click](javascript:window.__injected=3) **bold** `<b>code</b>`",
        '<svg onload="window.__injected=4"></svg>',
      ].join("\n\n");
      await page.fill("#message", hostile);
      await page.click("#send");
      await page.waitForSelector("#turns .turn.role-assistant:not(#streaming-turn)", { timeout: 20000 });
      assert.equal(await page.locator("#turns img, #turns script, #turns svg, #turns a").count(), 0);
      const userText = await page.textContent("#turns .turn.role-user .content");
      assert.ok(userText.includes('<img src=x onerror="window.__injected=1">'), userText);
      assert.ok(userText.includes("<script>window.__injected=2</script>"));
      // A context item with HTML is text too.
      await page.click("#tab-context");
      await page.fill("#item-content", '<iframe src="javascript:window.__injected=5"></iframe>');
      await page.click("#add-item");
      await page.waitForSelector("#items li.item");
      assert.equal(await page.locator("#items iframe").count(), 0);
      // A huge message: the server's 413 shown.
      await page.click("#tab-chat");
      await page.waitForSelector("#message");
      await page.$eval("#message", (el) => (el.value = "x".repeat(1100 * 1024)));
      await page.click("#send");
      await page.waitForFunction(() => /too_large/.test(document.querySelector("#notice")?.textContent));
      // A hostile thread ID in the address: refused by the server, shown as text.
      const badId = '<img src=x onerror="window.__injected=6">';
      await page.goto(base + "/#/threads/" + encodeURIComponent(badId));
      await page.waitForSelector("#thread .error");
      assert.match(await page.textContent("#thread .error"), /invalid_id/);
      assert.equal(await page.textContent(".thread-head h2 .tid"), badId);
      // Searching for an ID with slashes: the server's 404 shown.
      await page.fill("#thread-search", "../../metrics");
      await page.press("#thread-search", "Enter");
      await page.waitForSelector("#thread-items li.error");
      assert.match(await page.textContent("#thread-items li.error"), /^404 not_found/);
      await page.waitForTimeout(300);
      assert.equal(await page.evaluate(() => window.__injected), undefined);
      assert.equal(await page.locator("img").count(), 0);
    },
    /Failed to load resource: the server responded with a status of (400|404|413)/,
  );

  const guarded = await startServer(binary, ["--token", "s3cret-token"]);
  try {
    await scenario(
      "console: with --token the page loads, asks for the token, refuses a wrong one and works with the right one",
      async (page) => {
        await page.goto(guarded.base + "/");
        await page.waitForSelector("#token-dialog[open]");
        assert.equal(await page.textContent("#token-error"), "");
        await page.fill("#token-input", "wrong-token");
        await page.click('#token-form button[type="submit"]');
        await page.waitForFunction(() => document.querySelector("#token-error")?.textContent.includes("refused"));
        assert.ok(await page.isVisible("#token-dialog[open]"));
        await page.fill("#token-input", "s3cret-token");
        await page.click('#token-form button[type="submit"]');
        await page.waitForSelector("#token-dialog", { state: "hidden" });
        await page.waitForSelector("#thread-items li.empty");
        await page.click("#new-thread");
        await page.waitForSelector("#message");
        assert.equal((await call(guarded.base, "GET", "/v1/threads")).status, 401);
        assert.equal((await call(guarded.base, "GET", "/v1/threads", undefined, "s3cret-token")).body.data.length, 1);
        // The usage panel, once the server said who the token is (every scope).
        await page.waitForSelector("#usage-today .usage-total");
        // The event stream (fetch with the header) is followed too.
        await page.waitForFunction(() => document.querySelector("#live")?.dataset.state === "live");
      },
      /Failed to load resource: the server responded with a status of 401/,
    );
    await scenario(
      "console: the API reference renders every operation of /v1/openapi.json, without a token and with nothing fetched from elsewhere",
      async (page) => {
        const requested = [];
        page.on("request", (r) => requested.push(r.url()));
        const doc = (await call(guarded.base, "GET", "/v1/openapi.json")).body;
        const operations = Object.values(doc.paths).reduce(
          (n, item) => n + ["get", "post", "put", "patch", "delete"].filter((m) => item[m]).length, 0);
        await page.goto(guarded.base + "/");
        await page.waitForSelector("#token-dialog[open]");
        await page.goto(guarded.base + "/console/reference.html");
        await page.waitForSelector(".ref-op");
        assert.equal(await page.locator(".ref-op").count(), operations);
        assert.match(await page.textContent("#ref-status"), new RegExp(`${operations} operations`));
        const send = page.locator("#sendMessage");
        assert.equal(await send.count(), 1);
        assert.match(await send.textContent(), /POST\s+\/v1\/threads\/\{id\}\/messages/);
        assert.ok(requested.every((u) => u.startsWith(guarded.base)), "only this server is asked");
      },
      /Failed to load resource: the server responded with a status of 401/,
    );
  } finally {
    guarded.stop();
  }
} finally {
  await browser.close();
  open.stop();
  upstream.close();
}
console.log(`${checks} scenarios passed`);
