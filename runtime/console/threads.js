// Conversations: the list of threads (search by ID or metadata, paging),
// a thread's turns as a chat with replies streamed in (each reply with
// what its exchange spent), its context window and its memory entries;
// fork, clear and delete; and, for a token with usage:read, what the
// tenant spent today and in the last 30 days and what the open thread
// spent (GET /v1/usage). The admin token acting in no tenant is offered a
// choice of tenant instead.

import { api, followEvents, postStream, seg } from "./api.js";
import { $, h, replace, timeEl } from "./dom.js";
import { markdown } from "./markdown.js";
import { confirmDialog, notify, setLive } from "./main.js";
import { needsTenant, principal, refusal } from "./session.js";
import { chooser } from "./tenants.js";
/** @typedef {import("./api.js").Schemas} Schemas */

const state = {
  root: null,
  list: null, // the <ul> of threads
  cursor: null,
  filter: "",
  thread: null, // ID shown
  threadRead: null, // ID shown whose GET /v1/threads/{id} answered (its usage may be asked for)
  tab: "chat",
  streaming: false,
  stopEvents: null,
  refreshTimer: 0,
  listTimer: 0,
  usageTimer: 0,
  /** @type {Record<string, number>} the last request of each usage row */
  usageSeq: {},
};

const TABS = [
  ["chat", "Chat"],
  ["context", "Context window"],
  ["memory", "Memory"],
];

export function show(root, args, first) {
  if (needsTenant()) {
    if (first) replace(root, h("h2", { id: "threads-title", class: "sr-only", text: "Conversations" }), chooser("its conversations"));
    setLive("off");
    return;
  }
  if (first || !state.root) build(root);
  const [id, tab] = args;
  state.tab = TABS.some(([t]) => t === tab) ? tab : "chat";
  if (id !== undefined && id !== "") openThread(id);
  else {
    state.thread = null;
    state.threadRead = null;
    replace($("#thread", root), h("p", { class: "empty", text: "Pick a conversation, or start a new one." }));
    loadUsage(["thread"]);
  }
  if (!state.stopEvents) {
    state.stopEvents = followEvents("types=thread", onEvent, setLive);
  }
}

export function leave() {
  state.stopEvents?.();
  state.stopEvents = null;
  clearTimeout(state.usageTimer);
}

function build(root) {
  state.root = root;
  const search = h("input", { id: "thread-search", type: "search", placeholder: "ID, or key=value", autocomplete: "off" });
  state.list = h("ul", { id: "thread-items", class: "thread-items", "aria-label": "Conversations" });
  const more = h("button", { id: "thread-more", type: "button", hidden: true, onclick: () => loadList(false) }, "More");
  replace(
    root,
    h("h2", { id: "threads-title", class: "sr-only", text: "Conversations" }),
    h(
      "div",
      { class: "split" },
      h(
        "aside",
        { class: "pane list-pane", "aria-label": "Conversation list" },
        h(
          "form",
          {
            class: "search",
            role: "search",
            onsubmit: (e) => {
              e.preventDefault();
              state.filter = search.value.trim();
              loadList(true);
            },
          },
          h("label", { for: "thread-search", text: "Search conversations" }),
          h("div", { class: "row" }, search, h("button", { type: "submit", text: "Search" })),
        ),
        h("button", { type: "button", class: "primary", id: "new-thread", onclick: newThread }, "New conversation"),
        state.list,
        more,
      ),
      h("article", { id: "thread", class: "pane thread-pane", "aria-live": "off" }),
    ),
  );
  // The usage panel once the list answered: by then the server said who
  // the token is (a token asked for by the list's call is learned first).
  loadList(true).then(() => loadUsage());
}

// -- the list ----------------------------------------------------------------

async function loadList(fresh) {
  const more = $("#thread-more", state.root);
  if (fresh) {
    state.cursor = null;
    replace(state.list);
  }
  const f = state.filter;
  try {
    if (f && !f.includes("=")) {
      // An ID: read that thread (the server judges the ID).
      /** @type {Schemas["Thread"]} */
      const t = await api("GET", "/v1/threads/" + seg(f));
      replace(state.list, threadItem(t));
      more.hidden = true;
      return;
    }
    const q = new URLSearchParams({ limit: "20" });
    for (const pair of f.split(/\s+/).filter(Boolean)) {
      const at = pair.indexOf("=");
      q.append("metadata." + pair.slice(0, at), pair.slice(at + 1));
    }
    if (state.cursor) q.set("cursor", state.cursor);
    /** @type {Schemas["ThreadList"]} */
    const page = await api("GET", "/v1/threads?" + q);
    for (const t of page.data) state.list.append(threadItem(t));
    if (!state.list.children.length) state.list.append(h("li", { class: "empty", text: "No conversations." }));
    state.cursor = page.next_cursor;
    more.hidden = !page.has_more;
    // The first data on screen: the console's "interactive" moment, which
    // bench/bench_console.mjs reads from the browser's performance timeline.
    if (!performance.getEntriesByName("spindle:interactive").length) performance.mark("spindle:interactive");
  } catch (err) {
    replace(state.list, refusal(err, "Conversations", "li"));
    more.hidden = true;
  }
}

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** @param {Schemas["Thread"]} t */
function threadItem(t) {
  const meta = Object.entries(t.metadata || {}).map(([k, v]) => h("span", { class: "chip", text: `${k}=${v}` }));
  return h(
    "li",
    { "data-thread": t.thread_id },
    h(
      "a",
      { href: "#/threads/" + seg(t.thread_id), "aria-current": t.thread_id === state.thread ? "true" : null },
      h("code", { class: "tid", text: t.thread_id }),
      h("span", { class: "sub" }, h("span", { class: "turn-count", text: plural(t.turns, "turn") }), " · ", timeEl(t.updated_at)),
      meta.length ? h("span", { class: "chips" }, meta) : null,
    ),
  );
}

async function newThread() {
  try {
    /** @type {Schemas["Thread"]} */
    const t = await api("POST", "/v1/threads", {});
    location.hash = "#/threads/" + seg(t.thread_id);
    loadList(true);
  } catch (err) {
    notify(err);
  }
}

// Thread events: the list and the open thread follow other clients. A
// turn or a clear changes its row in place; a thread created, forked or
// deleted reads the list again (each read is a new walk of the listing,
// which costs the store a little while it is young: docs/console.md).
function onEvent(type, data) {
  const count = type === "thread.turn_appended" ? data.turns : type === "thread.cleared" ? 0 : null;
  if (count !== null) {
    const row = $(`#thread-items li[data-thread="${CSS.escape(data.thread)}"] .turn-count`, state.root);
    if (row) row.textContent = plural(count, "turn");
  } else if (!state.filter) {
    clearTimeout(state.listTimer);
    state.listTimer = setTimeout(() => loadList(true), 300);
  }
  if (data.thread !== state.thread) return;
  if (type === "thread.turn_appended") scheduleUsage();
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(() => {
    if (!state.streaming) {
      if (type === "thread.deleted") {
        notify(`Conversation ${data.thread} was deleted.`, "info");
        location.hash = "#/threads";
      } else if (state.tab === "chat") loadTurns();
    }
  }, 300);
}

// -- one thread ----------------------------------------------------------------

async function openThread(id) {
  const pane = $("#thread", state.root);
  const same = state.thread === id && pane.dataset.thread === id;
  state.thread = id;
  for (const a of state.list.querySelectorAll("a")) {
    a.toggleAttribute("aria-current", a.closest("li").dataset.thread === id);
  }
  if (!same) {
    pane.dataset.thread = id;
    state.threadRead = null;
    loadUsage(["thread"]);
    replace(
      pane,
      h("header", { class: "thread-head" }, h("h2", null, h("code", { class: "tid", text: id })), h("div", { id: "thread-info", class: "sub" })),
      h("p", { class: "loading", text: "Loading…" }),
    );
    try {
      /** @type {Schemas["Thread"]} */
      const t = await api("GET", "/v1/threads/" + seg(id));
      if (state.thread !== id) return;
      renderThread(pane, t);
      state.threadRead = id;
      loadUsage(["thread"]);
    } catch (err) {
      if (state.thread !== id) return;
      replace(pane, h("header", { class: "thread-head" }, h("h2", null, h("code", { class: "tid", text: id }))), refusal(err, "This conversation", "p"));
      return;
    }
  }
  selectTab(state.tab);
}

/** @param {HTMLElement} pane @param {Schemas["Thread"]} t */
function renderThread(pane, t) {
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "Thread views" });
  for (const [key, label] of TABS) {
    tabs.append(
      h("a", {
        role: "tab",
        id: "tab-" + key,
        href: `#/threads/${seg(t.thread_id)}/${key}`,
        "aria-controls": "panel-" + key,
        text: label,
      }),
    );
  }
  replace(
    pane,
    h(
      "header",
      { class: "thread-head" },
      h("h2", null, h("code", { class: "tid", text: t.thread_id })),
      h("div", { id: "thread-info", class: "sub" }, info(t)),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", id: "fork", onclick: () => fork(t.thread_id) }, "Fork"),
        h("button", { type: "button", id: "clear", onclick: () => clear(t.thread_id) }, "Clear"),
        h("button", { type: "button", id: "delete", class: "danger", onclick: () => remove(t.thread_id) }, "Delete"),
      ),
    ),
    tabs,
    h("div", { id: "panel", role: "tabpanel" }),
  );
}

/** @param {Schemas["Thread"]} t */
function info(t) {
  const meta = Object.entries(t.metadata || {}).map(([k, v]) => h("span", { class: "chip", text: `${k}=${v}` }));
  return [`${plural(t.turns, "turn")} · created `, timeEl(t.created_at), " · updated ", timeEl(t.updated_at), " ", meta];
}

async function refreshInfo() {
  try {
    /** @type {Schemas["Thread"]} */
    const t = await api("GET", "/v1/threads/" + seg(state.thread));
    const el = $("#thread-info", state.root);
    if (el) replace(el, info(t));
  } catch {
    // the thread went away: its events say so
  }
}

function selectTab(tab) {
  for (const [key] of TABS) {
    const el = $("#tab-" + key, state.root);
    if (el) el.setAttribute("aria-selected", String(key === tab));
  }
  const panel = $("#panel", state.root);
  if (!panel) return;
  panel.id = "panel";
  panel.setAttribute("aria-labelledby", "tab-" + tab);
  if (tab === "chat") chatPanel(panel);
  else if (tab === "context") contextPanel(panel);
  else memoryPanel(panel);
}

// Fork: a copy of every completed turn and the metadata in a new thread.
async function fork(id) {
  try {
    /** @type {Schemas["ThreadCopy"]} */
    const t = await api("POST", `/v1/threads/${seg(id)}/copy`);
    notify(`Forked into ${t.thread_id}.`, "info");
    location.hash = "#/threads/" + seg(t.thread_id);
  } catch (err) {
    notify(err);
  }
}

async function clear(id) {
  if (!(await confirmDialog("Clear this conversation?", `Every turn of ${id} is removed. Its metadata and context window stay.`))) return;
  try {
    /** @type {Schemas["TurnsCleared"]} */
    const r = await api("DELETE", `/v1/threads/${seg(id)}/turns`);
    notify(`Cleared ${r.cleared} turns.`, "info");
    loadTurns();
    refreshInfo();
  } catch (err) {
    notify(err);
  }
}

async function remove(id) {
  if (!(await confirmDialog("Delete this conversation?", `${id}, its turns, metadata, context window and memories are deleted for good.`))) return;
  try {
    await api("DELETE", `/v1/threads/${seg(id)}`);
    notify(`Deleted ${id}.`, "info");
    state.thread = null;
    location.hash = "#/threads";
    loadList(true);
  } catch (err) {
    notify(err);
  }
}

// -- chat ------------------------------------------------------------------------

/** @param {Schemas["Turn"]} t */
function turnItem(t) {
  const role = ["user", "assistant", "system", "tool"].includes(t.role) ? t.role : "other";
  return h(
    "li",
    { class: `turn role-${role}${t.interrupted ? " interrupted" : ""}` },
    h(
      "div",
      { class: "turn-head" },
      h("span", { class: "role", text: t.role }),
      t.tool_call_id ? h("code", { class: "tool-call", text: "call " + t.tool_call_id }) : null,
      t.interrupted ? h("span", { class: "badge warn", text: "interrupted" }) : null,
      timeEl(t.timestamp),
    ),
    h("div", { class: "content md" }, markdown(t.content)),
    t.usage ? usageLine(t.usage) : null,
  );
}

function chatPanel(panel) {
  const turns = h("ol", { id: "turns", class: "turns", "aria-label": "Turns", "aria-live": "polite" });
  const text = h("textarea", { id: "message", rows: 3, required: true, placeholder: "Write a message (Ctrl+Enter sends)" });
  const form = h(
    "form",
    { class: "composer", onsubmit: (e) => (e.preventDefault(), sendMessage(text)) },
    h("label", { for: "message", text: "Message" }),
    text,
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary", id: "send" }, "Send"), h("span", { id: "send-status", role: "status" })),
  );
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
  });
  replace(panel, turns, form);
  loadTurns();
}

async function loadTurns() {
  const id = state.thread;
  const list = $("#turns", state.root);
  if (!list) return;
  try {
    /** @type {Schemas["History"]} */
    const r = await api("GET", `/v1/threads/${seg(id)}/history?max_turns=100`);
    if (state.thread !== id || state.streaming) return;
    replace(list, r.turns.map(turnItem));
    if (r.total_turns > r.turns.length) list.prepend(h("li", { class: "sub", text: `${r.total_turns - r.turns.length} earlier turns not shown` }));
    if (!r.turns.length) list.append(h("li", { class: "empty", text: "No turns yet." }));
    list.lastElementChild?.scrollIntoView({ block: "nearest" });
  } catch (err) {
    if (err.status === 404) replace(list, h("li", { class: "empty", text: "No turns yet." }));
    else replace(list, refusal(err, "The turns", "li"));
  }
}

async function sendMessage(text) {
  const content = text.value;
  if (!content.trim() || state.streaming) return;
  const id = state.thread;
  const list = $("#turns", state.root);
  const status = $("#send-status", state.root);
  const button = $("#send", state.root);
  list.querySelector(".empty")?.remove();
  list.append(turnItem({ role: "user", content, timestamp: Date.now() }));
  const body = h("div", { class: "content streaming", "aria-busy": "true" });
  const reply = h("li", { class: "turn role-assistant", id: "streaming-turn" }, h("div", { class: "turn-head" }, h("span", { class: "role", text: "assistant" })), body);
  list.append(reply);
  reply.scrollIntoView({ block: "nearest" });
  state.streaming = true;
  button.disabled = true;
  status.textContent = "Sending…";
  let full = "";
  try {
    await postStream(`/v1/threads/${seg(id)}/messages/stream`, { content }, (e) => {
      const data = JSON.parse(e.data);
      if (e.event === "delta") {
        full += data.content;
        body.append(document.createTextNode(data.content));
        status.textContent = "Receiving…";
      } else if (e.event === "done" || e.event === "cancelled") {
        if (data.interrupted) reply.classList.add("interrupted");
        /** @type {Schemas["Usage"] | undefined} */
        const usage = data.usage;
        if (usage) reply.append(usageLine(usage));
      } else if (e.event === "error") {
        throw Object.assign(new Error(data.error?.message || "the reply failed"), { toString: () => `${data.error?.code}: ${data.error?.message}` });
      }
    });
    text.value = "";
    status.textContent = "";
    body.removeAttribute("aria-busy");
    replace(body, markdown(full));
    body.className = "content md";
    reply.removeAttribute("id");
    scheduleUsage();
  } catch (err) {
    reply.remove();
    list.lastElementChild?.classList.add("failed");
    status.textContent = "";
    notify(err);
  } finally {
    state.streaming = false;
    button.disabled = false;
    refreshInfo();
  }
}

// -- usage ---------------------------------------------------------------------
// What exchanges spent (docs/usage.md): on each assistant turn an exchange
// stored, and in a panel below the list (GET /v1/usage, scope usage:read).

const fmt = (n) => Number(n).toLocaleString("en-US");

const SOURCES = {
  counted: "counted by spindle with its tokenizer",
  upstream: "as the upstream model reported them",
};

/** "412 in · 96 out · counted": what one exchange spent. @param {Schemas["Usage"]} u */
function usageLine(u) {
  return h("div", {
    class: "turn-usage",
    "data-source": u.source,
    title: `This exchange: ${fmt(u.prompt_tokens)} prompt tokens, ${fmt(u.completion_tokens)} completion tokens (${fmt(u.total_tokens)} in all), ${SOURCES[u.source] || u.source}.`,
    text: `${fmt(u.prompt_tokens)} in · ${fmt(u.completion_tokens)} out · ${u.source}`,
  });
}

/** The panel's rows: what the tenant spent today, in 30 days, and the open thread. */
const USAGE_ROWS = [
  ["today", "Today (UTC)"],
  ["month", "Last 30 days"],
  ["thread", "This conversation"],
];
const DAY_MS = 86400000;

/** Whether the token may read usage reports (its scopes, from GET /v1/me). */
const mayReadUsage = () => principal().scopes.includes("usage:read");

function usagePanel() {
  return h(
    "section",
    { id: "usage", class: "usage", "aria-labelledby": "usage-title" },
    h("h3", { id: "usage-title", text: "Usage" }),
    h(
      "table",
      { class: "usage-table" },
      h("thead", null, h("tr", null, ["Exchanges", "Prompt tokens", "Completion tokens", "Source"].map((c) => h("th", { scope: "col", text: c })))),
      USAGE_ROWS.map(([key]) => h("tbody", { id: "usage-" + key, hidden: true })),
    ),
  );
}

/** Reads the panel's rows `keys` again, a little later (coalesced). */
function scheduleUsage() {
  clearTimeout(state.usageTimer);
  state.usageTimer = setTimeout(() => loadUsage(), 300);
}

/**
 * Reads the usage panel's rows `keys` (GET /v1/usage: from today's date,
 * from the date 30 days ago, and for the open thread). A token without
 * usage:read has no panel, and the route is not asked.
 */
function loadUsage(keys = USAGE_ROWS.map(([key]) => key)) {
  const aside = $(".list-pane", state.root);
  let panel = $("#usage", state.root);
  if (!aside || !mayReadUsage()) {
    panel?.remove();
    return;
  }
  if (!panel) aside.append((panel = usagePanel()));
  const day = (ms) => new Date(ms).toISOString().slice(0, 10);
  const now = Date.now();
  for (const [key, label] of USAGE_ROWS) {
    if (!keys.includes(key)) continue;
    const body = $("#usage-" + key, panel);
    const seq = (state.usageSeq[key] = (state.usageSeq[key] || 0) + 1);
    const thread = state.threadRead;
    if (key === "thread" && !thread) {
      body.hidden = true;
      replace(body);
      continue;
    }
    const q = key === "today" ? { from: day(now) } : key === "month" ? { from: day(now - 30 * DAY_MS) } : { thread_id: thread };
    api("GET", "/v1/usage?" + new URLSearchParams(q)).then(
      (/** @type {Schemas["UsageReport"]} */ r) => {
        if (state.usageSeq[key] !== seq) return;
        body.dataset.thread = thread || "";
        showUsage(body, label, r);
      },
      (err) => {
        if (state.usageSeq[key] !== seq) return;
        body.hidden = false;
        replace(body, h("tr", null, h("td", { colspan: 4 }, refusal(err, "Usage"))));
      },
    );
  }
}

/** @param {HTMLElement} body @param {string} label @param {Schemas["UsageReport"]} r */
function showUsage(body, label, r) {
  /** @type {Schemas["UsageFigures"]} */
  const zero = { exchanges: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  // Without group_by there is always one item; zeros if there were none.
  const g = r.data[0] || { ...zero, by_source: { counted: zero, upstream: zero } };
  const spent = (/** @type {Schemas["UsageFigures"]} */ f) => f.exchanges > 0 || f.total_tokens > 0;
  const { counted, upstream } = g.by_source;
  const both = spent(counted) && spent(upstream);
  const only = both ? null : spent(counted) ? "counted" : spent(upstream) ? "upstream" : null;
  body.hidden = false;
  replace(
    body,
    h("tr", { class: "usage-period" }, h("th", { scope: "rowgroup", colspan: 4, title: `From ${r.from} to ${r.to} (whole hours, UTC).`, text: label })),
    usageRow("usage-total", g, only, both ? "both" : only || "–"),
    both ? [usageRow("usage-source", counted, "counted", "counted"), usageRow("usage-source", upstream, "upstream", "upstream")] : null,
  );
}

/**
 * A row of figures; `source` the one they are of (null for both or none).
 * @param {string} cls @param {Schemas["UsageFigures"]} f @param {string | null} source @param {string} shown
 */
function usageRow(cls, f, source, shown) {
  return h(
    "tr",
    { class: cls, "data-source": source },
    h("td", { class: "num exchanges", text: fmt(f.exchanges) }),
    h("td", { class: "num prompt", text: fmt(f.prompt_tokens) }),
    h("td", { class: "num completion", text: fmt(f.completion_tokens) }),
    h("td", { class: "source", title: source ? SOURCES[source] : shown === "both" ? "counted and upstream, summed; apart below" : null, text: shown }),
  );
}

// -- context window ----------------------------------------------------------

const ITEM_TYPES = ["text", "code", "file", "repl-history", "error", "custom"];

function contextPanel(panel) {
  const content = h("textarea", { id: "item-content", rows: 3, required: true });
  const type = h("select", { id: "item-type" }, ITEM_TYPES.map((t) => h("option", { value: t, text: t })));
  replace(
    panel,
    h(
      "form",
      { class: "composer", onsubmit: (e) => (e.preventDefault(), addItem(type.value, content)) },
      h("div", { class: "row" }, h("label", { for: "item-type", text: "Type" }), type),
      h("label", { for: "item-content", text: "Item content (markdown)" }),
      content,
      h("div", { class: "row" }, h("button", { type: "submit", class: "primary", id: "add-item" }, "Add to window"), h("span", { id: "evicted", role: "status" })),
    ),
    h("ol", { id: "items", class: "items", "aria-label": "Context items, oldest first" }),
  );
  loadItems();
}

async function loadItems() {
  const list = $("#items", state.root);
  try {
    /** @type {Schemas["ContextItemList"]} */
    const r = await api("GET", `/v1/threads/${seg(state.thread)}/items`);
    replace(list, r.items.map(itemView));
    if (!r.items.length) list.append(h("li", { class: "empty", text: "The window is empty." }));
  } catch (err) {
    replace(list, refusal(err, "The context window", "li"));
  }
}

// Context items keep Universal Time: seconds since 1900 (docs/context.md).
const ntpToMs = (seconds) => (seconds - 2208988800) * 1000;

/** @param {Schemas["ContextItem"]} item */
function itemView(item) {
  const meta = item.metadata ? Object.entries(item.metadata).map(([k, v]) => h("span", { class: "chip", text: `${k}=${typeof v === "string" ? v : JSON.stringify(v)}` })) : [];
  const body = item.type === "code" || item.type === "repl-history" ? h("pre", null, h("code", { text: item.content })) : markdown(item.content);
  return h(
    "li",
    { class: "item", "data-item": item.id },
    h("div", { class: "turn-head" }, h("code", { class: "item-id", text: item.id }), h("span", { class: "badge", text: item.type }), meta, timeEl(ntpToMs(item.timestamp))),
    h("div", { class: "content md" }, body),
  );
}

async function addItem(type, content) {
  const out = $("#evicted", state.root);
  try {
    /** @type {Schemas["ContextItemAdded"]} */
    const r = await api("POST", `/v1/threads/${seg(state.thread)}/items`, { type, content: content.value });
    content.value = "";
    out.textContent = r.evicted.length ? `Added ${r.item.id}; evicted ${r.evicted.join(", ")}` : `Added ${r.item.id}`;
    for (const gone of r.evicted) {
      const el = $(`[data-item="${CSS.escape(gone)}"]`, state.root);
      el?.classList.add("evicted");
    }
    // The evicted items fade for a moment, then the window is read again.
    setTimeout(loadItems, r.evicted.length ? 600 : 0);
  } catch (err) {
    notify(err);
  }
}

// -- memory ------------------------------------------------------------------------

async function memoryPanel(panel) {
  const list = h("ul", { id: "memories", class: "items", "aria-label": "Memory entries" });
  replace(panel, h("p", { class: "sub", text: "Long-term memory entries stored from this conversation without a user." }), list);
  try {
    /** @type {Schemas["MemoryEntryPage"]} */
    const r = await api("GET", `/v1/memories/entries?thread_id=${seg(state.thread)}&limit=100`);
    replace(
      list,
      r.entries.map((m) => h("li", { class: "item" }, h("div", { class: "turn-head" }, h("code", { text: "#" + m.id }), timeEl(m.created)), h("div", { class: "content", text: m.content }))),
    );
    if (!r.entries.length) list.append(h("li", { class: "empty", text: "No memory entries." }));
  } catch (err) {
    replace(list, refusal(err, "Memory", "li"));
  }
}
