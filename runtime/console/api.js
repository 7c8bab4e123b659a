// spindle's HTTP API from the page: JSON calls, streamed replies and the
// event stream, all through fetch() so that the bearer token goes in a
// header (EventSource cannot send one). The token is asked for when the
// server answers 401 and kept for this tab only (sessionStorage).

const TOKEN_KEY = "spindle.token";

// The API's types, generated from docs/openapi.yaml into
// runtime/clients/typescript/src/schema.d.ts. The console has no build
// step: these are comments to the browser; CI type-checks the modules
// against them (tests/ts_client/run.sh, tsc --checkJs), so a field the
// console reads that the document does not have fails the build.
/** @typedef {import("../clients/typescript/src/schema").components["schemas"]} Schemas */

/** An error answer of the API: status, code and message as sent. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  toString() {
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

/** @type {(refused: boolean) => Promise<string | null>} */
let askToken = async () => null; // set by the page: shows the token dialog
let tokenPrompt = null; // one dialog for every request waiting on it

/** `ask(refused)` resolves to a token, or null when the user gave up. */
export function onTokenNeeded(ask) {
  askToken = ask;
}

export const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

function headers(extra) {
  const out = { ...extra };
  const t = token();
  if (t) out.Authorization = "Bearer " + t;
  return out;
}

// Sends `init` to `path`; on 401 asks for a token once (shared by every
// request that got a 401 meanwhile) and sends again, until the user gives up.
async function send(path, init) {
  for (;;) {
    const sent = token();
    const res = await fetch(path, { ...init, headers: headers(init.headers) });
    if (res.status !== 401) return res;
    await res.body?.cancel();
    if (token() !== sent) continue; // another request got a new one
    if (!tokenPrompt) {
      tokenPrompt = askToken(sent !== "").finally(() => (tokenPrompt = null));
    }
    const given = await tokenPrompt;
    if (given === null) throw new ApiError(401, "unauthorized", "this server requires a token");
    sessionStorage.setItem(TOKEN_KEY, given);
  }
}

async function failure(res) {
  let code = "http_" + res.status;
  let message = res.statusText || "request failed";
  try {
    const body = await res.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, code, message);
}

/**
 * A JSON call; resolves to the parsed body (null for 204). Callers name
 * the body's type from `Schemas`.
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body]
 * @returns {Promise<any>}
 */
export async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const res = await send(path, init);
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
 * what was missed). onState("live" | "down") reports the connection.
 * Returns a function that stops it.
 * @param {string} query
 * @param {(event: string, data: any) => void} onEvent
 * @param {(state: "live" | "down", err?: Error) => void} [onState]
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
      }
      if (ctl.signal.aborted) return;
      onState("down");
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  return () => ctl.abort();
}
