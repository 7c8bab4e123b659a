// spindle's HTTP API from the page: JSON calls, streamed replies and the
// event stream, all through fetch() so that the bearer token goes in a
// header (EventSource cannot send one). The token is asked for when the
// server answers 401 and kept for this tab only (sessionStorage), as is
// the tenant the admin token acts in (sent as Spindle-Tenant on the routes
// of a tenant's data).

const TOKEN_KEY = "spindle.token";
const TENANT_KEY = "spindle.tenant";
const TENANT_NAME_KEY = "spindle.tenant_name";

// The API's types, generated from docs/openapi.yaml into
// runtime/clients/typescript/src/schema.d.ts. The console has no build
// step: these are comments to the browser; CI type-checks the modules
// against them (tests/ts_client/run.sh, tsc --checkJs), so a field the
// console reads that the document does not have fails the build.
/** @typedef {import("../clients/typescript/src/schema").components["schemas"]} Schemas */

/** An error answer of the API: status, code and message as sent. */
export class ApiError extends Error {
  constructor(status, code, message, param = null) {
    super(message);
    this.status = status;
    this.code = code;
    /** @type {string | null} the field, header or scope it concerns */
    this.param = param;
  }
  toString() {
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

/** @type {(refused: boolean) => Promise<string | null>} */
let askToken = async () => null; // set by the page: shows the token dialog
/** @type {(old: string, given: string) => Promise<void>} */
let tokenChanged = async () => {}; // set by the page: learns who the token is
let tokenPrompt = null; // one dialog for every request waiting on it
let accepted = null; // the last token the server did not answer 401 to

/** `ask(refused)` resolves to a token, or null when the user gave up. */
export function onTokenNeeded(ask) {
  askToken = ask;
}

/**
 * `changed(old, given)` runs when the dialog gave a new token, before the
 * requests that waited for it are sent again.
 */
export function onTokenChange(changed) {
  tokenChanged = changed;
}

export const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

/** Whether the server took `t` (answered anything but 401 to it). */
export const wasAccepted = (t) => t !== "" && t === accepted;

/** The tenant the admin token acts in ("" for none), and its name. */
export const actingTenant = () => sessionStorage.getItem(TENANT_KEY) || "";
export const actingTenantName = () => sessionStorage.getItem(TENANT_NAME_KEY) || "";

/** Acts in tenant `id` (the admin token), or in none with "". */
export function actIn(id, name = "") {
  if (id) {
    sessionStorage.setItem(TENANT_KEY, id);
    sessionStorage.setItem(TENANT_NAME_KEY, name);
  } else {
    sessionStorage.removeItem(TENANT_KEY);
    sessionStorage.removeItem(TENANT_NAME_KEY);
  }
}

/** Forgets the token and the tenant acted in. */
export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  actIn("");
}

// The routes of a tenant's data, where the admin token names its tenant,
// and GET /v1/me, which then names that tenant too.
const TENANT_ROUTES = /^\/v1\/(threads|memories|orchestrations|tasks|events|ids|chat|usage|limits|me)(\/|\?|$)/;

/**
 * How a call is sent: `ask: false` answers a 401 as an error instead of
 * asking for a token (to ask the server who the token is); `tenant` names
 * the tenant of a tenant's route for this call only (the admin token
 * reading each tenant's limits), instead of the tenant acted in.
 * @typedef {{ ask?: boolean, tenant?: string }} CallOptions
 */

function headers(path, extra, tenantOf = "") {
  const out = { ...extra };
  const t = token();
  if (t) out.Authorization = "Bearer " + t;
  const tenant = tenantOf || actingTenant();
  if (tenant && TENANT_ROUTES.test(path)) out["Spindle-Tenant"] = tenant;
  return out;
}

// Sends `init` to `path`; on 401 asks for a token once (shared by every
// request that got a 401 meanwhile) and sends again, until the user gives up.
/** @param {string} path @param {RequestInit & {headers?: Record<string, string>}} init @param {CallOptions} [opts] */
async function send(path, init, opts = {}) {
  for (;;) {
    const sent = token();
    const res = await fetch(path, { ...init, headers: headers(path, init.headers, opts.tenant) });
    if (res.status !== 401) {
      accepted = sent;
      return res;
    }
    if (opts.ask === false) return res;
    await res.body?.cancel();
    if (token() !== sent) continue; // another request got a new one
    if (!tokenPrompt) {
      tokenPrompt = (async () => {
        const given = await askToken(sent !== "");
        if (given !== null) {
          const old = token();
          sessionStorage.setItem(TOKEN_KEY, given);
          actIn(""); // a tenant chosen for the old token is not the new one's
          await tokenChanged(old, given);
        }
        return given;
      })().finally(() => (tokenPrompt = null));
    }
    const given = await tokenPrompt;
    if (given === null) throw new ApiError(401, "unauthorized", "this server requires a token");
  }
}

async function failure(res) {
  let code = "http_" + res.status;
  let message = res.statusText || "request failed";
  let param = null;
  try {
    const body = await res.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
      param = typeof body.error.param === "string" ? body.error.param : null;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, code, message, param);
}

/**
 * A JSON call; resolves to the parsed body (null for 204). Callers name
 * the body's type from `Schemas`.
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body]
 * @param {CallOptions} [opts]
 * @returns {Promise<any>}
 */
export async function api(method, path, body, opts = {}) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const res = await send(path, init, opts);
  if (!res.ok) throw await failure(res);
  if (res.status === 204) return null;
  return res.json();
}

/** Path segment, encoded: IDs from users never change the path's shape. */
export const seg = (s) => encodeURIComponent(s);

// Reads a text/event-stream body and calls onEvent({id, event, data}).
async function readEvents(res, onEvent, signal) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let ev = { event: "message", data: [], id: null };
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", abort);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line === "") {
          if (ev.data.length) onEvent({ id: ev.id, event: ev.event, data: ev.data.join("\n") });
          ev = { event: "message", data: [], id: null };
        } else if (line.startsWith(":")) {
          // a comment (keep-alive)
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "data") ev.data.push(val);
          else if (field === "event") ev.event = val;
          else if (field === "id") ev.id = val;
        }
      }
    }
  } finally {
    signal?.removeEventListener("abort", abort);
  }
}

/** POSTs `body` and reads the streamed reply's events. */
export async function postStream(path, body, onEvent, signal) {
  const res = await send(path, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    signal,
  });
  if (!res.ok) throw await failure(res);
  await readEvents(res, onEvent, signal);
}

/**
 * Follows GET /v1/events?query: onEvent({id, event, data}) for each, and
 * reconnects with Last-Event-ID after a drop (a `reset` event then says
 * what was missed). onState("live" | "down") reports the connection;
 * "off" when the server refuses this token the stream (403, or 404 for a
 * tenant that is gone), which is not tried again.
 * Returns a function that stops it.
 * @param {string} query
 * @param {(event: string, data: any) => void} onEvent
 * @param {(state: "live" | "down" | "off", err?: Error) => void} [onState]
 */
export function followEvents(query, onEvent, onState = () => {}) {
  const ctl = new AbortController();
  let last = null;
  (async () => {
    while (!ctl.signal.aborted) {
      try {
        const extra = last ? { "Last-Event-ID": last } : {};
        const res = await send("/v1/events" + (query ? "?" + query : ""), { headers: extra, signal: ctl.signal });
        if (!res.ok) throw await failure(res);
        onState("live");
        await readEvents(
          res,
          (e) => {
            if (e.id) last = e.id;
            let data = null;
            try {
              data = JSON.parse(e.data);
            } catch {
              return;
            }
            onEvent(e.event, data);
          },
          ctl.signal,
        );
      } catch (err) {
        if (ctl.signal.aborted) return;
        if (err instanceof ApiError && err.status === 401) {
          onState("down", err);
          return;
        }
        if (err instanceof ApiError && (err.status === 403 || err.status === 404)) {
          onState("off", err);
          return;
        }
      }
      if (ctl.signal.aborted) return;
      onState("down");
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  return () => ctl.abort();
}
