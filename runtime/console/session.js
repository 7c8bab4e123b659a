// Who the console acts as: learned once per token, shown in the header,
// and asked by the views (the admin token sees a tenant's data only when
// it acts in one; a view the server refuses to this token says so
// inline, docs/console.md "Tokens and tenants").
//
// The kinds of token:
// - none:  no token held (a server without --token or --admin-token).
// - token: the one token of a server without tenancy (`--token`).
// - admin: the admin token (`--admin-token`): tenants and keys, and a
//          tenant's data when it acts in one (Spindle-Tenant).
// - key:   a tenant's key (`spk_...`): its tenant's data, within its scopes.
// - user:  an end user's token (a JWT from the tenant's issuer): the
//          threads and memories of that user only.
// The server is the judge of every token: the kind only picks what the
// page shows, and what it learns from a JWT's payload is for display.

import { actingTenant, actingTenantName, api, ApiError, token } from "./api.js";
import { h } from "./dom.js";

/**
 * @typedef {{
 *   kind: "none" | "token" | "admin" | "key" | "user" | "unknown",
 *   label: string,
 *   title: string,
 * }} Principal
 */

/** @type {Principal} */
let current = { kind: "none", label: "", title: "" };

/** Who the token held is (as last learned). */
export const principal = () => current;

/** The admin token acting in no tenant: a tenant's views offer a choice. */
export const needsTenant = () => current.kind === "admin" && !actingTenant();

const KEY = /^spk_[A-Za-z0-9]{40}$/;

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
 * Learns who the token held is: a key and a JWT by their form (the server
 * judges them with the first call), another token by asking the server:
 * GET /v1/threads answers it without tenancy, and 403 to the admin token,
 * which GET /v1/tenants then answers. No call asks for a token.
 * @returns {Promise<Principal>}
 */
export async function learn() {
  const t = token();
  if (!t) return (current = { kind: "none", label: "", title: "" });
  if (t.startsWith("spk_")) {
    const prefix = t.slice(0, 12);
    return (current = {
      kind: "key",
      label: `tenant key ${prefix}…`,
      title: KEY.test(t) ? `A tenant's key (its prefix ${prefix}): that tenant's data, within the key's scopes.` : "Not the form of a key (spk_ and 40 letters and digits).",
    });
  }
  const jwt = jwtPayload(t);
  if (jwt) {
    const sub = typeof jwt.sub === "string" ? jwt.sub : "?";
    const facts = [];
    if (typeof jwt.iss === "string") facts.push("issuer " + short(jwt.iss, 200));
    if (typeof jwt.aud === "string") facts.push("audience " + short(jwt.aud));
    if (typeof jwt.exp === "number") facts.push("expires " + new Date(jwt.exp * 1000).toLocaleString());
    return (current = {
      kind: "user",
      label: `end user ${short(sub)}`,
      title: `An end user's token: ${short(sub)}'s own conversations and memories only.` + (facts.length ? ` (${facts.join("; ")})` : ""),
    });
  }
  try {
    await api("GET", "/v1/threads?limit=1", undefined, { tenant: false, ask: false });
    return (current = { kind: "token", label: "token", title: "This server's token (spindle serve --token): everything, no tenants." });
  } catch (err) {
    if (!(err instanceof ApiError) || err.status !== 403) return (current = { kind: "unknown", label: "", title: "" });
  }
  try {
    await api("GET", "/v1/tenants", undefined, { ask: false });
  } catch {
    return (current = { kind: "unknown", label: "", title: "" });
  }
  current = { kind: "admin", label: "admin", title: "The admin token: tenants and keys; a tenant's data when acting in it." };
  if (actingTenant()) {
    const name = actingTenantName();
    current.label = `admin in tenant ${short(name || actingTenant(), 40)}`;
    current.title = `The admin token acting in tenant ${name} (${actingTenant()}): every request to that tenant's data sends Spindle-Tenant: ${actingTenant()}.`;
  }
  return current;
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
