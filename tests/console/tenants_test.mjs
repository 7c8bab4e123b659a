// The console with tenancy on (docs/console.md, "Tokens and tenants") in
// Debian's Chromium, driven by playwright-core: a tenant's key, a key with
// keys:admin, the admin token, an end user's token and the token of a
// server without tenancy each given to the page as a user would, the
// header checked to say who each is (GET /v1/me), the API only to set the
// scene and to check what the page did; then Limits, against a server of
// its own whose upstream holds the replies it is told to. Run by
// run.sh after console_test.mjs:
//   node tenants_test.mjs SPINDLE_BINARY SCREENSHOT_DIR
// Exits 0 when every check passed; a failed check throws and exits 1.
// Every scenario fails on any console error or uncaught page error but
// the 401 and 403 answers it provokes on purpose (the browser logs each).

import assert from "node:assert/strict";
import crypto from "node:crypto";
import path from "node:path";
import { call, HOLD_MARK, launch, newPage, signJwt, startServer, startUpstream, usageDay, usageLine, waitForUsage } from "./harness.mjs";

const [binary, shots] = process.argv.slice(2);
if (!binary || !shots) {
  console.error("usage: node tenants_test.mjs SPINDLE_BINARY SCREENSHOT_DIR");
  process.exit(2);
}

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const REFUSALS = /Failed to load resource: the server responded with a status of (401|403)/;
const ADMIN = "admin-" + crypto.randomBytes(12).toString("hex");
const server = await startServer(binary, ["--admin-token", ADMIN]);
const base = server.base;
const browser = await launch();

// Desktop and phone screenshots of the page as it is now; `focus` is
// scrolled into view on the phone.
async function screenshots(page, name, focus = null) {
  await page.screenshot({ path: path.join(shots, `${name}-desktop.png`) });
  await page.setViewportSize(PHONE);
  if (focus) await page.locator(focus).scrollIntoViewIfNeeded();
  await page.waitForTimeout(150);
  await page.screenshot({ path: path.join(shots, `${name}-phone.png`), fullPage: false });
  await page.setViewportSize(DESKTOP);
}

let checks = 0;
async function scenario(name, f, allowed = REFUSALS) {
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

const admin = (method, p, body, tenant) => call(base, method, p, body, ADMIN, tenant);

// Opens the console (of the server at `at`) and gives the dialog `token`.
async function signIn(page, token, hash = "", at = base) {
  await page.goto(at + "/" + hash);
  await page.waitForSelector("#token-dialog[open]");
  await page.fill("#token-input", token);
  await page.click('#token-form button[type="submit"]');
}

// None of `texts` is in the page: not in its markup, not on screen.
async function absent(page, texts) {
  const html = await page.content();
  const shown = await page.evaluate(() => document.body.innerText);
  for (const t of texts) {
    assert.ok(!html.includes(t), `the page's markup holds ${JSON.stringify(t)}`);
    assert.ok(!shown.includes(t), `the page shows ${JSON.stringify(t)}`);
  }
}

const go = (page, hash) => page.evaluate((h) => (location.hash = h), hash);
const text = (page, sel) => page.textContent(sel);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Waits (10 s at most) until `f()` holds; fails otherwise.
async function until(f, what, timeout = 10000) {
  const end = Date.now() + timeout;
  while (!(await f())) {
    if (Date.now() > end) assert.fail("timed out waiting for " + what);
    await sleep(100);
  }
}

// Waits (10 s at most) until the text of `sel` is `want` (or what
// `want()` answers, asked again each time); fails otherwise.
async function shows(page, sel, want, timeout = 10000) {
  const end = Date.now() + timeout;
  for (;;) {
    const w = typeof want === "function" ? await want() : want;
    const got = await page.evaluate((s) => document.querySelector(s)?.textContent ?? null, sel);
    if (got === w || Date.now() > end) {
      assert.equal(got, w, `the text of ${sel}`);
      return;
    }
    await sleep(150);
  }
}

// -- the scene: tenants A and B, a thread "plans" in each with text of its own
const created = async (name) => {
  const r = await admin("POST", "/v1/tenants", { name });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  return r.body;
};
const A = await created("Acme");
const B = await created("Bravo Corp");
const say = async (tenant, thread, content, codename) => {
  const r = await admin("POST", `/v1/threads/${thread}/messages`, { content }, tenant);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  if (codename) assert.equal((await admin("PATCH", `/v1/threads/${thread}`, { metadata: { codename } }, tenant)).status, 200);
};
await say(A.id, "plans", "ALPHA-ONLY launch plan", "alpha-7731");
await say(B.id, "plans", "BRAVO-ONLY merger memo", "bravo-4410");
await say(B.id, "bravo-extra", "BRAVO-ONLY second thread");
assert.equal((await admin("POST", "/v1/orchestrations", { payload: { goal: "bravo-goal" } }, B.id)).status, 201);
// A's key for the console: conversations, memories and events, no tasks.
const keyA = (await admin("POST", `/v1/tenants/${A.id}/keys`, { name: "console", scopes: ["threads:read", "threads:write", "memories:read", "events:read"] })).body;
assert.match(keyA.key, /^spk_[A-Za-z0-9]{40}$/);
// A's key that manages A's keys: conversations read and keys:admin only.
const keyAdminA = (await admin("POST", `/v1/tenants/${A.id}/keys`, { name: "key admin", scopes: ["threads:read", "keys:admin"] })).body;
assert.match(keyAdminA.key, /^spk_[A-Za-z0-9]{40}$/);
const B_TEXTS = ["BRAVO-ONLY", "bravo-4410", "bravo-extra", "Bravo Corp", B.id];
let upstream = null; // Limits' server and its upstream
let lim = null;
const A_TEXTS = ["ALPHA-ONLY", "alpha-7731", A.id];

try {
  await scenario("tenants: with a tenant's key the console shows that tenant only; orchestration and health say once that they are not for this key", async (page) => {
    const asked = [];
    page.on("request", (r) => asked.push(new URL(r.url()).pathname));
    await signIn(page, keyA.key);
    await page.waitForSelector('#thread-items li[data-thread="plans"]');
    assert.equal(await text(page, "#who-label"), `tenant Acme (key ${keyA.key.slice(0, 12)}…)`);
    assert.match(await page.getAttribute("#who-label", "title"), new RegExp(`${A.id}.*${keyA.id}`));
    assert.equal(await page.isVisible('nav a[data-view="tenants"]'), false, "no Keys for a key without keys:admin");
    assert.equal(await page.locator("#thread-items li[data-thread]").count(), 1);
    assert.match(await text(page, '#thread-items li[data-thread="plans"]'), /alpha-7731/);
    await page.click('#thread-items li[data-thread="plans"] a');
    await page.waitForSelector("#turns .turn.role-user");
    assert.match(await text(page, "#turns"), /ALPHA-ONLY launch plan/);
    await page.waitForFunction(() => document.querySelector("#live")?.dataset.state === "live");
    await absent(page, B_TEXTS);
    // The key lacks usage:read: no usage panel, and GET /v1/usage never
    // asked; its replies still show what they spent (the history has it).
    assert.equal(await page.locator("#usage").count(), 0, "no usage panel without usage:read");
    assert.ok(!asked.includes("/v1/usage"), "GET /v1/usage is not asked without usage:read");
    assert.equal(await page.locator("#turns .turn.role-assistant .turn-usage").count(), 1);
    await screenshots(page, "tenant-key");

    // Orchestration: the key lacks tasks:read. Said inline, asked once.
    await page.click('nav a[data-view="tasks"]');
    await page.waitForSelector("#view-tasks .refused");
    const tasks = await text(page, "#view-tasks .refused");
    assert.match(tasks, /not for tenant Acme \(key spk_/);
    assert.match(tasks, /lacks the scope 'tasks:read'/);
    // Health: the admin token's.
    await page.click('nav a[data-view="health"]');
    await page.waitForSelector("#view-health .refused");
    assert.match(await text(page, "#view-health .refused"), /403 permission_denied.*admin token/);
    // Limits: the key lacks usage:read.
    await page.click('nav a[data-view="limits"]');
    await page.waitForSelector("#view-limits .refused");
    assert.match(await text(page, "#view-limits .refused"), /not for tenant Acme \(key spk_.*lacks the scope 'usage:read'/);
    await page.waitForTimeout(2500);
    assert.equal(asked.filter((p) => p === "/v1/orchestrations").length, 1, "the orchestrations asked for once");
    assert.equal(asked.filter((p) => p === "/v1/stats").length, 1, "the stats asked for once, not every second");
    assert.equal(asked.filter((p) => p === "/v1/limits").length, 1, "the limits asked for once, not every 2 s");
    assert.equal(await page.isVisible("#token-dialog[open]"), false, "a 403 does not ask for a token");
    // Tenants by address: its own tenant's keys, refused (no keys:admin).
    await go(page, "#/tenants");
    await page.waitForSelector("#view-tenants .refused");
    assert.match(await text(page, "#view-tenants .refused"), /lacks the scope 'keys:admin'/);
    assert.equal(await page.locator("#tenant-items, #key-form").count(), 0);
    await absent(page, B_TEXTS);
    // Sign out: the token is forgotten and asked for again.
    await page.click("#sign-out");
    await page.waitForSelector("#token-dialog[open]");
    assert.equal(await page.evaluate(() => sessionStorage.getItem("spindle.token")), null);
  });

  let made = null; // the key made from the console
  await scenario("tenants: the admin token lists and creates tenants, creates a key shown once and revokes it, and acts in a tenant", async (page) => {
    await signIn(page, ADMIN);
    // The page starts again as the admin token: first, a choice of tenant.
    await page.waitForSelector(`#act-tenant option[value="${A.id}"]`, { state: "attached" });
    assert.equal(await text(page, "#who-label"), "admin");
    assert.equal(await page.locator("#usage").count(), 0, "no usage panel in no tenant");
    assert.ok(await page.isVisible('nav a[data-view="tenants"]'));
    await page.click('nav a[data-view="tenants"]');
    await page.waitForSelector(`#tenant-items li[data-tenant="${B.id}"]`);
    assert.match(await text(page, `#tenant-items li[data-tenant="${A.id}"]`), /Acme/);
    assert.match(await text(page, `#tenant-items li[data-tenant="${B.id}"]`), /Bravo Corp/);
    assert.ok(await page.isVisible('#tenant-items li[data-tenant="default"]'));

    // A tenant from the form.
    await page.fill("#tenant-name", "Charlie");
    await page.click("#create-tenant");
    await page.waitForFunction(() => document.querySelector("#tenant-title")?.textContent === "Charlie");
    const tenants = (await admin("GET", "/v1/tenants")).body.data;
    const charlie = tenants.find((t) => t.name === "Charlie");
    assert.ok(charlie, "Charlie was created");
    await page.waitForSelector(`#tenant-items li[data-tenant="${charlie.id}"]`);
    assert.equal(await page.evaluate(() => location.hash), "#/tenants/" + charlie.id);

    // A's keys: the one made over the API, without its secret.
    await page.click(`#tenant-items li[data-tenant="${A.id}"] a`);
    await page.waitForSelector(`#key-rows tr[data-key="${keyA.id}"]`);
    const row = await text(page, `#key-rows tr[data-key="${keyA.id}"]`);
    assert.ok(row.includes(keyA.prefix + "…") && row.includes("console") && row.includes("events:read") && !row.includes("tasks:read"), row);
    assert.ok(!(await page.content()).includes(keyA.key), "a listed key's secret is nowhere");

    // A key from the form: named, threads:write left out, shown once.
    await page.fill("#key-name", "from the console");
    await page.uncheck('#key-form input[value="threads:write"]');
    assert.equal(await page.isChecked('#key-form input[value="keys:admin"]'), false);
    await page.click("#create-key");
    await page.waitForSelector("#new-key-secret");
    const secret = await page.inputValue("#new-key-secret");
    assert.match(secret, /^spk_[A-Za-z0-9]{40}$/);
    assert.match(await text(page, "#new-key"), /will not be shown again/);
    await page.click("#copy-key");
    await page.waitForFunction(() => /Copied|Ctrl\+C/.test(document.querySelector("#copy-status")?.textContent));
    const listed = await call(base, "GET", "/v1/threads", undefined, secret);
    assert.equal(listed.status, 200);
    assert.deepEqual(listed.body.data.map((t) => t.thread_id), ["plans"]);
    const write = await call(base, "POST", "/v1/threads", {}, secret);
    assert.equal(write.status, 403, "left out: threads:write");
    made = (await admin("GET", `/v1/tenants/${A.id}/keys`)).body.data.find((k) => k.name === "from the console");
    assert.ok(made && secret.startsWith(made.prefix));
    const madeRow = `#key-rows tr[data-key="${made.id}"]`;
    await page.waitForSelector(madeRow);
    assert.ok(!(await text(page, madeRow)).includes("threads:write"));
    await screenshots(page, "tenants", "#new-key");
    // Done: the secret leaves the page.
    await page.click("#new-key-done");
    assert.ok(!(await page.content()).includes(secret), "the secret is gone after Done");
    assert.ok(!(await page.evaluate(() => JSON.stringify(sessionStorage))).includes(secret), "the secret is not kept");

    // Revoked from the console, after a confirmation: then refused (401).
    await page.click(`${madeRow} button`);
    await page.click("#confirm-no");
    assert.equal((await call(base, "GET", "/v1/threads", undefined, secret)).status, 200);
    await page.click(`${madeRow} button`);
    assert.match(await text(page, "#confirm-text"), new RegExp(made.prefix));
    await page.click("#confirm-yes");
    await page.waitForSelector(madeRow, { state: "detached" });
    assert.equal((await call(base, "GET", "/v1/threads", undefined, secret)).status, 401);
    assert.ok(await page.isVisible(`#key-rows tr[data-key="${keyA.id}"]`));

    // Acting in B: the other views show B's data, and nothing of A's.
    await page.click(`#tenant-items li[data-tenant="${B.id}"] a`);
    await page.waitForFunction(() => document.querySelector("#tenant-title")?.textContent === "Bravo Corp");
    await page.click("#act-in");
    await page.waitForSelector('#thread-items li[data-thread="bravo-extra"]');
    assert.equal(await text(page, "#who-label"), "admin in tenant Bravo Corp");
    // The tenant's name is the server's (GET /v1/me with Spindle-Tenant),
    // not the one the page kept.
    await page.evaluate(() => sessionStorage.setItem("spindle.tenant_name", "stale name"));
    await page.reload();
    await page.waitForSelector('#thread-items li[data-thread="bravo-extra"]');
    assert.equal(await text(page, "#who-label"), "admin in tenant Bravo Corp");
    assert.equal(await page.evaluate(() => location.hash), "#/threads");
    assert.equal(await page.locator("#thread-items li[data-thread]").count(), 2);
    await page.click('#thread-items li[data-thread="plans"] a');
    await page.waitForSelector("#turns .turn.role-user");
    assert.match(await text(page, "#turns"), /BRAVO-ONLY merger memo/);
    // Usage in B (the admin token has every scope; Spindle-Tenant names
    // B): the reply's figures as B's history has them, the panel's as
    // GET /v1/usage answers for B.
    const history = (await admin("GET", "/v1/threads/plans/history", undefined, B.id)).body.turns;
    const reply = history.find((t) => t.role === "assistant");
    assert.ok(reply.usage, JSON.stringify(reply));
    assert.equal(await text(page, "#turns .turn.role-assistant .turn-usage"), usageLine(reply.usage));
    const usageOfB = (query) => async () => (await admin("GET", "/v1/usage?" + new URLSearchParams(query), undefined, B.id)).body;
    const rows = await waitForUsage(page, "thread", usageOfB({ thread_id: "plans" }));
    assert.equal(rows[0][1], 1, "one exchange in B's plans");
    const month = await waitForUsage(page, "month", usageOfB({ from: usageDay(30) }));
    assert.equal(month[0][1], 2, "B's two exchanges, not A's");
    await waitForUsage(page, "today", usageOfB({ from: usageDay() }));
    await page.waitForFunction(() => document.querySelector("#live")?.dataset.state === "live");
    await absent(page, A_TEXTS);
    await page.click('nav a[data-view="tasks"]');
    await page.waitForFunction(() => /bravo-goal/.test(document.querySelector("#orchestrations")?.textContent));
    await page.click('nav a[data-view="health"]');
    await page.waitForFunction(() => /this node/.test(document.querySelector("#nodes")?.textContent));
    // Leaving the tenant: the choice again.
    await page.click("#leave-tenant");
    await page.waitForSelector(`#tenant-items li[data-tenant="${B.id}"]`);
    assert.equal(await text(page, "#who-label"), "admin");
    assert.equal(await page.isVisible("#leave-tenant"), false);
    await go(page, "#/threads");
    await page.waitForSelector("#act-tenant");
    await absent(page, ["BRAVO-ONLY", "ALPHA-ONLY"]);
  });

  await scenario("tenants: a key with keys:admin manages its own tenant's keys only: it grants the scopes it holds, creates a key and revokes it", async (page) => {
    const asked = [];
    page.on("request", (r) => asked.push(new URL(r.url()).pathname));
    await signIn(page, keyAdminA.key);
    await page.waitForSelector('#thread-items li[data-thread="plans"]');
    assert.equal(await text(page, "#who-label"), `tenant Acme (key ${keyAdminA.key.slice(0, 12)}…)`);
    const nav = page.locator('nav a[data-view="tenants"]');
    assert.ok(await nav.isVisible(), "Keys in the menu for keys:admin");
    assert.equal(await nav.textContent(), "Keys");
    await nav.click();
    await page.waitForSelector(`#key-rows tr[data-key="${keyA.id}"]`);
    assert.equal(await text(page, "#tenants-title"), "Keys");
    assert.equal(await text(page, "#tenant-title"), "Acme");
    assert.equal(await page.locator("#tenant-items, #tenant-form, #act-in").count(), 0, "no tenant list, no acting: the admin token's");
    assert.ok(!asked.includes("/v1/tenants"), "the tenant list is not asked for");
    const self = `#key-rows tr[data-key="${keyAdminA.id}"]`;
    assert.match(await text(page, self), /this key/);
    await page.click(`${self} button`);
    assert.match(await text(page, "#confirm-text"), /the key this console uses/);
    await page.click("#confirm-no");

    // Only the scopes it holds may be granted; keys:admin is not by default.
    for (const sc of ["threads:write", "memories:read", "tasks:read", "events:read"]) assert.ok(await page.isDisabled(`#key-form input[value="${sc}"]`), sc);
    assert.ok(await page.isChecked('#key-form input[value="threads:read"]'));
    assert.ok(await page.isEnabled('#key-form input[value="keys:admin"]'));
    assert.equal(await page.isChecked('#key-form input[value="keys:admin"]'), false);

    // A key from the form: shown once, of tenant A, with threads:read.
    await page.fill("#key-name", "by the key admin");
    await page.click("#create-key");
    await page.waitForSelector("#new-key-secret");
    const secret = await page.inputValue("#new-key-secret");
    assert.match(secret, /^spk_[A-Za-z0-9]{40}$/);
    const made = (await admin("GET", `/v1/tenants/${A.id}/keys`)).body.data.find((k) => k.name === "by the key admin");
    assert.ok(made && secret.startsWith(made.prefix), "the key is tenant A's");
    assert.deepEqual(made.scopes, ["threads:read"]);
    const listed = await call(base, "GET", "/v1/threads", undefined, secret);
    assert.equal(listed.status, 200);
    assert.deepEqual(listed.body.data.map((t) => t.thread_id), ["plans"]);
    await screenshots(page, "key-admin", "#new-key");
    await page.click("#new-key-done");
    assert.ok(!(await page.content()).includes(secret), "the secret is gone after Done");

    // A scope it lacks, forced past the form: the server's 403, said.
    const keysOfA = async () => (await admin("GET", `/v1/tenants/${A.id}/keys`)).body.data.length;
    const before = await keysOfA();
    await page.evaluate(() => {
      const el = /** @type {HTMLInputElement} */ (document.querySelector('#key-form input[value="tasks:read"]'));
      el.disabled = false;
      el.checked = true;
    });
    await page.click("#create-key");
    await page.waitForFunction(() => /403 permission_denied: a key cannot create a key with scopes it lacks/.test(document.querySelector("#notice")?.textContent));
    assert.equal(await page.locator("#new-key-secret").count(), 0);
    assert.equal(await keysOfA(), before, "no key made");
    await page.uncheck('#key-form input[value="tasks:read"]');

    // Revoked from the console: then refused (401); the key in use stays.
    const row = `#key-rows tr[data-key="${made.id}"]`;
    await page.waitForSelector(row);
    await page.click(`${row} button`);
    assert.doesNotMatch(await text(page, "#confirm-text"), /the key this console uses/);
    await page.click("#confirm-yes");
    await page.waitForSelector(row, { state: "detached" });
    assert.equal((await call(base, "GET", "/v1/threads", undefined, secret)).status, 401);
    assert.ok(await page.isVisible(self));
    assert.equal((await call(base, "GET", "/v1/threads", undefined, keyAdminA.key)).status, 200);

    // Another tenant by address: still its own tenant's keys.
    await go(page, "#/tenants/" + B.id);
    await page.waitForSelector(`#key-rows tr[data-key="${keyA.id}"]`);
    assert.equal(await text(page, "#tenant-title"), "Acme");
    await absent(page, B_TEXTS);
    assert.ok(!asked.some((p) => p.includes(B.id)), "tenant B is never asked for");
    assert.equal(await page.isVisible("#token-dialog[open]"), false);
  });

  await scenario("tenants: on a server without tenancy the header says no tenancy, with its token and without one", async (page) => {
    const guarded = await startServer(binary, ["--token", "plain-token"]);
    const open = await startServer(binary);
    try {
      await page.goto(guarded.base + "/");
      await page.waitForSelector("#token-dialog[open]");
      await page.fill("#token-input", "plain-token");
      await page.click('#token-form button[type="submit"]');
      await page.waitForFunction(() => document.querySelector("#who-label")?.textContent === "no tenancy");
      assert.match(await page.getAttribute("#who-label", "title"), /--token/);
      assert.ok(await page.isVisible("#sign-out"));
      assert.equal(await page.isVisible('nav a[data-view="tenants"]'), false);
      assert.equal(await page.isVisible("#leave-tenant"), false);
      await page.goto(open.base + "/");
      await page.waitForFunction(() => document.documentElement.dataset.ready === "true");
      assert.equal(await text(page, "#who-label"), "no tenancy");
      assert.ok(await page.isVisible("#who"));
      assert.equal(await page.isVisible("#sign-out"), false, "no token: nothing to sign out of");
      assert.equal(await page.isVisible('nav a[data-view="tenants"]'), false);
      assert.equal(await page.isVisible("#token-dialog[open]"), false);
      // Limits: the one tenant's, none set.
      await go(page, "#/limits");
      await shows(page, "#limit-requests .figure", "no limit");
      assert.match(await text(page, "#limits-who"), /no tenancy/);
      assert.equal(await text(page, '#limits-in-force tr[data-limit="concurrent_exchanges"] .value'), "no limit");
    } finally {
      guarded.stop();
      open.stop();
    }
  });

  await scenario("tenants: a key the server refuses (revoked) is said so and asked again; the next token starts the page afresh", async (page) => {
    const k = (await admin("POST", `/v1/tenants/${B.id}/keys`, { name: "short-lived" })).body;
    await signIn(page, k.key);
    await page.waitForSelector('#thread-items li[data-thread="bravo-extra"]');
    assert.equal((await admin("DELETE", `/v1/keys/${k.id}`)).status, 200);
    await go(page, "#/threads/plans");
    await page.waitForSelector("#token-dialog[open]");
    assert.match(await text(page, "#token-error"), /refused/);
    await page.fill("#token-input", keyA.key);
    await page.click('#token-form button[type="submit"]');
    await page.waitForFunction((p) => document.querySelector("#who-label")?.textContent === `tenant Acme (key ${p}…)`, keyA.key.slice(0, 12));
    await page.waitForSelector('#thread-items li[data-thread="plans"]');
    await page.waitForFunction(() => /ALPHA-ONLY/.test(document.querySelector("#turns")?.textContent));
    await absent(page, B_TEXTS);
  });

  await scenario("tenants: a forged token is refused, and nothing its payload claims is shown", async (page) => {
    const hostile = '<img src=x onerror="window.__injected=1">';
    const forged = signJwt({ iss: "<script>window.__injected=2</script>", aud: "spindle", sub: hostile, exp: Math.floor(Date.now() / 1000) + 60 }, "not the tenant's secret, 32 bytes");
    await page.goto(base + "/");
    await page.waitForSelector("#token-dialog[open]");
    await page.evaluate((t) => sessionStorage.setItem("spindle.token", t), forged);
    await page.reload();
    await page.waitForSelector("#token-dialog[open]");
    assert.match(await text(page, "#token-error"), /refused/);
    // The server did not take it (GET /v1/me answered 401): no label.
    assert.equal(await text(page, "#who-label"), "");
    assert.equal(await page.getAttribute("#who-label", "title"), "");
    assert.equal(await page.isVisible("#sign-out"), true);
    await absent(page, ["onerror", "<script>", "window.__injected"]);
    assert.equal(await page.locator("header img, header script").count(), 0);
    assert.equal(await page.evaluate(() => window.__injected), undefined);
  });

  await scenario("tenants: an end user's token (a JWT of the tenant's issuer) shows that user's own threads only", async (page) => {
    const hs256 = crypto.randomBytes(32).toString("hex");
    const put = await admin("PUT", `/v1/tenants/${A.id}/auth`, { issuer: "https://issuer.example", audience: "spindle", hs256_secret: hs256 });
    assert.ok(put.status === 200 || put.status === 204, `PUT /v1/tenants/{id}/auth answered ${put.status} ${JSON.stringify(put.body)}: this server does not take end users' tokens yet`);
    const now = Math.floor(Date.now() / 1000);
    const jwt = (sub) => signJwt({ iss: "https://issuer.example", aud: "spindle", sub, iat: now, exp: now + 3600 }, hs256);
    const alice = jwt("alice");
    const bob = jwt("bob");
    for (const [who, thread, content] of [
      [alice, "alice-notes", "ALICE-ONLY shopping list"],
      [bob, "bob-notes", "BOB-ONLY travel plans"],
    ]) {
      const r = await call(base, "POST", `/v1/threads/${thread}/messages`, { content }, who);
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    await signIn(page, alice);
    await page.waitForSelector('#thread-items li[data-thread="alice-notes"]');
    assert.equal(await text(page, "#who-label"), "end user alice of Acme");
    const title = await page.getAttribute("#who-label", "title");
    assert.match(title, new RegExp(A.id));
    assert.match(title, /issuer https:\/\/issuer\.example; expires /);
    assert.equal(await page.locator("#thread-items li[data-thread]").count(), 1);
    await page.click('#thread-items li[data-thread="alice-notes"] a');
    await page.waitForFunction(() => /ALICE-ONLY shopping list/.test(document.querySelector("#turns")?.textContent));
    // No event stream for an end user: said, not retried.
    await page.waitForFunction(() => document.querySelector("#live")?.dataset.state === "off");
    // No usage:read for an end user: no usage panel.
    assert.equal(await page.locator("#usage").count(), 0, "no usage panel for an end user");
    // Nothing of bob's or of the tenant's other data (its ID is in the
    // header's tooltip: the user's own tenant).
    await absent(page, ["BOB-ONLY", "bob-notes", ...A_TEXTS.filter((t) => t !== A.id), ...B_TEXTS]);
    await screenshots(page, "end-user");
    await page.click('nav a[data-view="tasks"]');
    await page.waitForSelector("#view-tasks .refused");
    assert.match(await text(page, "#view-tasks .refused"), /not for end user alice of Acme/);
    await page.click('nav a[data-view="health"]');
    await page.waitForSelector("#view-health .refused");
    await page.click('nav a[data-view="limits"]');
    await page.waitForSelector("#view-limits .refused");
    assert.match(await text(page, "#view-limits .refused"), /not for end user alice of Acme/);
    assert.equal(await page.isVisible("#token-dialog[open]"), false);
  });

  // -- Limits (docs/limits.md): a server of its own, whose upstream holds
  // the replies it is told to and takes two calls at once; tenant Delta
  // with limits set over the API, tenant Echo without, and 25 more.
  upstream = await startUpstream(5);
  lim = await startServer(binary, ["--admin-token", ADMIN, "--llm", "openai", "--llm-url", upstream.url, "--llm-model", "m", "--llm-concurrency", "2"]);
  const limAdmin = (method, p, body, tenant) => call(lim.base, method, p, body, ADMIN, tenant);
  const make = async (name) => {
    const r = await limAdmin("POST", "/v1/tenants", { name });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    return r.body;
  };
  const D = await make("Delta");
  const E = await make("Echo");
  for (let i = 1; i <= 25; ++i) await make(`Filler ${String(i).padStart(2, "0")}`);
  const DELTA_LIMITS = { requests_per_min: 30, tokens_per_min: 50000, concurrent_exchanges: 1, max_queued: 8 };
  const patched = await limAdmin("PATCH", `/v1/tenants/${D.id}`, { limits: DELTA_LIMITS });
  assert.equal(patched.status, 200, JSON.stringify(patched.body));
  assert.deepEqual(patched.body.limits, { ...DELTA_LIMITS, reply_reserve: null });
  const keyD = (await limAdmin("POST", `/v1/tenants/${D.id}/keys`, { name: "console", scopes: ["threads:read", "threads:write", "usage:read"] })).body;
  assert.match(keyD.key, /^spk_[A-Za-z0-9]{40}$/);
  /** GET /v1/limits for tenant `t`, as the admin token names it. */
  const standing = async (t) => {
    const r = await limAdmin("GET", "/v1/limits", undefined, t.id);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body;
  };
  const send = (thread, content, token = keyD.key, tenant) => call(lim.base, "POST", `/v1/threads/${thread}/messages`, { content }, token, tenant);
  const fmt = (n) => n.toLocaleString("en-US");

  await scenario("tenants: Limits shows a tenant's key its limits, its requests going down as it sends, its calls running and queued, and the upstream's gate", async (page) => {
    await signIn(page, keyD.key, "#/limits", lim.base);
    await shows(page, "#limit-requests .figure", "30 of 30 left");
    assert.equal(await text(page, "#who-label"), `tenant Delta (key ${keyD.key.slice(0, 12)}…)`);
    assert.match(await text(page, "#limits-who"), new RegExp(`tenant Delta \\(${D.id}\\)`));
    // The limits in force: those set on the tenant, the server's default
    // reply reserve.
    const s0 = await standing(D);
    assert.equal(s0.requests.remaining, 30);
    const inForce = await page.$$eval("#limits-in-force tbody tr", (rows) => rows.map((r) => [r.dataset.limit, r.querySelector(".value").textContent]));
    assert.deepEqual(inForce, [
      ["requests_per_min", "30"],
      ["tokens_per_min", "50,000"],
      ["concurrent_exchanges", "1"],
      ["max_queued", "8"],
      ["reply_reserve", fmt(s0.limits.reply_reserve)],
    ]);
    // A message sent: one request fewer left, and tokens spent.
    const sent = await send("d-notes", "one message");
    assert.equal(sent.status, 200, JSON.stringify(sent.body));
    await shows(page, "#limit-requests .figure", "29 of 30 left");
    assert.equal((await standing(D)).requests.remaining, 29);
    await shows(page, "#limit-tokens .figure", async () => `${fmt((await standing(D)).tokens.remaining)} of 50,000 left`);
    assert.ok((await standing(D)).tokens.remaining < 50000);

    // Three calls at once: one runs (its reply held upstream), two wait in
    // the tenant's queue behind its one call at once.
    upstream.hold();
    const held = [1, 2, 3].map((i) => send(`d-held-${i}`, `call ${i} ${HOLD_MARK}`));
    try {
      await until(() => upstream.held() === 1, "the first call at the upstream");
      await until(async () => (await standing(D)).exchanges.queued === 2, "two calls queued");
      await shows(page, "#limit-running", "1 of 1 running at once");
      await shows(page, "#limit-queued", "2 of 8 queued");
      await shows(page, "#limit-requests .figure", "26 of 30 left");
      await shows(page, "#upstream-running", "1 of 2 at once");
      await shows(page, "#upstream-waiting", "0, 0 of them this tenant's");
      // The upstream's gate: open (it refused nothing).
      await shows(page, "#upstream-gate", "open");
      await screenshots(page, "limits", "#limit-calls");
    } finally {
      upstream.release();
      for (const r of await Promise.all(held)) assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    // Ended: nothing running or queued; the two that waited are counted,
    // and nothing was refused.
    await shows(page, "#limit-running", "0 of 1 running at once");
    await shows(page, "#limit-queued", "0 of 8 queued");
    const after = await standing(D);
    assert.equal(after.exchanges.waited, 2);
    assert.deepEqual(after.refused, { requests_per_min: 0, tokens_per_min: 0, max_queued: 0 });
    await until(async () => (await text(page, "#limit-waited")).startsWith("2 waited"), "the waits shown");
    assert.match(await text(page, "#limit-waited"), /^2 waited for a slot since the server started, the longest [0-9.]+ (ms|s) \([0-9.]+ (ms|s) in all\)$/);
    await shows(page, "#refused-requests_per_min", "0");
    await shows(page, "#refused-max_queued", "0");
  });

  await scenario("tenants: the admin token's Limits lists the tenants' standing a page at a time, opens one, links to its limits on its page, and stops reading when left", async (page) => {
    const asked = []; // the tenant each GET /v1/limits named
    page.on("request", (r) => {
      if (new URL(r.url()).pathname === "/v1/limits") asked.push(r.headers()["spindle-tenant"]);
    });
    // Delta: one call running, one queued; Echo: one call sent, one
    // waiting for the upstream (two at once, Delta's and Echo's first).
    upstream.hold();
    const held = [send("d-held-4", `call 4 ${HOLD_MARK}`)];
    try {
      await until(() => upstream.held() === 1, "Delta's call at the upstream");
      held.push(send("d-held-5", `call 5 ${HOLD_MARK}`));
      await until(async () => (await standing(D)).exchanges.queued === 1, "Delta's second call queued");
      held.push(send("e-1", `call 1 ${HOLD_MARK}`, ADMIN, E.id));
      await until(() => upstream.held() === 2, "Echo's call at the upstream");
      held.push(send("e-2", `call 2 ${HOLD_MARK}`, ADMIN, E.id));
      await until(async () => (await standing(E)).upstream.waiting_tenant === 1, "Echo's second call waiting for the upstream");

      await signIn(page, ADMIN, "#/limits", lim.base);
      const cell = (t, f) => `#limit-rows tr[data-tenant="${t.id}"] td[data-field="${f}"]`;
      await page.waitForSelector(cell(D, "requests"));
      assert.equal(await text(page, "#who-label"), "admin");
      await shows(page, cell(D, "requests"), async () => `${(await standing(D)).requests.remaining} of 30`);
      await shows(page, cell(D, "tokens"), async () => `${fmt((await standing(D)).tokens.remaining)} of 50,000`);
      await shows(page, cell(D, "running"), "1 of 1");
      await shows(page, cell(D, "queued"), "1 of 8");
      await shows(page, cell(D, "upstream"), "0");
      await shows(page, cell(E, "requests"), "no limit");
      await shows(page, cell(E, "upstream"), "1");
      await shows(page, "#upstream-running", "2 of 2 at once");
      await shows(page, "#upstream-waiting", "1");
      await shows(page, "#upstream-gate", "open");
      // A page at a time: the first 20 of the 28 tenants, each asked for
      // with its own Spindle-Tenant.
      const tenants = (await limAdmin("GET", "/v1/tenants")).body.data;
      assert.equal(tenants.length, 28);
      const rows = () => page.$$eval("#limit-rows tr[data-tenant]", (trs) => trs.map((tr) => tr.dataset.tenant));
      assert.deepEqual(await rows(), tenants.slice(0, 20).map((t) => t.id));
      assert.equal(await text(page, "#limits-range"), "1–20 of 28");
      assert.ok(await page.isDisabled("#limits-prev"));
      await screenshots(page, "limits-admin");
      await page.click("#limits-next");
      await page.waitForFunction(() => document.querySelectorAll("#limit-rows tr[data-tenant]").length === 8);
      assert.deepEqual(await rows(), tenants.slice(20).map((t) => t.id));
      assert.equal(await text(page, "#limits-range"), "21–28 of 28");
      await page.waitForTimeout(300);
      asked.length = 0;
      await page.waitForTimeout(3000);
      const second = tenants.slice(20).map((t) => t.id);
      assert.ok(asked.length >= second.length && asked.length <= 2 * second.length, `one reading every 2 s of the 8 tenants shown: ${asked.length} asked`);
      assert.ok(asked.every((t) => second.includes(t)), "only the tenants shown are asked for");
      // Found by name.
      await page.fill("#limits-filter", "delta");
      await page.waitForFunction(() => document.querySelectorAll("#limit-rows tr[data-tenant]").length === 1);
      assert.deepEqual(await rows(), [D.id]);

      // One tenant: its standing, and which limits are its own.
      await page.click(`#limit-rows tr[data-tenant="${D.id}"] a`);
      await shows(page, "#limit-queued", "1 of 8 queued");
      assert.equal(await page.evaluate(() => location.hash), "#/limits/" + D.id);
      assert.equal(await text(page, "#limits-tenant-name"), "Delta");
      await shows(page, "#limit-running", "1 of 1 running at once");
      await shows(page, "#upstream-waiting", "1, 0 of them this tenant's");
      await shows(page, '#limits-in-force tr[data-limit="requests_per_min"] .set-by', "this tenant");
      await shows(page, '#limits-in-force tr[data-limit="reply_reserve"] .set-by', "the server's default");
      // Its limits, changed on its page under Tenants, then in force here.
      await page.click("#limits-set");
      await page.waitForSelector("#limits-form");
      assert.equal(await page.evaluate(() => location.hash), "#/tenants/" + D.id);
      assert.equal(await page.inputValue("#limit-requests_per_min"), "30");
      assert.equal(await page.inputValue("#limit-reply_reserve"), "");
      await page.fill("#limit-requests_per_min", "40");
      await page.click("#save-limits");
      await until(async () => (await limAdmin("GET", `/v1/tenants/${D.id}`)).body.limits.requests_per_min === 40, "the limit saved");
      assert.deepEqual((await limAdmin("GET", `/v1/tenants/${D.id}`)).body.limits, { ...DELTA_LIMITS, requests_per_min: 40, reply_reserve: null });
      await page.click("#tenant-limits-link");
      await shows(page, '#limits-in-force tr[data-limit="requests_per_min"] .value', "40");
      await shows(page, "#limit-requests .figure", async () => `${(await standing(D)).requests.remaining} of 40 left`);
      // Left: not read any more.
      await go(page, "#/tenants");
      await page.waitForTimeout(300);
      asked.length = 0;
      await page.waitForTimeout(2500);
      assert.deepEqual(asked, [], "Limits is not read once left");
    } finally {
      upstream.release();
      for (const r of await Promise.all(held)) assert.equal(r.status, 200, JSON.stringify(r.body));
    }
  });
} finally {
  await browser.close();
  server.stop();
  lim?.stop();
  upstream?.release();
  upstream?.close();
}
console.log(`${checks} scenarios passed`);
