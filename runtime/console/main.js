// The console's shell: the sections (Conversations, Orchestration,
// Health, Limits, Tenants) behind #/ routes, the token dialog, who the token is
// (in the header, with Sign out), confirmations and notices.

import { actingTenant, onTokenChange, onTokenNeeded, signOut, token, wasAccepted } from "./api.js";
import { $ } from "./dom.js";
import { keyAdmin, learn, principal } from "./session.js";
import * as threads from "./threads.js";
import * as tasks from "./tasks.js";
import * as health from "./health.js";
import * as limits from "./limits.js";
import * as tenants from "./tenants.js";

const views = { threads, tasks, health, limits, tenants };
let current = null;

let noticeTimer = 0;

/** Shows `text` as an error (or a plain notice) until dismissed or replaced. */
export function notify(text, kind = "error") {
  const box = $("#notice");
  box.textContent = String(text);
  box.className = "notice " + kind;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => (box.hidden = true), kind === "error" ? 15000 : 4000);
}

/** Asks a yes/no question in a modal dialog; resolves to true for yes. */
export function confirmDialog(title, text) {
  const dlg = $("#confirm-dialog");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  dlg.returnValue = "";
  dlg.showModal();
  return new Promise((ok) => dlg.addEventListener("close", () => ok(dlg.returnValue === "yes"), { once: true }));
}

onTokenNeeded(
  (refused) =>
    new Promise((ok) => {
      const dlg = $("#token-dialog");
      const input = $("#token-input");
      $("#token-error").textContent = refused ? "The server refused that token." : "";
      input.value = "";
      let given = null;
      const form = $("#token-form");
      const submit = () => (given = input.value);
      form.addEventListener("submit", submit, { once: true });
      $("#token-cancel").onclick = () => dlg.close("cancel");
      dlg.addEventListener(
        "close",
        () => {
          form.removeEventListener("submit", submit);
          ok(given);
        },
        { once: true },
      );
      dlg.showModal();
      input.focus();
    }),
);

// A new token from the dialog. When the old one had been taken, the page
// shows what it read with it: the page starts afresh. So it does for the
// admin token, whose views start with the choice of a tenant. Otherwise
// (the first token, or one after a refused one) the waiting requests go on.
onTokenChange(async (old) => {
  if (wasAccepted(old)) return restart();
  const p = await learn();
  showPrincipal();
  if (p.kind === "admin") return restart();
});

/** Loads the page again (its token and tenant are kept for the tab). */
function restart() {
  location.reload();
  return new Promise(() => {}); // the page goes
}

// The header: who the token is, Sign out, and the Tenants section for the
// admin token (Keys, its own tenant's, for a key with keys:admin).
function showPrincipal() {
  const p = principal();
  const label = $("#who-label");
  label.textContent = p.label;
  label.title = p.title;
  label.dataset.kind = p.kind;
  $("#who").hidden = !p.label && !token();
  $("#leave-tenant").hidden = !(p.kind === "admin" && actingTenant());
  $("#sign-out").hidden = !token();
  const nav = /** @type {HTMLElement} */ ($('nav a[data-view="tenants"]'));
  nav.hidden = !(p.kind === "admin" || keyAdmin());
  nav.textContent = p.kind === "key" ? "Keys" : "Tenants";
  if (p.note) notify(p.note, "info");
}

$("#sign-out").addEventListener("click", () => {
  signOut();
  restart();
});
$("#leave-tenant").addEventListener("click", () => tenants.switchTo("", ""));

/**
 * The event stream's state: "live", "down" (reconnecting), "off" (the
 * server refused this token the stream: no live updates, `err` says why).
 * @param {string} state @param {Error} [err]
 */
export function setLive(state, err) {
  const el = $("#live");
  el.textContent = state === "off" ? "not live" : state;
  el.dataset.state = state;
  el.title = state === "off" && err ? "No live updates: " + err.message : "";
}

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  const name = views[parts[0]] ? parts[0] : "threads";
  const args = parts.slice(1).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  for (const a of /** @type {NodeListOf<HTMLAnchorElement>} */ (document.querySelectorAll("nav a"))) {
    if (a.dataset.view === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  for (const key of Object.keys(views)) $("#view-" + key).hidden = key !== name;
  if (current && current !== views[name]) current.leave?.();
  const first = current !== views[name];
  current = views[name];
  current.show($("#view-" + name), args, first);
}

window.addEventListener("hashchange", route);
window.addEventListener("unhandledrejection", (e) => {
  notify(e.reason?.toString?.() ?? String(e.reason));
  e.preventDefault();
});
// Who the token held is, before the first view: the admin token's views
// differ (and no view waits: without a token nothing is asked).
learn().then(() => {
  showPrincipal();
  route();
  document.documentElement.dataset.ready = "true";
});
