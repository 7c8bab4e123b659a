// The console's shell: the sections (Conversations, Orchestration,
// Health) behind #/ routes, the token dialog, confirmations and notices.

import { onTokenNeeded } from "./api.js";
import { $ } from "./dom.js";
import * as threads from "./threads.js";
import * as tasks from "./tasks.js";
import * as health from "./health.js";

const views = { threads, tasks, health };
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

export function setLive(state) {
  const el = $("#live");
  el.textContent = state;
  el.dataset.state = state;
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
route();
document.documentElement.dataset.ready = "true";
