// Tenants (the admin token's): the tenants, one created from a form; a
// tenant's keys (prefix, name, scopes, created, last used, expires), a key
// created with its scopes and its secret shown once, a key revoked after a
// confirmation; and "act in this tenant", after which the other views show
// that tenant's data (api.js sends Spindle-Tenant); a tenant's own limits
// on the model, changed from a form (PATCH /v1/tenants/{id}), with a link
// to where it stands with them (Limits).
// Keys (a key with keys:admin): the keys of the key's own tenant only, as
// above but for the tenant list and acting; it grants only the scopes it
// holds (the server refuses others).

import { actIn, actingTenant, api, seg } from "./api.js";
import { $, h, replace, timeEl } from "./dom.js";
import { confirmDialog, notify } from "./main.js";
import { principal, refusal } from "./session.js";
/** @typedef {import("./api.js").Schemas} Schemas */
/**
 * A tenant as the page knows it: the admin token reads all of it, a key
 * only its tenant's ID and name (GET /v1/me).
 * @typedef {Pick<Schemas["Tenant"], "id" | "name"> & Partial<Schemas["Tenant"]>} TenantRef
 */

/** Every scope a key may hold (docs/tenants.md, "Scopes"), and what it opens. */
/** @type {[Schemas["Scope"], string][]} */
export const SCOPES = [
  ["threads:read", "list and read conversations"],
  ["threads:write", "create, change and delete conversations; messages"],
  ["memories:read", "read long-term memories"],
  ["memories:write", "store and delete memories"],
  ["tasks:read", "read orchestrations and tasks"],
  ["tasks:write", "create orchestrations; claim and settle tasks"],
  ["events:read", "follow the event stream (live updates)"],
  ["usage:read", "usage reports"],
  ["keys:admin", "manage this tenant's own keys"],
];

const EXPIRIES = [
  ["", "never"],
  ["3600", "in 1 hour"],
  ["86400", "in 1 day"],
  ["604800", "in 7 days"],
  ["2592000", "in 30 days"],
  ["7776000", "in 90 days"],
  ["31536000", "in 1 year"],
];

// At most this many tenants are listed at once (a server may hold 100,000);
// the filter finds the others.
const SHOWN = 200;

const state = {
  root: null,
  /** @type {Schemas["Tenant"][]} */
  tenants: [],
  selected: null, // the tenant whose keys are shown
  filter: "",
};

export function show(root, args, first) {
  const p = principal();
  if (p.kind === "key") {
    // Its own tenant's keys, whatever the address names.
    if (first || !state.root) buildOwn(root);
    state.selected = p.tenant;
    showTenant({ id: p.tenant, name: p.tenantName || p.tenant }, true);
    return;
  }
  if (first || !state.root) build(root);
  state.selected = args[0] || null;
  loadTenants();
}

// A key's view: no tenant list (the admin token's), its tenant's keys.
function buildOwn(root) {
  state.root = root;
  const p = principal();
  replace(
    root,
    h(
      "header",
      { class: "view-head" },
      h("h2", { id: "tenants-title", text: "Keys" }),
      h(
        "p",
        { class: "sub", id: "acting" },
        "The keys of tenant ",
        h("strong", { text: p.tenantName || p.tenant }),
        " (",
        h("code", { text: p.tenant }),
        p.scopes.includes("keys:admin") ? "), managed with this key (scope " : "): managing them takes a key with the scope ",
        h("code", { text: "keys:admin" }),
        p.scopes.includes("keys:admin") ? "): it grants only the scopes it holds." : ".",
      ),
    ),
    h("article", { id: "tenant-pane", class: "pane", "aria-live": "off" }),
  );
}

function build(root) {
  state.root = root;
  const name = h("input", { id: "tenant-name", required: true, maxLength: 64, autocomplete: "off" });
  const weight = h("input", { id: "tenant-weight", type: "number", min: 1, max: 1000, placeholder: "1", inputMode: "numeric" });
  const filter = h("input", { id: "tenant-filter", type: "search", placeholder: "name or ID", autocomplete: "off" });
  filter.addEventListener("input", () => {
    state.filter = filter.value.trim().toLowerCase();
    renderList();
  });
  replace(
    root,
    h(
      "header",
      { class: "view-head" },
      h("h2", { id: "tenants-title", text: "Tenants" }),
      h("p", { class: "sub", id: "acting" }),
    ),
    h(
      "div",
      { class: "split" },
      h(
        "aside",
        { class: "pane list-pane", "aria-label": "Tenant list" },
        h(
          "form",
          { id: "tenant-form", class: "stack", onsubmit: (e) => (e.preventDefault(), createTenant(name, weight)) },
          h("h3", { text: "New tenant" }),
          h("label", { for: "tenant-name", text: "Name" }),
          name,
          h("label", { for: "tenant-weight", text: "Weight (share of the model, 1 to 1000)" }),
          weight,
          h("button", { type: "submit", class: "primary", id: "create-tenant", text: "Create tenant" }),
        ),
        h("div", { class: "search" }, h("label", { for: "tenant-filter", text: "Find a tenant" }), filter),
        h("ul", { id: "tenant-items", class: "thread-items", "aria-label": "Tenants" }),
      ),
      h("article", { id: "tenant-pane", class: "pane", "aria-live": "off" }),
    ),
  );
}

function renderActing() {
  const el = $("#acting", state.root);
  const id = actingTenant();
  const t = state.tenants.find((x) => x.id === id);
  replace(el, id ? ["The other views act in tenant ", h("strong", { text: t ? t.name : id }), " (", h("code", { text: id }), ")."] : "The other views act in no tenant: choose one to see its conversations and orchestrations.");
}

async function loadTenants() {
  const list = $("#tenant-items", state.root);
  try {
    /** @type {Schemas["TenantList"]} */
    const r = await api("GET", "/v1/tenants");
    state.tenants = r.data;
  } catch (err) {
    replace(list, refusal(err, "Tenants", "li"));
    replace($("#tenant-pane", state.root), h("p", { class: "empty", text: "Tenants and keys are the admin token's." }));
    return;
  }
  renderActing();
  renderList();
  const t = state.tenants.find((x) => x.id === state.selected);
  if (t) showTenant(t);
  else replace($("#tenant-pane", state.root), h("p", { class: "empty", text: state.selected ? `No tenant ${state.selected}.` : "Pick a tenant to see its keys, or create one." }));
}

function renderList() {
  const list = $("#tenant-items", state.root);
  const f = state.filter;
  const match = f ? state.tenants.filter((t) => t.name.toLowerCase().includes(f) || t.id.includes(f)) : state.tenants;
  replace(list, match.slice(0, SHOWN).map(tenantItem));
  if (!match.length) list.append(h("li", { class: "empty", text: f ? "No tenant matches." : "No tenants." }));
  if (match.length > SHOWN) list.append(h("li", { class: "sub", text: `${match.length - SHOWN} more: narrow the search.` }));
}

/** @param {Schemas["Tenant"]} t */
function tenantItem(t) {
  const acting = t.id === actingTenant();
  return h(
    "li",
    { "data-tenant": t.id },
    h(
      "a",
      { href: "#/tenants/" + seg(t.id), "aria-current": t.id === state.selected ? "true" : null },
      h("span", { class: "tenant-name", text: t.name }),
      acting ? h("span", { class: "badge", text: "acting in" }) : null,
      h("span", { class: "sub" }, h("code", { text: t.id }), ` · weight ${t.weight} · created `, timeEl(t.created_at)),
    ),
  );
}

async function createTenant(name, weight) {
  /** @type {Schemas["TenantCreate"]} */
  const body = { name: name.value.trim() };
  if (weight.value) body.weight = Number(weight.value);
  try {
    /** @type {Schemas["Tenant"]} */
    const t = await api("POST", "/v1/tenants", body);
    name.value = "";
    weight.value = "";
    notify(`Created tenant ${t.name} (${t.id}).`, "info");
    location.hash = "#/tenants/" + seg(t.id);
  } catch (err) {
    notify(err);
  }
}

// -- one tenant: its keys ------------------------------------------------------

/**
 * A tenant's keys and the form for a new one; `own` for a key's own
 * tenant: no acting in it, and only the scopes the key holds to grant.
 * @param {TenantRef} t @param {boolean} [own]
 */
function showTenant(t, own = false) {
  const pane = $("#tenant-pane", state.root);
  const acting = t.id === actingTenant();
  const held = own ? principal().scopes : SCOPES.map(([s]) => s);
  const scopes = SCOPES.map(([s, what]) => {
    const may = held.includes(s);
    return h(
      "label",
      { class: "check", title: may ? null : "This key lacks it: a key grants only the scopes it holds." },
      h("input", { type: "checkbox", name: "scope", value: s, checked: may && s !== "keys:admin", disabled: !may }),
      h("code", { text: s }),
      h("span", { class: "sub", text: may ? what : what + " (this key lacks it)" }),
    );
  });
  const keyName = h("input", { id: "key-name", maxLength: 64, autocomplete: "off", placeholder: "optional" });
  const expires = h("select", { id: "key-expires" }, EXPIRIES.map(([v, label]) => h("option", { value: v, text: label })));
  const form = h(
    "form",
    { id: "key-form", class: "stack", onsubmit: (e) => (e.preventDefault(), createKey(t, form, keyName, expires)) },
    h("h3", { text: "New key" }),
    h("label", { for: "key-name", text: "Name" }),
    keyName,
    h("fieldset", { class: "scopes" }, h("legend", { text: "Scopes" }), scopes),
    h("div", { class: "row" }, h("label", { for: "key-expires", text: "Expires" }), expires),
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary", id: "create-key", text: "Create key" })),
  );
  replace(
    pane,
    h(
      "header",
      { class: "thread-head" },
      h("h2", null, h("span", { id: "tenant-title", text: t.name }), " ", h("code", { class: "sub", text: t.id })),
      own ? null : h("div", { class: "sub" }, `weight ${t.weight} · created `, timeEl(t.created_at)),
      own
        ? null
        : h(
            "div",
            { class: "actions" },
            acting
              ? [h("button", { type: "button", id: "act-in", disabled: true, text: "Acting in this tenant" }), h("button", { type: "button", id: "leave-acting", onclick: () => switchTo("", ""), text: "Act in no tenant" })]
              : h("button", { type: "button", id: "act-in", class: "primary", onclick: () => switchTo(t.id, t.name), text: "Act in this tenant" }),
          ),
    ),
    h("div", { id: "new-key" }),
    h("h3", { text: "Keys" }),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "nodes key-table", id: "keys" },
        h("thead", null, h("tr", null, ["Prefix", "Name", "Scopes", "Created", "Last used", "Expires", ""].map((c) => h("th", { scope: "col", text: c })))),
        h("tbody", { id: "key-rows" }),
      ),
    ),
    own && !held.includes("keys:admin") ? null : form,
    own ? null : limitsForm(t),
  );
  loadKeys(t);
}

// -- one tenant: its limits ----------------------------------------------------

/** The limits a tenant may set (docs/limits.md), and the range of each. */
const LIMIT_FIELDS = [
  ["requests_per_min", "Requests per minute", 0, 1e9],
  ["tokens_per_min", "Tokens per minute", 0, 1e12],
  ["concurrent_exchanges", "Calls at once", 0, 100000],
  ["max_queued", "Calls queued", 0, 100000],
  ["reply_reserve", "Reply reserve (tokens)", 1, 1e7],
];

/**
 * The tenant's own limits on the model as a form: a field left blank is
 * the server's default, 0 no limit; Save sends all five (PATCH).
 * @param {TenantRef} t
 */
function limitsForm(t) {
  const inputs = LIMIT_FIELDS.map(([key, , min, max]) => {
    const v = t.limits?.[key];
    return h("input", { id: "limit-" + key, name: key, type: "number", min, max, step: 1, inputMode: "numeric", placeholder: "default", value: v === null || v === undefined ? "" : String(v) });
  });
  const form = h(
    "form",
    { id: "limits-form", class: "stack", onsubmit: (e) => (e.preventDefault(), saveLimits(t, inputs)) },
    h("h3", { text: "Limits on the model" }),
    h("p", { class: "sub" }, "Blank: the server's default. 0: no limit of that kind. ", h("a", { id: "tenant-limits-link", href: "#/limits/" + seg(t.id), text: "Where it stands now" })),
    h("div", { class: "limit-fields" }, LIMIT_FIELDS.map(([key, label], i) => h("div", { class: "stack" }, h("label", { for: "limit-" + key, text: label }), inputs[i]))),
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary", id: "save-limits", text: "Save limits" })),
  );
  return form;
}

/** @param {TenantRef} t @param {HTMLInputElement[]} inputs */
async function saveLimits(t, inputs) {
  /** @type {Schemas["TenantLimitsInput"]} */
  const limits = {};
  LIMIT_FIELDS.forEach(([key], i) => (limits[key] = inputs[i].value.trim() === "" ? null : Number(inputs[i].value)));
  try {
    /** @type {Schemas["Tenant"]} */
    const changed = await api("PATCH", "/v1/tenants/" + seg(t.id), { limits });
    Object.assign(t, changed);
    const i = state.tenants.findIndex((x) => x.id === t.id);
    if (i >= 0) state.tenants[i] = changed;
    notify(`Saved the limits of ${changed.name}.`, "info");
  } catch (err) {
    notify(err);
  }
}

async function loadKeys(t) {
  const rows = $("#key-rows", state.root);
  try {
    /** @type {Schemas["KeyList"]} */
    const r = await api("GET", `/v1/tenants/${seg(t.id)}/keys`);
    if (state.selected !== t.id) return;
    replace(rows, r.data.map((k) => keyRow(t, k)));
    if (!r.data.length) rows.append(h("tr", null, h("td", { colspan: 7, class: "empty", text: "No keys." })));
  } catch (err) {
    replace(rows, h("tr", null, h("td", { colspan: 7 }, refusal(err, "Keys"))));
  }
}

/** @param {TenantRef} t @param {Schemas["Key"]} k */
function keyRow(t, k) {
  const expired = k.expires_at !== null && k.expires_at <= Date.now();
  return h(
    "tr",
    { "data-key": k.id },
    h("td", null, h("code", { class: "key-prefix", text: k.prefix + "…" }), k.id === principal().keyId ? [" ", h("span", { class: "badge", text: "this key" })] : null),
    h("td", { class: "key-name", text: k.name || "–" }),
    h("td", null, h("span", { class: "chips" }, k.scopes.map((s) => h("span", { class: "chip", text: s })))),
    h("td", null, timeEl(k.created_at)),
    h("td", null, k.last_used_at ? timeEl(k.last_used_at) : "never"),
    h("td", { class: expired ? "error" : null }, k.expires_at ? [expired ? "expired " : "", timeEl(k.expires_at)] : "never"),
    h("td", null, h("button", { type: "button", class: "small danger", "aria-label": `Revoke key ${k.prefix}`, onclick: () => revoke(t, k), text: "Revoke" })),
  );
}

async function createKey(t, form, keyName, expires) {
  /** @type {Schemas["Scope"][]} */
  const scopes = [...form.querySelectorAll('input[name="scope"]:checked')].map((el) => /** @type {any} */ (el).value);
  if (!scopes.length) {
    notify("Choose at least one scope.");
    return;
  }
  /** @type {Schemas["KeyCreate"]} */
  const body = { scopes };
  if (keyName.value.trim()) body.name = keyName.value.trim();
  if (expires.value) body.expires_in_s = Number(expires.value);
  try {
    /** @type {Schemas["KeyCreated"]} */
    const k = await api("POST", `/v1/tenants/${seg(t.id)}/keys`, body);
    keyName.value = "";
    showSecret(k);
    loadKeys(t);
  } catch (err) {
    notify(err);
  }
}

// The secret, once: in this answer only, never stored by the page. It goes
// when "Done" is pressed, another tenant is picked or the page is left.
/** @param {Schemas["KeyCreated"]} k */
function showSecret(k) {
  const box = $("#new-key", state.root);
  const secret = h("input", { id: "new-key-secret", class: "secret-value", readOnly: true, value: k.key, "aria-label": "The new key", spellcheck: false, autocomplete: "off" });
  const status = h("span", { id: "copy-status", role: "status" });
  const copy = async () => {
    secret.focus();
    secret.select();
    try {
      await navigator.clipboard.writeText(k.key);
      status.textContent = "Copied.";
    } catch {
      // No clipboard permission: the text is selected for Ctrl+C.
      status.textContent = "Selected: press Ctrl+C to copy.";
    }
  };
  replace(
    box,
    h(
      "div",
      { class: "secret", role: "alert" },
      h("p", null, h("strong", { text: `Key ${k.prefix}… created${k.name ? ` (${k.name})` : ""}. Copy it now: it will not be shown again.` })),
      h("p", { class: "sub", text: "spindle keeps only its hash; a lost key cannot be shown, only revoked and replaced. Send it as Authorization: Bearer <key>." }),
      h("div", { class: "row" }, secret, h("button", { type: "button", id: "copy-key", onclick: copy, text: "Copy" }), status),
      h("div", { class: "row" }, h("button", { type: "button", id: "new-key-done", onclick: () => replace(box), text: "Done" })),
    ),
  );
  secret.select();
}

/** @param {TenantRef} t @param {Schemas["Key"]} k */
async function revoke(t, k) {
  const what = `${k.prefix}…${k.name ? ` (${k.name})` : ""}`;
  const self = k.id === principal().keyId ? " It is the key this console uses: the console will then ask for another token." : "";
  if (!(await confirmDialog("Revoke this key?", `${what} of tenant ${t.name} is refused from its next request on, on every node within a second. This cannot be undone.${self}`))) return;
  try {
    await api("DELETE", `/v1/keys/${seg(k.id)}`);
    notify(`Revoked ${what}.`, "info");
    loadKeys(t);
  } catch (err) {
    notify(err);
  }
}

// -- acting in a tenant --------------------------------------------------------

/**
 * Acts in tenant `id` ("" for none) and starts the page afresh on the
 * conversations, so that nothing read for another tenant stays on screen.
 */
export function switchTo(id, name) {
  actIn(id, name);
  history.replaceState(null, "", id ? "#/threads" : "#/tenants");
  location.reload();
}

/**
 * What a tenant's view shows to the admin token acting in no tenant: a
 * choice of tenant. `what` names the view's data ("conversations").
 */
export function chooser(what) {
  const select = h("select", { id: "act-tenant" }, h("option", { value: "", text: "Loading…" }));
  const go = h("button", { type: "submit", class: "primary", id: "act-tenant-go", disabled: true, text: "Act in tenant" });
  const box = h(
    "div",
    { class: "pane chooser" },
    h("h2", { text: "Choose a tenant" }),
    h("p", { text: `The admin token manages tenants and keys. To see ${what}, act in one tenant: the console then names it (Spindle-Tenant) on every request for its data.` }),
    h(
      "form",
      {
        class: "row",
        onsubmit: (e) => {
          e.preventDefault();
          const opt = select.selectedOptions[0];
          if (opt && opt.value) switchTo(opt.value, opt.dataset.name || "");
        },
      },
      h("label", { for: "act-tenant", text: "Tenant" }),
      select,
      go,
    ),
    h("p", null, h("a", { href: "#/tenants", text: "Manage tenants and keys" })),
  );
  (async () => {
    try {
      /** @type {Schemas["TenantList"]} */
      const r = await api("GET", "/v1/tenants");
      replace(
        select,
        r.data.map((t) => h("option", { value: t.id, "data-name": t.name, text: `${t.name} (${t.id})` })),
      );
      go.disabled = !r.data.length;
    } catch (err) {
      replace(select, h("option", { value: "", text: "—" }));
      box.append(refusal(err, "Tenants"));
    }
  })();
  return box;
}
