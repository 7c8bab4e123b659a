// Who the console acts as: asked of the server once per token (GET
// /v1/me), shown in the header, and asked by the views (the admin token
// sees a tenant's data only when it acts in one; a key with keys:admin
// manages its own tenant's keys; a view the server refuses to this token
// says so inline, docs/console.md "Tokens and tenants").
//
// The kinds, as GET /v1/me names them:
// - open:     a server without tenancy (no token, or its `--token`).
// - admin:    the admin token (`--admin-token`): tenants and keys, and a
//             tenant's data when it acts in one (Spindle-Tenant, which
//             GET /v1/me is sent too, so that it names that tenant).
// - key:      a tenant's key (`spk_...`): its tenant's data, within its
//             scopes; its tenant's keys with keys:admin.
// - end_user: an end user's token (a JWT from the tenant's issuer): the
//             threads and memories of that user only.
// and the page's own:
// - none:     no token held, and the server wants one.
// - unknown:  a token the server refused (401), or no answer.
// The server names the principal; what the page reads from a JWT's
// payload (its expiry and issuer) is for the tooltip only, and only once
// the server took the token as an end user's.

import { actIn, actingTenant, actingTenantName, api, ApiError, token } from "./api.js";
import { h } from "./dom.js";
/** @typedef {import("./api.js").Schemas} Schemas */

/** GET /v1/me's answer. @typedef {Schemas["Principal"]} Me */

/**
 * @typedef {{
 *   kind: "none" | "unknown" | Me["kind"],
 *   label: string,
 *   title: string,
 *   tenant: string | null,
 *   tenantName: string | null,
 *   keyId: string | null,
 *   scopes: Schemas["Scope"][],
 *   note?: string,
 * }} Principal
 */

/** @param {Principal["kind"]} kind @returns {Principal} */
const nobody = (kind) => ({ kind, label: "", title: "", tenant: null, tenantName: null, keyId: null, scopes: [] });

/** @type {Principal} */
let current = nobody("none");

/** Who the token held is (as last learned). */
export const principal = () => current;

/** The admin token acting in no tenant: a tenant's views offer a choice. */
export const needsTenant = () => current.kind === "admin" && !actingTenant();

/** A key that may manage its own tenant's keys (scope keys:admin). */
export const keyAdmin = () => current.kind === "key" && current.scopes.includes("keys:admin");

/** A JWT's payload, or null for a token that is not one (display only). */
export function jwtPayload(t) {
  const parts = t.split(".");
  if (parts.length !== 3 || !parts.every((p) => /^[A-Za-z0-9_-]+$/.test(p))) return null;
  const decode = (part) => {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const bin = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
    return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
  };
  try {
    const head = decode(parts[0]);
    const body = decode(parts[1]);
    if (!head || typeof head.alg !== "string" || !body || typeof body !== "object") return null;
    return body;
  } catch {
    return null;
  }
}

const short = (v, n = 64) => {
  const s = String(v ?? "");
  return s.length > n ? s.slice(0, n) + "…" : s;
};

/**
 * Learns who the token held is from GET /v1/me (with Spindle-Tenant when
 * the admin token acts in a tenant). It never asks for a token: a 401
 * leaves the kind "none" (no token) or "unknown" (a refused one), and the
 * first view's call asks. An acted-in tenant that is gone (404) is left.
 * @returns {Promise<Principal>}
 */
export async function learn() {
  const t = token();
  /** @type {Me} */
  let me;
  try {
    me = await api("GET", "/v1/me", undefined, { ask: false });
  } catch (err) {
    if (err instanceof ApiError && err.status === 404 && err.param === "Spindle-Tenant" && actingTenant()) {
      const note = `Tenant ${actingTenantName() || actingTenant()} is gone: the console acts in no tenant.`;
      actIn("");
      return learn().then((p) => ((p.note = note), p));
    }
    return (current = nobody(t ? "unknown" : "none"));
  }
  const p = nobody(me.kind);
  Object.assign(p, { tenant: me.tenant, tenantName: me.tenant_name, keyId: me.key_id, scopes: me.scopes });
  const tenant = short(me.tenant_name || me.tenant, 40);
  const scopes = "Scopes: " + me.scopes.join(", ") + ".";
  if (me.kind === "open") {
    p.label = "no tenancy";
    p.title = (t ? "This server's token (spindle serve --token)" : "A server without a token") + ": everything, no tenants.";
  } else if (me.kind === "admin") {
    p.label = me.tenant ? `admin in tenant ${tenant}` : "admin";
    p.title = me.tenant
      ? `The admin token acting in tenant ${me.tenant_name} (${me.tenant}): every request to that tenant's data sends Spindle-Tenant: ${me.tenant}.`
      : "The admin token: tenants and keys; a tenant's data when acting in it.";
  } else if (me.kind === "key") {
    const prefix = t.startsWith("spk_") ? t.slice(0, 12) + "…" : me.key_id;
    p.label = `tenant ${tenant} (key ${prefix})`;
    p.title = `A key of tenant ${me.tenant_name} (${me.tenant}), ID ${me.key_id}: that tenant's data, within its scopes${me.scopes.includes("keys:admin") ? ", and its keys" : ""}. ${scopes}`;
  } else {
    p.label = `end user ${short(me.user)} of ${tenant}`;
    const facts = [];
    const jwt = jwtPayload(t);
    if (jwt && typeof jwt.iss === "string") facts.push("issuer " + short(jwt.iss, 200));
    if (jwt && typeof jwt.exp === "number") facts.push("expires " + new Date(jwt.exp * 1000).toLocaleString());
    p.title = `An end user's token of tenant ${me.tenant_name} (${me.tenant}): ${me.user}'s own conversations and memories only.` + (facts.length ? ` (${facts.join("; ")})` : "");
  }
  return (current = p);
}

/**
 * What a view shows for a failed call: a refusal (403) says which token
 * was refused and why, in the server's words; anything else is the error
 * as the server worded it. `what` names what was refused ("Orchestration").
 * @param {any} err
 * @param {string} what
 * @param {string} [tag] the element (a list item inside a list)
 */
export function refusal(err, what, tag = "div") {
  if (!(err instanceof ApiError) || err.status !== 403) return h(tag, { class: "error", role: "alert", text: String(err) });
  const who = current.label || "this token";
  const why = String(err.message).replace(/\.$/, "");
  return h(
    tag,
    { class: "refused", role: "alert" },
    h("strong", { text: `${what}: not for ${who}` }),
    " — ",
    h("span", { class: "refused-why", text: `the server refused it (403 ${err.code}): ${why}.` }),
    current.kind === "admin" && !actingTenant() ? [" ", h("a", { href: "#/tenants", text: "Choose a tenant to act in" })] : null,
  );
}
