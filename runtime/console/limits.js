// Limits: where a tenant stands with its limits on the model (GET
// /v1/limits, docs/limits.md): the limits in force, what is left of its
// requests and tokens in the last 60 s, its calls running and queued, and
// the upstream's fair queue and gate, which every tenant shares. A
// tenant's key (or the token of a server without tenancy) sees its own
// tenant; the admin token a page of the tenants, each with its standing
// (Spindle-Tenant names each), and one tenant in full at #/limits/{id},
// linked to the tenant's page where its limits are set. Read every 2 s
// while the view is shown and the tab visible; a 403 is said once, and
// not asked again until the next visit.

import { ApiError, actingTenant, api, seg } from "./api.js";
import { $, append, h, replace } from "./dom.js";
import { setLive } from "./main.js";
import { principal, refusal } from "./session.js";
/** @typedef {import("./api.js").Schemas} Schemas */
/** GET /v1/limits's answer. @typedef {Schemas["LimitsStanding"]} Standing */
/**
 * The upstream's queue and its gate (the shared backoff after the upstream
 * answered 429 or 503).
 * @typedef {Standing["upstream"]} Upstream
 */

const EVERY_MS = 2000;
// The admin token reads the standing of this many tenants at a time: a
// server may hold 100,000.
const PAGE = 20;

/** The limits, in the order docs/limits.md lists them, and what each bounds. */
const LIMITS = [
  ["requests_per_min", "Requests per minute", "calls to the model started in any 60 s"],
  ["tokens_per_min", "Tokens per minute", "tokens the calls use in any 60 s, prompt and reply"],
  ["concurrent_exchanges", "Calls at once", "calls to the model at once; the next waits in the tenant's queue"],
  ["max_queued", "Calls queued", "calls that may wait for one of those; past it 429"],
  ["reply_reserve", "Reply reserve", "tokens reserved for a reply that sets no max_tokens"],
];

/** The upstream gate's states: what each means, in words beside its colour. */
const GATES = {
  open: "calls are sent as the upstream's room allows",
  closed: "the upstream refused a call (429 or 503): nothing is sent until its Retry-After has passed",
  probing: "one call is sent to learn whether the upstream takes calls again",
  releasing: "the upstream took the probe: the waiting calls are sent, spread over time",
};

const state = {
  root: null,
  /** "own" (its own tenant), "list" (the admin token's tenants), "one" (the admin token, one tenant) */
  mode: "own",
  id: "", // the tenant of "one"
  active: false, // the view is shown
  timer: 0,
  seq: 0, // the current reading; answers of an older one are dropped
  /** @type {Schemas["Tenant"][]} */
  tenants: [],
  filter: "",
  page: 0,
  /** @type {Schemas["Tenant"][]} the tenants of the page shown */
  shown: [],
};

export function show(root, args, first) {
  state.active = true;
  const admin = principal().kind === "admin";
  const id = admin ? args[0] || "" : "";
  const mode = !admin ? "own" : id ? "one" : "list";
  if (first || !state.root || state.mode !== mode || state.id !== id) {
    stop();
    state.mode = mode;
    state.id = id;
    build(root);
  }
  if (!state.timer) start();
}

export function leave() {
  state.active = false;
  stop();
}

function start() {
  stop();
  const seq = state.seq;
  state.timer = setTimeout(() => tick(seq), 0);
}

function stop() {
  clearTimeout(state.timer);
  state.timer = 0;
  ++state.seq;
}

// One reading, then the next EVERY_MS later while the view is shown; a
// hidden tab asks nothing.
async function tick(seq) {
  if (seq !== state.seq) return;
  if (!document.hidden) {
    const go = state.mode === "list" ? readList : readOne;
    const again = await go(seq);
    if (seq !== state.seq) return;
    if (!again) {
      state.timer = 0;
      return;
    }
  }
  state.timer = setTimeout(() => tick(seq), EVERY_MS);
}

// -- figures -------------------------------------------------------------------

const fmt = (n) => Number(n).toLocaleString("en-US");

/** 850 ms, 4.2 s, 58 s, 2 min 5 s. */
export function duration(ms) {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 60000) return `${Math.round(ms / 1000)} s`;
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ""}`;
}

/** "N of L" with a limit, else "N". */
const of = (n, limit) => (limit > 0 ? `${fmt(n)} of ${fmt(limit)}` : fmt(n));

/**
 * A <meter> of `used` out of `limit`: amber from 80%, and red at the limit
 * when `full` is bad (a rate spent), not for calls at once (a queue forms).
 */
function meter(used, limit, label, full = true) {
  return h("meter", { min: 0, max: Math.max(1, limit), value: Math.min(used, limit), low: limit * 0.8, high: full ? limit * 0.999 : limit, optimum: 0, "aria-label": label });
}

// -- one tenant: its own, or one the admin token picked -------------------------

function build(root) {
  state.root = root;
  const head = h("header", { class: "view-head" }, h("h2", { id: "limits-title", text: "Limits" }), h("p", { class: "sub", id: "limits-who" }));
  if (state.mode === "list") {
    buildList(root, head);
    return;
  }
  const who = $("#limits-who", head);
  if (state.mode === "own") ownWho(who);
  else {
    append(who, ["Where tenant ", h("strong", { id: "limits-tenant-name", text: state.id }), " (", h("code", { text: state.id }), ") stands with its limits on the model, read every 2 s. ", h("a", { id: "limits-set", href: "#/tenants/" + seg(state.id), text: "Change its limits" }), " · ", h("a", { href: "#/limits", text: "All tenants" })]);
  }
  replace(root, head, h("div", { id: "limits-body" }, h("p", { class: "empty", text: "Reading…" })));
}

/**
 * Whose standing the view shows, for a token of one tenant: once the
 * server said who the token is (a token asked for by the first reading
 * is learned before that reading is sent again).
 * @param {HTMLElement} who
 */
function ownWho(who) {
  const p = principal();
  if (who.dataset.kind === p.kind) return;
  who.dataset.kind = p.kind;
  if (p.kind === "open") replace(who, "Where this server's calls to the model stand with their limits (no tenancy: one tenant), read every 2 s.");
  else if (p.tenant) replace(who, "Where tenant ", h("strong", { text: p.tenantName || p.tenant }), " (", h("code", { text: p.tenant }), ") stands with its limits on the model, read every 2 s.");
  else replace(who);
}

/**
 * The detail's skeleton: cards whose figures each reading fills in;
 * `setBy` adds whether each limit is the tenant's own or the default.
 */
function detail(setBy) {
  const card = (id, title, ...rest) => h("section", { class: "pane limit-card", id, "aria-labelledby": id + "-h" }, h("h3", { id: id + "-h", text: title }), ...rest);
  const figure = () => h("p", { class: "figure" });
  const note = () => h("p", { class: "sub note" });
  return [
    h(
      "div",
      { class: "limit-cards" },
      card("limit-requests", "Requests, last 60 s", figure(), h("div", { class: "bar" }), note()),
      card("limit-tokens", "Tokens, last 60 s", figure(), h("div", { class: "bar" }), note()),
      card(
        "limit-calls",
        "Calls to the model",
        h("p", { class: "figure", id: "limit-running" }),
        h("div", { class: "bar", id: "limit-running-bar" }),
        h("p", { class: "figure", id: "limit-queued" }),
        h("p", { class: "sub note", id: "limit-calls-note" }),
        h("p", { class: "sub note", id: "limit-waited" }),
      ),
      card("limit-refused", "Refused since the server started", h("dl", { class: "facts", id: "limit-refused-body" })),
      card("limit-upstream", "The upstream (every tenant)", h("div", { id: "upstream-body" })),
    ),
    h("h3", { text: "Limits in force" }),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "nodes limits-in-force", id: "limits-in-force" },
        h("thead", null, h("tr", null, ["Limit", "In force", setBy ? "Set by" : null, "What it bounds"].filter(Boolean).map((c) => h("th", { scope: "col", text: c })))),
        h(
          "tbody",
          null,
          LIMITS.map(([key, name, what]) =>
            h("tr", { "data-limit": key }, h("th", { scope: "row" }, name, " ", h("code", { class: "sub", text: key })), h("td", { class: "value num" }), setBy ? h("td", { class: "set-by sub" }) : null, h("td", { class: "sub", text: what })),
          ),
        ),
      ),
    ),
  ];
}

// Reads the tenant's standing (and, for the admin token, the tenant: its
// name and which of its limits are its own). Resolves to whether to read
// again.
async function readOne(seq) {
  const tenant = state.mode === "one" ? state.id : "";
  try {
    const [s, t] = /** @type {[Standing, Schemas["Tenant"] | null]} */ (await Promise.all([api("GET", "/v1/limits", undefined, tenant ? { tenant } : {}), tenant ? api("GET", "/v1/tenants/" + seg(tenant)) : null]));
    if (seq !== state.seq) return false;
    setLive("live");
    renderOne(s, t);
    return true;
  } catch (err) {
    if (seq !== state.seq) return false;
    const body = $("#limits-body", state.root);
    if (err instanceof ApiError && (err.status === 403 || err.status === 404)) {
      // Not this token's, or no such tenant: said once, not asked again.
      setLive("off", err);
      replace(body, err.status === 404 ? h("p", { class: "error", role: "alert", text: `No tenant ${tenant}: ${err}` }) : refusal(err, "Limits"));
      state.root = null; // built again on the next visit
      return false;
    }
    setLive("down");
    const box = $("#limits-error", state.root) || body.insertBefore(h("p", { id: "limits-error", class: "error", role: "alert" }), body.firstChild);
    box.textContent = String(err);
    return true;
  }
}

/** @param {Standing} s @param {Schemas["Tenant"] | null} t */
function renderOne(s, t) {
  const body = $("#limits-body", state.root);
  if (state.mode === "own") ownWho($("#limits-who", state.root));
  if (!$("#limit-requests", body)) replace(body, detail(!!t));
  $("#limits-error", body)?.remove();
  if (t) {
    const name = $("#limits-tenant-name", state.root);
    if (name) name.textContent = t.name;
  }
  rate($("#limit-requests", body), s.requests, "requests");
  rate($("#limit-tokens", body), s.tokens, "tokens");

  const l = s.limits;
  const x = s.exchanges;
  $("#limit-running", body).textContent = l.concurrent_exchanges > 0 ? `${of(x.running, l.concurrent_exchanges)} running at once` : `${fmt(x.running)} running (no limit at once)`;
  replace($("#limit-running-bar", body), l.concurrent_exchanges > 0 ? meter(x.running, l.concurrent_exchanges, "Calls running of those allowed at once", false) : null);
  const queued = $("#limit-queued", body);
  queued.textContent = l.concurrent_exchanges > 0 ? `${l.max_queued > 0 ? of(x.queued, l.max_queued) : fmt(x.queued)} queued` : `${fmt(x.queued)} queued`;
  queued.classList.toggle("warn", x.queued > 0);
  $("#limit-calls-note", body).textContent =
    l.concurrent_exchanges > 0
      ? `A call past ${fmt(l.concurrent_exchanges)} at once waits in the tenant's queue${l.max_queued > 0 ? `; past ${fmt(l.max_queued)} waiting it is refused (429)` : ""}.`
      : "No limit of calls at once: none waits in the tenant's queue.";
  $("#limit-waited", body).textContent =
    x.waited > 0 ? `${fmt(x.waited)} waited for a slot since the server started, the longest ${duration(x.max_wait_ms)} (${duration(x.wait_ms)} in all)` : "None has waited for a slot since the server started.";
  const r = s.refused;
  replace(
    $("#limit-refused-body", body),
    [
      ["requests_per_min", "Requests per minute"],
      ["tokens_per_min", "Tokens per minute"],
      ["max_queued", "Queue full"],
    ].map(([key, name]) => [h("dt", { text: name }), h("dd", { id: "refused-" + key, class: r[key] > 0 ? "warn" : null, text: fmt(r[key]) })]),
  );

  upstream($("#upstream-body", body), s.upstream, true);

  for (const [key] of LIMITS) {
    const row = $(`tr[data-limit="${key}"]`, body);
    const v = l[key];
    row.querySelector(".value").textContent = v > 0 ? fmt(v) : "no limit";
    const own = t?.limits?.[key];
    const setBy = row.querySelector(".set-by");
    if (setBy) setBy.textContent = own === null || own === undefined ? "the server's default" : "this tenant";
  }
}

/**
 * A rate's card: what is left of it, a meter of what is used, and when its
 * window clears; "no limit" without one.
 * @param {HTMLElement} card @param {Schemas["LimitWindow"] | null} w @param {string} what
 */
function rate(card, w, what) {
  const figure = card.querySelector(".figure");
  const bar = card.querySelector(".bar");
  const note = card.querySelector(".note");
  if (!w) {
    figure.textContent = "no limit";
    figure.classList.remove("spent");
    replace(bar);
    note.textContent = `No ${what}_per_min: its calls' ${what} are not held to a limit.`;
    return;
  }
  figure.textContent = `${of(w.remaining, w.limit)} left`;
  figure.classList.toggle("spent", w.remaining === 0);
  replace(bar, meter(w.limit - w.remaining, w.limit, `${what} used of ${fmt(w.limit)}`));
  const used = w.limit - w.remaining;
  note.textContent =
    (used > 0 ? `${fmt(used)} used${what === "tokens" ? " or reserved" : ""}` : "none used") +
    (w.reset_ms > 0 ? ` · the window clears in ${duration(w.reset_ms)}` : "") +
    (w.remaining === 0 ? ` · the next call is refused (429) until some of it clears` : "");
}

/**
 * The upstream's queue and gate into `el`: shared by every tenant, so the
 * tenant's own waiting calls are told apart when `mine`.
 * @param {HTMLElement} el @param {Upstream} u @param {boolean} mine
 */
function upstream(el, u, mine) {
  const gate = u.gate;
  replace(
    el,
    h(
      "p",
      { class: "gate-line" },
      "Gate ",
      h("span", { id: "upstream-gate", class: "gate gate-" + gate, text: gate }),
      gate === "closed" ? h("span", { id: "upstream-reopens", text: ` · its probe goes in ${duration(u.reopens_in_ms)}` }) : null,
      h("span", { class: "sub gate-what", text: ": " + (GATES[gate] || "") }),
    ),
    h(
      "dl",
      { class: "facts" },
      h("dt", { text: "Sending" }),
      h("dd", { id: "upstream-running", text: u.concurrency > 0 ? `${of(u.running, u.concurrency)} at once` : `${fmt(u.running)} (no limit at once)` }),
      h("dt", { text: "Waiting" }),
      h("dd", { id: "upstream-waiting", class: u.waiting > 0 ? "warn" : null, text: `${fmt(u.waiting)}${mine ? `, ${fmt(u.waiting_tenant)} of them this tenant's` : ""}` }),
      h("dt", { text: "Tokens per minute" }),
      h("dd", { id: "upstream-tpm", text: u.tokens_per_min > 0 ? fmt(u.tokens_per_min) : "no limit" }),
      mine ? [h("dt", { text: "This tenant waited" }), h("dd", { id: "upstream-waited", text: u.waited_tenant > 0 ? `${fmt(u.waited_tenant)} calls since start, the longest ${duration(u.max_wait_ms_tenant)}` : "never" })] : null,
      h("dt", { text: "Refused" }),
      h("dd", { id: "upstream-refused", title: "The upstream's refusals (429 or 503) since the server started.", text: fmt(u.refused) }),
    ),
  );
}

// -- the admin token: a page of tenants ----------------------------------------

function buildList(root, head) {
  append($("#limits-who", head), [
    "Each tenant's standing with its limits on the model, read every 2 s for the tenants shown. A tenant's limits are set on its page under ",
    h("a", { href: "#/tenants", text: "Tenants" }),
    ".",
  ]);
  const filter = h("input", { id: "limits-filter", type: "search", placeholder: "name or ID", autocomplete: "off", value: state.filter });
  filter.addEventListener("input", () => {
    state.filter = filter.value.trim().toLowerCase();
    state.page = 0;
    renderPage();
  });
  const prev = h("button", { type: "button", id: "limits-prev", class: "small", text: "Previous", onclick: () => turn(-1) });
  const next = h("button", { type: "button", id: "limits-next", class: "small", text: "Next", onclick: () => turn(1) });
  replace(
    root,
    head,
    h("section", { class: "pane limit-upstream-all", "aria-labelledby": "upstream-all-h" }, h("h3", { id: "upstream-all-h", text: "The upstream (every tenant)" }), h("div", { id: "upstream-body" }, h("p", { class: "empty", text: "Reading…" }))),
    h(
      "div",
      { class: "row limits-tools" },
      h("label", { for: "limits-filter", text: "Find a tenant" }),
      filter,
      h("span", { class: "pager" }, prev, h("span", { id: "limits-range", class: "sub", role: "status" }), next),
    ),
    h(
      "table",
      { class: "nodes limits-table", id: "limits-list" },
      h("thead", null, h("tr", null, ["Tenant", "Requests left", "Tokens left", "Running", "Queued", "Waiting upstream"].map((c, i) => h("th", { scope: "col", class: i ? "num" : null, text: c })))),
      h("tbody", { id: "limit-rows" }, h("tr", null, h("td", { colspan: 6, class: "empty", text: "Reading the tenants…" }))),
    ),
  );
  loadTenants();
}

async function loadTenants() {
  const root = state.root;
  const current = () => state.active && state.root === root && state.mode === "list";
  try {
    /** @type {Schemas["TenantList"]} */
    const r = await api("GET", "/v1/tenants");
    if (!current()) return;
    state.tenants = r.data;
  } catch (err) {
    if (!current()) return;
    stop();
    replace($("#limit-rows", state.root), h("tr", null, h("td", { colspan: 6 }, refusal(err, "Tenants"))));
    if (err instanceof ApiError && err.status === 403) setLive("off", err);
    state.root = null;
    return;
  }
  renderPage();
}

function matching() {
  const f = state.filter;
  return f ? state.tenants.filter((t) => t.name.toLowerCase().includes(f) || t.id.includes(f)) : state.tenants;
}

function turn(by) {
  const pages = Math.max(1, Math.ceil(matching().length / PAGE));
  state.page = Math.min(pages - 1, Math.max(0, state.page + by));
  renderPage();
}

// The page's rows, each read again every 2 s in place (a row's link keeps
// its focus).
function renderPage() {
  const rows = $("#limit-rows", state.root);
  if (!rows) return;
  const match = matching();
  const pages = Math.max(1, Math.ceil(match.length / PAGE));
  state.page = Math.min(state.page, pages - 1);
  const first = state.page * PAGE;
  state.shown = match.slice(first, first + PAGE);
  $("#limits-range", state.root).textContent = match.length ? `${fmt(first + 1)}–${fmt(first + state.shown.length)} of ${fmt(match.length)}` : "";
  /** @type {HTMLButtonElement} */ ($("#limits-prev", state.root)).disabled = state.page === 0;
  /** @type {HTMLButtonElement} */ ($("#limits-next", state.root)).disabled = state.page >= pages - 1;
  const acting = actingTenant();
  replace(
    rows,
    state.shown.map((t) =>
      h(
        "tr",
        { "data-tenant": t.id },
        h(
          "th",
          { scope: "row", "data-label": "Tenant" },
          h("a", { href: "#/limits/" + seg(t.id) }, h("span", { class: "tenant-name", text: t.name })),
          t.id === acting ? h("span", { class: "badge", text: "acting in" }) : null,
          h("code", { class: "sub tid", text: t.id }),
        ),
        ["requests", "tokens", "running", "queued", "upstream"].map((f, i) => h("td", { "data-field": f, "data-label": ["Requests left", "Tokens left", "Running", "Queued", "Waiting upstream"][i], class: "num", text: "…" })),
      ),
    ),
  );
  if (!state.shown.length) rows.append(h("tr", null, h("td", { colspan: 6, class: "empty", text: state.filter ? "No tenant matches." : "No tenants." })));
  // Read the new page now, not at the next tick.
  if (state.active) start();
}

// Reads the standing of each tenant of the page (Spindle-Tenant names
// each). Resolves to whether to read again.
async function readList(seq) {
  const shown = state.shown;
  if (!shown.length) return true;
  const answers = await Promise.all(
    shown.map((t) =>
      api("GET", "/v1/limits", undefined, { tenant: t.id }).then(
        (/** @type {Standing} */ s) => ({ t, s, err: null }),
        (err) => ({ t, s: null, err }),
      ),
    ),
  );
  if (seq !== state.seq) return false;
  const rows = $("#limit-rows", state.root);
  let upstreamShown = false;
  let failed = null;
  for (const { t, s, err } of answers) {
    const row = rows.querySelector(`tr[data-tenant="${CSS.escape(t.id)}"]`);
    if (!row) continue;
    const cell = (f) => row.querySelector(`td[data-field="${f}"]`);
    if (err) {
      failed = err;
      for (const f of ["requests", "tokens", "running", "queued", "upstream"]) cell(f).textContent = "–";
      cell("requests").textContent = err.status === 404 ? "gone" : String(err.code || "error");
      cell("requests").title = String(err);
      continue;
    }
    if (!upstreamShown) {
      upstream($("#upstream-body", state.root), s.upstream, false);
      upstreamShown = true;
    }
    const l = s.limits;
    const set = (f, text, warn, title = "") => {
      const c = cell(f);
      c.textContent = text;
      c.classList.toggle(f === "requests" || f === "tokens" ? "spent" : "warn", !!warn);
      c.title = title;
    };
    set("requests", s.requests ? of(s.requests.remaining, s.requests.limit) : "no limit", s.requests && s.requests.remaining === 0, s.requests ? `Clears in ${duration(s.requests.reset_ms)}` : "");
    set("tokens", s.tokens ? of(s.tokens.remaining, s.tokens.limit) : "no limit", s.tokens && s.tokens.remaining === 0, s.tokens ? `Clears in ${duration(s.tokens.reset_ms)}` : "");
    set("running", of(s.exchanges.running, l.concurrent_exchanges), l.concurrent_exchanges > 0 && s.exchanges.running >= l.concurrent_exchanges, l.concurrent_exchanges > 0 ? "" : "No limit of calls at once");
    set("queued", l.concurrent_exchanges > 0 ? of(s.exchanges.queued, l.max_queued) : fmt(s.exchanges.queued), s.exchanges.queued > 0);
    set("upstream", fmt(s.upstream.waiting_tenant), s.upstream.waiting_tenant > 0);
  }
  if (failed && !upstreamShown) setLive("down", failed);
  else setLive("live");
  return true;
}
