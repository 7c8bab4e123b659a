// A typed client of spindle's HTTP API (docs/api.md, docs/openapi.yaml).
//
// `createSpindleClient` answers an openapi-fetch client typed by `paths`
// (src/schema.d.ts, generated from docs/openapi.yaml by openapi-typescript)
// with the bearer token set, and two helpers for the routes that answer
// `text/event-stream`, which openapi-fetch hands over unread: each is an
// async iterator of `{ event, data, id? }` whose types are the document's
// `x-spindle-events` of the route, written out below.

import createClient, { type Client, type ClientOptions } from "openapi-fetch";
import type { components, operations, paths } from "./schema.js";

export type { components, operations, paths };

type Schemas = components["schemas"];

/** Every error spindle answers with; a 500 may lack `type` and `param`. */
export type ApiError = Schemas["Error"] | Schemas["InternalError"];
export type ErrorCode = Schemas["ErrorCode"];
export type MessageRequest = Schemas["MessageRequest"];

// -- x-spindle-events of POST /v1/threads/{id}/messages/stream --------------

export interface MessageStreamEvents {
  thread: { thread_id: string };
  /** The call waits for the upstream's room (docs/limits.md). */
  queued: { position: number; waiting: number };
  delta: { content: string };
  tool_call: { index: number; id?: string; name?: string; arguments: string };
  done: {
    thread_id: string;
    turns: number;
    tool_calls?: Schemas["ToolCall"][];
    created?: true;
    forked_from?: string;
    interrupted?: true;
    /** What the exchange spent (docs/usage.md). */
    usage?: Schemas["Usage"];
  };
  cancelled: {
    thread_id: string;
    turns: number;
    created?: true;
    forked_from?: string;
    interrupted: true;
    cancelled: true;
    usage?: Schemas["Usage"];
  };
  error: { error: { code: ErrorCode; message: string } };
}

// -- x-spindle-events of GET /v1/events ---------------------------------------

/** The data of every `task.*` event. */
export interface TaskEventData {
  task: string;
  state: Schemas["TaskState"];
  worker: string | null;
  attempts: number;
  /** Present while a retry waits out its backoff. */
  retry_at?: number;
}

export interface SpindleEvents {
  "task.created": TaskEventData;
  "task.claimed": TaskEventData;
  "task.completed": TaskEventData;
  "task.failed": TaskEventData;
  "task.lease_expired": TaskEventData;
  "task.stale": TaskEventData;
  "task.retried": TaskEventData;
  "task.requeued": TaskEventData;
  "thread.created": { thread: string };
  "thread.turn_appended": { thread: string; role: Schemas["Turn"]["role"]; turns: number };
  "thread.cleared": { thread: string };
  "thread.forked": { thread: string; source: string; turns: number };
  "thread.deleted": { thread: string };
  reset: { reason: string; last_event_id: string | null };
}

/** One event of a stream whose events are `M`: `event` tells `data`'s type. */
export type StreamEvent<M> = {
  [K in keyof M & string]: { event: K; data: M[K]; id?: string };
}[keyof M & string];

export type MessageStreamEvent = StreamEvent<MessageStreamEvents>;
export type SpindleEvent = StreamEvent<SpindleEvents>;

/** What `types` of GET /v1/events names: an event type or a family. */
export type EventType = Exclude<keyof SpindleEvents, "reset"> | "task" | "thread";

// -- errors ----------------------------------------------------------------

/** A streamed route answered with an error status instead of a stream. */
export class SpindleError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** The error object, when the body was spindle's error shape. */
  readonly body: ApiError | undefined;

  constructor(status: number, body: unknown) {
    const parsed = isApiError(body) ? body : undefined;
    super(parsed ? `${status} ${parsed.error.code}: ${parsed.error.message}`
                 : `${status}: ${typeof body === "string" ? body : JSON.stringify(body)}`);
    this.name = "SpindleError";
    this.status = status;
    this.body = parsed;
  }

  /** The error's code (`unauthorized`, `not_found`, ...). */
  get code(): ErrorCode | undefined {
    return this.body?.error.code;
  }
}

function isApiError(body: unknown): body is ApiError {
  if (typeof body !== "object" || body === null || !("error" in body)) return false;
  const error: unknown = body.error;
  return typeof error === "object" && error !== null && "code" in error &&
    typeof error.code === "string" && "message" in error && typeof error.message === "string";
}

// -- text/event-stream ------------------------------------------------------

/** An event as read off the wire: `data` is JSON when it parses as JSON. */
export interface RawEvent {
  event: string;
  data: unknown;
  id?: string;
}

/**
 * Reads a `text/event-stream` body (the WHATWG format): lines end with CRLF,
 * LF or CR; a blank line ends an event; `event:` names it (`message` when
 * absent); `data:` lines are joined with LF; `id:` is kept on the event it
 * came with; comments, `retry:` and blocks without data are no events.
 */
export async function* readEventStream(
  body: ReadableStream<Uint8Array>,
): AsyncGenerator<RawEvent, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder(); // UTF-8, a leading BOM dropped
  let buffer = "";
  let name = "";
  let data: string[] = [];
  let id: string | undefined;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return; // an event without its blank line is dropped
      buffer += decoder.decode(value, { stream: true });
      for (;;) {
        const end = /\r\n|\r|\n/.exec(buffer);
        if (!end) break;
        // A CR at the end of what arrived may be half of a CRLF.
        if (end[0] === "\r" && end.index === buffer.length - 1) break;
        const line = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        if (line === "") {
          if (data.length > 0) {
            const text = data.join("\n");
            const event: RawEvent = { event: name || "message", data: parseData(text) };
            if (id !== undefined) event.id = id;
            yield event;
          }
          name = "";
          data = [];
          id = undefined;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "event") name = text;
        else if (field === "data") data.push(text);
        else if (field === "id" && !text.includes("\0")) id = text;
      }
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

function parseData(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * The events of a response: ends when the stream ends or `signal` aborts
 * (quietly: an abort is how a caller stops following); any other failure
 * is thrown.
 */
async function* follow<E>(
  open: () => Promise<{ data?: ReadableStream<Uint8Array> | null; error?: unknown; response: Response }>,
  signal: AbortSignal | undefined,
): AsyncGenerator<E, void, undefined> {
  try {
    if (signal?.aborted) return;
    const { data, error, response } = await open();
    if (!response.ok || !data) throw new SpindleError(response.status, error);
    for await (const event of readEventStream(data)) yield event as E;
  } catch (error) {
    if (signal?.aborted) return;
    throw error;
  }
}

// -- the client -------------------------------------------------------------

export interface SpindleClientOptions extends Omit<ClientOptions, "baseUrl"> {
  /** Where `spindle serve` listens, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** The server's `--token`: sent as `Authorization: Bearer <token>`. */
  token?: string;
}

export interface StreamMessageOptions {
  signal?: AbortSignal;
  /** Makes a retry safe (`Idempotency-Key`). */
  idempotencyKey?: string;
}

export interface EventsOptions {
  /** Event types or families (`task`, `thread`); all when absent. */
  types?: readonly EventType[];
  /** Only this orchestration's tasks' events. */
  orchestration?: string;
  /** Only this thread's events. */
  thread?: string;
  /** Resume after this event's `id` (sent as `Last-Event-ID`). */
  lastEventId?: string;
  signal?: AbortSignal;
}

export type SpindleClient = Client<paths> & {
  /**
   * POST /v1/threads/{id}/messages/stream (`id` may be `new`): `thread`,
   * then `delta` and `tool_call` pieces, then `done` (or `cancelled`, or
   * `error`). An error status before the stream is a `SpindleError`.
   */
  streamMessage(
    threadId: string,
    body: MessageRequest,
    options?: StreamMessageOptions,
  ): AsyncGenerator<MessageStreamEvent, void, undefined>;
  /**
   * GET /v1/events: task and thread changes, live (or after `lastEventId`),
   * until `signal` aborts or the iteration is left. An error status is a
   * `SpindleError`.
   */
  events(options?: EventsOptions): AsyncGenerator<SpindleEvent, void, undefined>;
};

export function createSpindleClient(options: SpindleClientOptions): SpindleClient {
  const { baseUrl, token, headers, ...rest } = options;
  const client = createClient<paths>({
    ...rest,
    baseUrl: baseUrl.replace(/\/+$/, ""),
    headers: { ...(token === undefined ? {} : { Authorization: `Bearer ${token}` }), ...headers },
  });

  function streamMessage(threadId: string, body: MessageRequest, opts: StreamMessageOptions = {}) {
    const { signal, idempotencyKey } = opts;
    return follow<MessageStreamEvent>(() => client.POST("/v1/threads/{id}/messages/stream", {
      params: {
        path: { id: threadId },
        header: idempotencyKey === undefined ? {} : { "Idempotency-Key": idempotencyKey },
      },
      body,
      parseAs: "stream",
      signal,
    }), signal);
  }

  function events(opts: EventsOptions = {}) {
    const { types, orchestration, thread, lastEventId, signal } = opts;
    const query: NonNullable<operations["subscribeEvents"]["parameters"]["query"]> = {};
    if (types !== undefined) query.types = types.join(",");
    if (orchestration !== undefined) query.orchestration = orchestration;
    if (thread !== undefined) query.thread = thread;
    return follow<SpindleEvent>(() => client.GET("/v1/events", {
      params: {
        query,
        header: lastEventId === undefined ? {} : { "Last-Event-ID": lastEventId },
      },
      parseAs: "stream",
      signal,
    }), signal);
  }

  return Object.assign(client, { streamMessage, events });
}
