// Orchestration: every orchestration as a tree of its tasks (IDs, states
// in colour, workers, leases and their expiry, attempts), kept current by
// the event stream; the task the next claim takes (D1) is marked, and a
// stale or failed task can be requeued. A token the server refuses the
// orchestrations (403) is told so here, once.

import { api, followEvents, seg } from "./api.js";
import { $, h, replace } from "./dom.js";
import { notify, setLive } from "./main.js";
import { needsTenant, refusal } from "./session.js";
import { chooser } from "./tenants.js";
/** @typedef {import("./api.js").Schemas} Schemas */

const STATES = ["pending", "running", "completed", "failed", "stale"];

const state = {
  root: null,
  box: null, // the orchestrations
  nodes: new Map(), // task ID -> {task, li, row, parts}
  orchs: new Map(), // orchestration ID -> {section, tree, counts}
  next: null,
  stopEvents: null,
  dirty: new Set(), // orchestrations to read again
  refreshTimer: 0,
  leaseTimer: 0,
};

// The parent of a task ID: "0001_t1.2" -> "0001_t1", "0001_t1" -> "0001".
export function parentOf(id) {
  const dot = id.lastIndexOf(".");
  if (dot > id.lastIndexOf("_t")) return id.slice(0, dot);
  const t = id.lastIndexOf("_t");
  return t > 0 ? id.slice(0, t) : null;
}
const orchOf = (id) => id.split("_")[0];

export function show(root, args, first) {
  if (needsTenant()) {
    if (first) replace(root, h("h2", { id: "tasks-title", class: "sr-only", text: "Orchestration" }), chooser("its orchestrations"));
    setLive("off");
    return;
  }
  if (first || !state.root) {
    state.root = root;
    state.box = h("div", { id: "orchestrations" });
    replace(
      root,
      h(
        "header",
        { class: "view-head" },
        h("h2", { id: "tasks-title", text: "Orchestration" }),
        h("p", { class: "sub" }, "Next claim (D1 order): ", h("code", { id: "next-task", text: "none" })),
        h("ul", { class: "legend", "aria-label": "Task states" }, STATES.map((s) => h("li", { class: "state-" + s }, h("span", { class: "state", text: s })))),
      ),
      state.box,
    );
    reload();
  }
  if (!state.stopEvents) state.stopEvents = followEvents("types=task", onEvent, onLive);
  if (!state.leaseTimer) state.leaseTimer = setInterval(tickLeases, 1000);
}

export function leave() {
  state.stopEvents?.();
  state.stopEvents = null;
  clearInterval(state.leaseTimer);
  state.leaseTimer = 0;
}

function onLive(s, err) {
  setLive(s, err);
  if (err && s === "down") notify(err);
}

async function reload() {
  try {
    /** @type {Schemas["OrchestrationList"]} */
    const list = await api("GET", "/v1/orchestrations");
    state.nodes.clear();
    state.orchs.clear();
    replace(state.box);
    if (!list.data.length) state.box.append(h("p", { class: "empty", id: "no-orchestrations", text: "No orchestrations yet." }));
    // Newest first.
    for (const id of list.data.slice().reverse()) await refresh(id);
    setNext(list.next);
  } catch (err) {
    if (err.status === 403 && state.root) {
      // Refused: said once; no events for what cannot be read, no reading
      // again until the view is visited again.
      leave();
      setLive("off", err);
      replace(state.root, h("header", { class: "view-head" }, h("h2", { id: "tasks-title", text: "Orchestration" })), refusal(err, "Orchestration"));
      state.root = null;
      return;
    }
    replace(state.box, refusal(err, "Orchestration"));
  }
}

function orchSection(id) {
  let o = state.orchs.get(id);
  if (o) return o;
  $("#no-orchestrations", state.root)?.remove();
  const tree = h("ul", { class: "tree", "aria-label": "Tasks of " + id });
  const counts = h("span", { class: "counts sub" });
  const section = h("section", { class: "orch", "data-orch": id, "aria-labelledby": "orch-" + id }, h("h3", { id: "orch-" + id }, h("code", { text: id }), " ", counts), tree);
  state.box.prepend(section);
  o = { section, tree, counts };
  state.orchs.set(id, o);
  return o;
}

// Reads the orchestration's tree again: states, leases, the executable
// set and the next task.
async function refresh(id) {
  /** @type {Schemas["OrchestrationTree"]} */
  let tree;
  try {
    tree = await api("GET", "/v1/orchestrations/" + seg(id));
  } catch (err) {
    if (err.status !== 404) notify(err);
    return;
  }
  const started = performance.now();
  const o = orchSection(id);
  const exec = new Map(tree.executable.map((t, i) => [t, i + 1]));
  const n = Object.fromEntries(STATES.map((s) => [s, 0]));
  for (const t of tree.tasks) {
    n[t.state]++;
    const node = state.nodes.get(t.id) || addNode(t);
    update(node, t, exec.get(t.id) ?? 0);
  }
  o.counts.textContent = STATES.filter((s) => n[s]).map((s) => `${n[s]} ${s}`).join(" · ");
  setNext(tree.next);
  // How long applying a read took (bench/bench_console.mjs reports it).
  performance.measure("spindle:tree-apply", { start: started });
}

/** @param {Pick<Schemas["Task"], "id"> & Partial<Schemas["Task"]>} t */
function addNode(t) {
  const parts = {
    state: h("span", { class: "state" }),
    worker: h("span", { class: "worker" }),
    attempts: h("span", { class: "attempts" }),
    lease: h("span", { class: "lease" }),
    order: h("span", { class: "order" }),
    payload: h("span", { class: "payload" }),
    action: h("span", { class: "action" }),
  };
  const row = h(
    "div",
    { class: "task-row" },
    h("code", { class: "task-id", text: t.id }),
    parts.state,
    parts.order,
    parts.worker,
    parts.attempts,
    parts.lease,
    parts.payload,
    parts.action,
  );
  const li = h("li", { class: "task", "data-task": t.id }, row);
  const node = { task: {}, li, row, parts, children: null };
  state.nodes.set(t.id, node);
  const parent = t.parent ?? parentOf(t.id);
  if (parent && state.nodes.has(parent)) {
    const p = state.nodes.get(parent);
    if (!p.children) p.li.append((p.children = h("ul", { role: "group" })));
    p.children.append(li);
  } else {
    orchSection(orchOf(t.id)).tree.append(li);
  }
  return node;
}

// Applies what is known of task `t` to its row (only what changed);
// `order` is its place in claim order (0: not executable; undefined: not
// known, as for an event).
/** @param {any} node the tree node (its fields set by addNode) @param {Partial<Schemas["Task"]>} t @param {number} [order] */
function update(node, t, order) {
  const old = node.task;
  const merged = { ...old, ...t };
  node.task = merged;
  if (old.state !== merged.state) {
    node.row.className = "task-row state-" + merged.state + (state.next === merged.id ? " next" : "");
    node.parts.state.textContent = merged.state;
    const canRequeue = merged.state === "stale" || merged.state === "failed";
    replace(node.parts.action, canRequeue ? h("button", { type: "button", class: "small", onclick: () => requeue(merged.id), "aria-label": "Requeue " + merged.id, text: "Requeue" }) : null);
  }
  const text = "payload" in t && t.payload !== null ? JSON.stringify(t.payload) : "";
  if (text && text !== node.payloadText) {
    node.payloadText = text;
    node.parts.payload.textContent = text.length > 60 ? text.slice(0, 60) + "…" : text;
    node.parts.payload.title = text.slice(0, 500);
  }
  const worker = merged.worker ? "worker " + merged.worker : "";
  if (node.parts.worker.textContent !== worker) node.parts.worker.textContent = worker;
  // A requeue by hand may go past max_attempts (docs/orchestration.md).
  const max = merged.max_attempts; // unknown until the task is read
  const a = merged.attempts;
  const attempts = !a ? "" : max === undefined ? `attempt ${a}` : a <= max ? `attempt ${a}/${max}` : `attempt ${a} (${max} allowed, requeued)`;
  if (node.parts.attempts.textContent !== attempts) node.parts.attempts.textContent = attempts;
  if (order !== undefined) {
    const text = order ? "#" + order + " to run" : "";
    if (node.parts.order.textContent !== text) node.parts.order.textContent = text;
  }
  const expires = merged.state === "running" ? merged.lease_expires_at : null;
  if (node.parts.lease.dataset.expires !== String(expires ?? "")) {
    node.parts.lease.dataset.expires = expires ?? "";
    leaseText(node.parts.lease);
  }
}

function leaseText(el) {
  const at = Number(el.dataset.expires);
  if (!at) {
    el.textContent = "";
    return;
  }
  const left = Math.round((at - Date.now()) / 1000);
  el.textContent = left > 0 ? `lease ${left} s` : "lease expired";
  el.title = "lease expires " + new Date(at).toLocaleTimeString();
}

function tickLeases() {
  for (const el of state.root.querySelectorAll(".lease[data-expires]:not([data-expires=''])")) leaseText(el);
}

function setNext(id) {
  if (state.next === id) return;
  const old = state.next && state.nodes.get(state.next);
  if (old) old.row.classList.remove("next");
  state.next = id ?? null;
  const cur = state.next && state.nodes.get(state.next);
  if (cur) cur.row.classList.add("next");
  $("#next-task", state.root).textContent = state.next ?? "none";
}

function onEvent(type, data) {
  if (type === "reset") {
    reload();
    return;
  }
  if (!data.task) return;
  const node = state.nodes.get(data.task) || addNode({ id: data.task });
  // The event's fields at once; leases, order and counts with the next read.
  // A lease read before this event may be another claim's: unknown until
  // the next read.
  update(node, { state: data.state, worker: data.worker, attempts: data.attempts, lease_expires_at: null });
  state.dirty.add(orchOf(data.task));
  if (!state.refreshTimer) {
    state.refreshTimer = setTimeout(async () => {
      const ids = [...state.dirty];
      state.dirty.clear();
      for (const id of ids) await refresh(id);
      // The next task may be in an orchestration that did not change.
      try {
        setNext((/** @type {Schemas["OrchestrationList"]} */ (await api("GET", "/v1/orchestrations"))).next);
      } catch {
        // shown with the next read
      }
      state.refreshTimer = 0;
    }, 1000);
  }
}

async function requeue(id) {
  try {
    await api("POST", `/v1/tasks/${seg(id)}/requeue`);
    notify(`Requeued ${id}.`, "info");
  } catch (err) {
    notify(err);
  }
}
