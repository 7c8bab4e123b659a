// Compile-time check: the client's event types (runtime/clients/typescript/
// src/index.ts) are exactly what openapi-typescript makes of the document's
// `x-spindle-events` (events.gen.d.ts, written by extract_events.mjs): the
// same event names per route, and each event's data the same type. A
// mismatch fails `tsc` here, naming the event.

import type { components } from "./events.gen.js";
import type { MessageStreamEvents, SpindleEvents } from "../../runtime/clients/typescript/src/index.js";

type Documented = components["schemas"];

/** True when A and B are the same type (not merely assignable). */
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false;

/** The event names the document gives the operation `Op`. */
type NamesOf<Op extends string> =
  keyof Documented extends infer K ? (K extends `${Op}.${infer Name}` ? Name : never) : never;

/** `true` for each event whose data is as documented; a type error otherwise. */
type Check<Events, Op extends string> =
  Same<keyof Events, NamesOf<Op>> extends true
    ? { [Name in keyof Events & string]: Same<Events[Name], Documented[`${Op}.${Name}` & keyof Documented]> }
    : { event_names_differ: [keyof Events, NamesOf<Op>] };

export const messageStream: Check<MessageStreamEvents, "streamMessage"> = {
  thread: true,
  queued: true,
  delta: true,
  tool_call: true,
  done: true,
  cancelled: true,
  error: true,
};

export const events: Check<SpindleEvents, "subscribeEvents"> = {
  "task.created": true,
  "task.claimed": true,
  "task.completed": true,
  "task.failed": true,
  "task.lease_expired": true,
  "task.stale": true,
  "task.retried": true,
  "task.requeued": true,
  "thread.created": true,
  "thread.turn_appended": true,
  "thread.cleared": true,
  "thread.forked": true,
  "thread.deleted": true,
  reset: true,
};
