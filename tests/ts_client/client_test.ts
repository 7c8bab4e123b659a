// spindle's TypeScript client (runtime/clients/typescript) against a
// running `spindle serve`: a thread (plain and streamed messages, history),
// an orchestration claimed and completed under leases, the event stream,
// and a refused token. Every answer and every event is also checked
// against docs/openapi.yaml (its JSON form): the status and media type are
// documented, and the body or the event's data validates against the
// schema the document gives them.
// usage: node out/test/client_test.js BASE_URL TOKEN OPENAPI_JSON
// Prints one line per check; exits 1 at the first failed one.

import { readFileSync } from "node:fs";
import type { Middleware } from "openapi-fetch";
import {
  createSpindleClient,
  SpindleError,
  type ErrorCode,
  type MessageStreamEvent,
  type SpindleEvent,
} from "../../runtime/clients/typescript/src/index.js";

const [baseUrl, token, documentPath] = process.argv.slice(2);
if (!baseUrl || !token || !documentPath) {
  console.error("usage: node client_test.js BASE_URL TOKEN OPENAPI_JSON");
  process.exit(2);
}

// -- checks ------------------------------------------------------------------

let passed = 0;

class CheckFailed extends Error {}

/** One check: prints `ok   NAME`, or `FAIL NAME: DETAIL` and stops the test. */
function check(name: string, ok: boolean, detail?: unknown): void {
  if (!ok) {
    console.log(`FAIL ${name}${detail === undefined ? "" : `: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`}`);
    throw new CheckFailed(name);
  }
  passed += 1;
  console.log(`ok   ${name}`);
}

/** JSON equality, object keys in any order. */
function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (v !== null && typeof v === "object")
    return Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, x]) => [k, canonical(x)]));
  return v;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Polls `find` until it answers something, or `ms` pass. */
async function until<T>(find: () => T | undefined | Promise<T | undefined>, ms = 5000): Promise<T | undefined> {
  const deadline = Date.now() + ms;
  for (;;) {
    const found = await find();
    if (found !== undefined || Date.now() >= deadline) return found;
    await sleep(20);
  }
}

// -- the document ------------------------------------------------------------

type Obj = { [key: string]: unknown };
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

const doc = JSON.parse(readFileSync(documentPath, "utf8")) as Obj;

/** Follows `$ref`s within the document. */
function resolve(node: unknown): unknown {
  let seen = 0;
  while (isObj(node) && typeof node.$ref === "string") {
    if (++seen > 32) throw new Error(`$ref loop at ${node.$ref}`);
    let at: unknown = doc;
    for (const part of node.$ref.replace(/^#\//, "").split("/"))
      at = isObj(at) ? at[part.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined;
    node = at;
  }
  return node;
}

function get(node: unknown, ...keys: string[]): unknown {
  for (const key of keys) node = isObj(node = resolve(node)) ? node[key] : undefined;
  return resolve(node);
}

const typeOk: Record<string, (v: unknown) => boolean> = {
  null: (v) => v === null,
  boolean: (v) => typeof v === "boolean",
  string: (v) => typeof v === "string",
  number: (v) => typeof v === "number",
  integer: (v) => Number.isInteger(v),
  array: (v) => Array.isArray(v),
  object: isObj,
};

function regex(pattern: string): RegExp {
  try {
    return new RegExp(pattern, "u");
  } catch {
    return new RegExp(pattern);
  }
}

/**
 * The JSON Schema keywords docs/openapi.yaml uses; pushes one line per
 * violation to `out`.
 */
function validate(schemaRef: unknown, value: unknown, at: string, out: string[]): void {
  const schema = resolve(schemaRef);
  if (schema === undefined || schema === true) return;
  if (schema === false || !isObj(schema)) {
    out.push(`${at}: no value is allowed`);
    return;
  }
  const say = (what: string) => out.push(`${at}: ${JSON.stringify(value)} ${what}`);
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? (schema.type as string[]) : [schema.type as string];
    if (!types.some((t) => typeOk[t]?.(value))) {
      say(`is not ${types.join(" or ")}`);
      return;
    }
  }
  if ("const" in schema && !same(value, schema.const)) say(`is not ${JSON.stringify(schema.const)}`);
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => same(e, value))) say(`is not one of ${JSON.stringify(schema.enum)}`);
  if (typeof value === "string") {
    const length = [...value].length;
    if (typeof schema.pattern === "string" && !regex(schema.pattern).test(value)) say(`does not match ${schema.pattern}`);
    if (typeof schema.minLength === "number" && length < schema.minLength) say(`is shorter than ${schema.minLength}`);
    if (typeof schema.maxLength === "number" && length > schema.maxLength) say(`is longer than ${schema.maxLength}`);
  }
  if (typeof value === "number") {
    if (typeof schema.minimum === "number" && value < schema.minimum) say(`is below ${schema.minimum}`);
    if (typeof schema.maximum === "number" && value > schema.maximum) say(`is above ${schema.maximum}`);
  }
  if (Array.isArray(value)) {
    if (typeof schema.minItems === "number" && value.length < schema.minItems) say(`has fewer than ${schema.minItems} items`);
    if (typeof schema.maxItems === "number" && value.length > schema.maxItems) say(`has more than ${schema.maxItems} items`);
    if (schema.items !== undefined) value.forEach((item, i) => validate(schema.items, item, `${at}[${i}]`, out));
  }
  if (isObj(value)) {
    const properties = isObj(schema.properties) ? schema.properties : {};
    for (const key of Array.isArray(schema.required) ? (schema.required as string[]) : [])
      if (!(key in value)) out.push(`${at}: required "${key}" is missing`);
    for (const [key, item] of Object.entries(value)) {
      if (key in properties) validate(properties[key], item, `${at}.${key}`, out);
      else if (schema.additionalProperties === false) out.push(`${at}: "${key}" is not in the schema`);
      else if (schema.additionalProperties !== undefined) validate(schema.additionalProperties, item, `${at}.${key}`, out);
      if (isObj(schema.propertyNames)) validate(schema.propertyNames, key, `${at} key "${key}"`, out);
    }
    if (typeof schema.maxProperties === "number" && Object.keys(value).length > schema.maxProperties)
      say(`has more than ${schema.maxProperties} properties`);
  }
  const matches = (list: unknown) =>
    (Array.isArray(list) ? list : []).map((s) => {
      const sub: string[] = [];
      validate(s, value, at, sub);
      return sub;
    });
  if (Array.isArray(schema.allOf)) for (const sub of matches(schema.allOf)) out.push(...sub);
  if (Array.isArray(schema.anyOf) && !matches(schema.anyOf).some((sub) => sub.length === 0)) say("matches none of anyOf");
  if (Array.isArray(schema.oneOf)) {
    const results = matches(schema.oneOf);
    const n = results.filter((sub) => sub.length === 0).length;
    if (n !== 1) say(`matches ${n} of oneOf (${results.map((sub) => sub.join("; ") || "ok").join(" | ")})`);
  }
}

/** Where the server and the document disagree (how often): any fails the test at the end. */
const disagreements = new Map<string, number>();
const disagree = (what: string) => disagreements.set(what, (disagreements.get(what) ?? 0) + 1);
let answersChecked = 0;
let eventsChecked = 0;

/** Checks each answer's status, media type and body against the document. */
const conformance: Middleware = {
  async onResponse({ request, response, schemaPath }) {
    answersChecked += 1;
    const where = `${request.method} ${schemaPath} -> ${response.status}`;
    const operation = get(doc, "paths", schemaPath, request.method.toLowerCase());
    if (!isObj(operation)) {
      disagree(`${where}: the document has no such operation`);
      return;
    }
    const documented = get(operation, "responses", String(response.status));
    if (!isObj(documented)) {
      disagree(`${where}: the document lists no ${response.status} for it`);
      return;
    }
    const media = (response.headers.get("content-type") ?? "").split(";")[0]!.trim();
    if (media === "text/event-stream" && isObj(get(documented, "content", media)))
      return; // each event is checked as it is read
    const text = await response.clone().text();
    if (!isObj(documented.content)) {
      if (text !== "") disagree(`${where}: a body (${media}) where the document has none`);
      return;
    }
    const content = get(documented, "content", media);
    if (!isObj(content)) {
      disagree(`${where}: ${media || "no Content-Type"}, the document has ${Object.keys(documented.content).join(", ")}`);
      return;
    }
    let body: unknown = text;
    if (media.endsWith("json")) {
      try {
        body = JSON.parse(text);
      } catch {
        disagree(`${where}: the body is not JSON: ${text.slice(0, 200)}`);
        return;
      }
    }
    const errors: string[] = [];
    validate(content.schema, body, "body", errors);
    for (const e of errors) disagree(`${where}: ${e}`);
  },
};

/** Checks an event against the route's `x-spindle-events`. */
function checkEvent(path: string, method: string, event: { event: string; data: unknown }): void {
  eventsChecked += 1;
  const events = get(doc, "paths", path, method, "responses", "200", "content", "text/event-stream", "x-spindle-events");
  const schema = get(events, event.event);
  if (!isObj(schema)) {
    disagree(`${method.toUpperCase()} ${path}: event "${event.event}" is not in x-spindle-events`);
    return;
  }
  const errors: string[] = [];
  validate(schema, event.data, `${event.event} data`, errors);
  for (const e of errors) disagree(`${method.toUpperCase()} ${path}: ${e}`);
}

// -- the test ----------------------------------------------------------------

const spindle = createSpindleClient({ baseUrl, token });
spindle.use(conformance);
const intruder = createSpindleClient({ baseUrl, token: `${token}-wrong` });
intruder.use(conformance);

async function health(): Promise<void> {
  const { data, response } = await spindle.GET("/healthz");
  check("health: GET /healthz answers 200 status ok", response.status === 200 && data?.status === "ok", data);
}

async function unauthorized(): Promise<void> {
  const { data, error, response } = await intruder.GET("/v1/threads", { params: { query: { limit: 5 } } });
  const code: ErrorCode | undefined = error?.error.code;
  check("auth: a wrong token gets 401 and the typed error object with code unauthorized",
    response.status === 401 && data === undefined && code === "unauthorized" &&
      error?.error.type === "authentication_error" && typeof error.error.message === "string",
    error);

  let thrown: unknown;
  try {
    for await (const event of intruder.events()) throw new Error(`an event without the token: ${JSON.stringify(event)}`);
  } catch (e) {
    thrown = e;
  }
  check("auth: events() with a wrong token throws a SpindleError with status 401 and code unauthorized",
    thrown instanceof SpindleError && thrown.status === 401 && thrown.code === "unauthorized", String(thrown));

  thrown = undefined;
  try {
    for await (const event of intruder.streamMessage("new", { content: "not allowed" }))
      throw new Error(`an event without the token: ${JSON.stringify(event)}`);
  } catch (e) {
    thrown = e;
  }
  check("auth: streamMessage() with a wrong token throws a SpindleError with code unauthorized",
    thrown instanceof SpindleError && thrown.status === 401 && thrown.body?.error.code === "unauthorized", String(thrown));
}

// The subscription: every event it reads, in order.
const seen: SpindleEvent[] = [];
const following = new AbortController();
let followFailure: unknown;
let followEnded = false;
let pump: Promise<void> = Promise.resolve();

async function subscribe(): Promise<void> {
  pump = (async () => {
    try {
      for await (const event of spindle.events({ types: ["task", "thread"], signal: following.signal })) {
        checkEvent("/v1/events", "get", event);
        seen.push(event);
      }
    } catch (e) {
      followFailure = e;
    } finally {
      followEnded = true;
    }
  })();
  // A new subscription starts live: a thread created until one's
  // thread.created arrives tells that it is live.
  const live = await until(async () => {
    const { data } = await spindle.POST("/v1/threads", { body: { metadata: { purpose: "ping" } } });
    const id = data?.thread_id;
    const arrived = await until(() => seen.find((e) => e.event === "thread.created" && e.data.thread === id), 300);
    return arrived ?? (followEnded ? null : undefined);
  }, 10000);
  check("events: events({ types: [task, thread] }) is live (a thread's thread.created arrived, with an id)",
    live !== undefined && live !== null && /^[0-9]+-[0-9]+$/.test(live.id ?? ""), { live, followFailure: String(followFailure) });
}

async function thread(): Promise<void> {
  const metadata = { suite: "ts-client", case: "thread" };
  const created = await spindle.POST("/v1/threads", { body: { metadata } });
  const t = created.data;
  check("thread: POST /v1/threads creates a thread (201) with its metadata and no turns",
    created.response.status === 201 && t?.object === "thread" && t.turns === 0 && same(t.metadata, metadata) &&
      t.created_at === t.updated_at,
    t ?? created.error);
  if (!t) return;
  const id = t.thread_id;

  const read = await spindle.GET("/v1/threads/{id}", { params: { path: { id } } });
  check("thread: GET /v1/threads/{id} reads it back", same(read.data, t), read.data ?? read.error);

  const first = "Hello from the TypeScript client";
  const sent = await spindle.POST("/v1/threads/{id}/messages", { params: { path: { id } }, body: { content: first } });
  const reply = sent.data;
  check("message: POST /v1/threads/{id}/messages answers the reply, 2 turns",
    sent.response.status === 200 && reply?.thread_id === id && reply.turns === 2 &&
      reply.reply.length > 0 && reply.reply.includes(first) && reply.created === undefined,
    reply ?? sent.error);

  const second = "Stream this one, please";
  const streamed: MessageStreamEvent[] = [];
  for await (const event of spindle.streamMessage(id, { content: second })) {
    checkEvent("/v1/threads/{id}/messages/stream", "post", event);
    streamed.push(event);
  }
  const kinds = streamed.map((e) => e.event);
  const first_ = streamed[0];
  const last = streamed[streamed.length - 1];
  check("stream: streamMessage() reads thread, one or more delta, then done",
    first_?.event === "thread" && first_.data.thread_id === id && last?.event === "done" &&
      kinds.slice(1, -1).length > 0 && kinds.slice(1, -1).every((k) => k === "delta"),
    kinds);
  const deltas = streamed.flatMap((e) => (e.event === "delta" ? [e.data.content] : [])).join("");
  check("stream: done names the thread and its 4 turns, no tool calls, nothing cut short",
    last?.event === "done" && last.data.thread_id === id && last.data.turns === 4 &&
      last.data.tool_calls === undefined && last.data.interrupted === undefined,
    last);

  const history = await spindle.GET("/v1/threads/{id}/history", { params: { path: { id }, query: { max_turns: 10 } } });
  const h = history.data;
  const turns = h?.turns ?? [];
  check("history: GET /v1/threads/{id}/history has the 4 turns, user and assistant in turn",
    h?.thread_id === id && h.total_turns === 4 && h.summary === null && turns.length === 4 &&
      same(turns.map((x) => x.role), ["user", "assistant", "user", "assistant"]),
    h ?? history.error);
  check("history: the turns are the two messages and their replies",
    turns[0]?.content === first && turns[1]?.content === reply?.reply && turns[2]?.content === second &&
      turns.every((x) => x.interrupted === undefined && x.tool_calls === undefined),
    turns.map((x) => x.content));
  check("stream: the deltas concatenate to the reply done stored (the last turn)",
    deltas.length > 0 && turns[3]?.content === deltas, { deltas, stored: turns[3]?.content });

  const appended = await until(() => {
    const mine = seen.filter((e) => e.event === "thread.turn_appended" && e.data.thread === id);
    return mine.length >= 4 ? mine : undefined;
  });
  check("events: thread.created, then thread.turn_appended for each of the 4 turns in order",
    seen.some((e) => e.event === "thread.created" && e.data.thread === id) &&
      appended !== undefined && appended.length === 4 &&
      same(appended.map((e) => (e.event === "thread.turn_appended" ? [e.data.role, e.data.turns] : null)),
        [["user", 1], ["assistant", 2], ["user", 3], ["assistant", 4]]),
    appended);
}

async function tasks(): Promise<void> {
  const created = await spindle.POST("/v1/orchestrations", { body: { payload: { job: "ts-client" } } });
  const root = created.data?.id ?? "";
  check("task: POST /v1/orchestrations creates one (201) with an orchestration ID",
    created.response.status === 201 && /^[0-9A-Z]{4}$/.test(root), created.data ?? created.error);

  // root -> a (t1), b (t2); a -> a1 (t1.1), a2 (t1.2)
  const spawn = async (parent: string, payload: unknown) => {
    const r = await spindle.POST("/v1/tasks/{id}/subtasks", { params: { path: { id: parent } }, body: { payload } });
    return r.response.status === 201 ? r.data?.id : undefined;
  };
  const a = await spawn(root, { step: "a" });
  const b = await spawn(root, { step: "b" });
  const a1 = await spawn(`${root}_t1`, { step: "a1" });
  const a2 = await spawn(`${root}_t1`, { step: "a2" });
  check("task: POST /v1/tasks/{id}/subtasks spawns two children and two grandchildren (201, IDs in order)",
    same([a, b, a1, a2], [`${root}_t1`, `${root}_t2`, `${root}_t1.1`, `${root}_t1.2`]), [a, b, a1, a2]);
  const all = [root, `${root}_t1`, `${root}_t1.1`, `${root}_t1.2`, `${root}_t2`]; // preorder
  const payloads: Record<string, unknown> = {
    [root]: { job: "ts-client" }, [`${root}_t1`]: { step: "a" }, [`${root}_t2`]: { step: "b" },
    [`${root}_t1.1`]: { step: "a1" }, [`${root}_t1.2`]: { step: "a2" },
  };

  const before = await spindle.GET("/v1/orchestrations/{id}", { params: { path: { id: root } } });
  const tree = before.data;
  check("task: the orchestration tree lists the 5 tasks pending; the leaves executable, deepest first",
    tree?.id === root && same(tree.tasks.map((t) => t.id), all) && tree.tasks.every((t) => t.state === "pending") &&
      same(tree.executable, [`${root}_t1.2`, `${root}_t1.1`, `${root}_t2`]) && tree.next === `${root}_t1.2`,
    tree ?? before.error);

  // Deepest first, then the highest sequence: each leaf, then its parent.
  const order = [`${root}_t1.2`, `${root}_t1.1`, `${root}_t2`, `${root}_t1`, root];
  for (const [i, expected] of order.entries()) {
    const { data: next } = await spindle.GET("/v1/orchestrations/{id}", { params: { path: { id: root } } });
    const claim = await spindle.POST("/v1/tasks/claim", { body: { worker: "ts-worker", lease_s: 60 } });
    const task = claim.data;
    check(`task: claim ${i + 1} takes ${expected} (the tree's next), running under a lease`,
      claim.response.status === 200 && next?.next === expected && task?.id === expected &&
        task.state === "running" && task.worker === "ts-worker" && task.attempts === 1 &&
        task.incomplete_children === 0 && task.lease.token.length > 0 && task.lease.expires_at > Date.now() &&
        same(task.payload, payloads[expected]),
      task ?? claim.error);
    if (!task) return;

    if (i === 0) {
      const refused = await spindle.POST("/v1/tasks/{id}/complete", { params: { path: { id: task.id } }, body: {} });
      check("task: completing a leased task without its lease is 409 lease_lost (typed error)",
        refused.response.status === 409 && refused.error?.error.code === "lease_lost" &&
          refused.error.error.type === "conflict_error",
        refused.error);
    }

    const result = { done: task.id };
    const done = await spindle.POST("/v1/tasks/{id}/complete", {
      params: { path: { id: task.id } },
      body: { lease: task.lease.token, result },
    });
    check(`task: ${expected} completed with its lease, keeping its result`,
      done.response.status === 200 && done.data?.id === expected && done.data.state === "completed" &&
        same(done.data.result, result) && done.data.lease_expires_at === null,
      done.data ?? done.error);
  }

  const none = await spindle.POST("/v1/tasks/claim", { body: { worker: "ts-worker" } });
  check("task: a claim with nothing executable is 204", none.response.status === 204 && none.data === undefined,
    none.response.status);

  const after = await spindle.GET("/v1/orchestrations/{id}", { params: { path: { id: root } } });
  const final = after.data;
  check("task: the orchestration tree has every task completed with its result, nothing executable",
    final?.id === root && same(final.tasks.map((t) => t.id), all) &&
      final.tasks.every((t) => t.state === "completed" && t.incomplete_children === 0 && t.worker === "ts-worker" &&
        same(t.result, { done: t.id }) && same(t.payload, payloads[t.id])) &&
      final.executable.length === 0 && final.next === null,
    final ?? after.error);

  // Each task's events: created, claimed, completed, in that order.
  const story = (id: string) =>
    seen.flatMap((e) => (e.event.startsWith("task.") && "task" in e.data && e.data.task === id ? [e] : []));
  const complete = await until(() => (all.every((id) => story(id).length >= 3) ? true : undefined));
  for (const id of all) {
    const mine = story(id);
    check(`events: ${id}: task.created (pending), task.claimed (running, ts-worker, attempt 1), task.completed`,
      complete === true && same(mine.map((e) => [e.event, e.data]), [
        ["task.created", { task: id, state: "pending", worker: null, attempts: 0 }],
        ["task.claimed", { task: id, state: "running", worker: "ts-worker", attempts: 1 }],
        ["task.completed", { task: id, state: "completed", worker: "ts-worker", attempts: 1 }],
      ]),
      mine);
  }
  const seqs = seen.map((e) => Number((e.id ?? "").split("-")[1]));
  check("events: every event has an id, its sequence growing",
    seen.every((e) => /^[0-9]+-[0-9]+$/.test(e.id ?? "")) && seqs.every((s, i) => i === 0 || s > seqs[i - 1]!),
    seen.map((e) => e.id));
}

async function stopFollowing(): Promise<void> {
  following.abort();
  const ended = await until(() => (followEnded ? true : undefined), 3000);
  check("events: aborting the signal ends the iteration quietly", ended === true && followFailure === undefined,
    String(followFailure));
  const gone = await until(async () => {
    const { data } = await spindle.GET("/v1/stats");
    return data?.events.subscribers === 0 ? true : undefined;
  }, 3000);
  check("events: the server has no subscriber left (GET /v1/stats)", gone === true);
}

async function main(): Promise<void> {
  try {
    await health();
    await unauthorized();
    await subscribe();
    await thread();
    await tasks();
    await stopFollowing();
    check(`document: ${answersChecked} answers and ${eventsChecked} events are as docs/openapi.yaml describes them`,
      disagreements.size === 0, `${disagreements.size} disagreements, listed below`);
    console.log(`ts client: ${passed} passed, 0 failed`);
  } catch (e) {
    if (!(e instanceof CheckFailed)) console.log(`FAIL unexpected: ${e instanceof Error ? e.stack : String(e)}`);
    if (disagreements.size > 0) {
      console.log("where the server and docs/openapi.yaml disagree:");
      for (const [what, n] of disagreements) console.log(`  ${what}${n > 1 ? ` (${n} times)` : ""}`);
    }
    console.log(`ts client: ${passed} passed, 1 failed`);
    process.exitCode = 1;
  } finally {
    following.abort();
    await pump;
  }
}

await main();
