// Writes the `x-spindle-events` of docs/openapi.yaml as TypeScript, made by
// openapi-typescript as it makes src/schema.d.ts: one schema per event,
// named OPERATION_ID.EVENT (`streamMessage.done`, `subscribeEvents.task.created`),
// in `components["schemas"]`. event_types.ts checks the client's
// hand-written event types against them.
// usage: node extract_events.mjs OPENAPI_JSON OUT_D_TS

import { readFileSync, writeFileSync } from "node:fs";
import openapiTS, { astToString } from "openapi-typescript";

const [source, out] = process.argv.slice(2);
const doc = JSON.parse(readFileSync(source, "utf8"));

// The document's own schemas stay, for the events' $refs.
const schemas = { ...doc.components.schemas };
let routes = 0;
for (const [path, item] of Object.entries(doc.paths)) {
  for (const [method, operation] of Object.entries(item)) {
    for (const [status, response] of Object.entries(operation.responses ?? {})) {
      const media = response.content?.["text/event-stream"];
      if (!media) continue;
      const events = media["x-spindle-events"];
      if (!events) {
        console.error(`${method.toUpperCase()} ${path} ${status}: text/event-stream without x-spindle-events`);
        process.exit(1);
      }
      routes += 1;
      for (const [name, schema] of Object.entries(events))
        schemas[`${operation.operationId}.${name}`] = schema;
    }
  }
}
if (routes === 0) {
  console.error(`${source}: no text/event-stream response`);
  process.exit(1);
}

const ast = await openapiTS(
  { openapi: "3.1.0", info: { title: "x-spindle-events", version: doc.info.version }, paths: {},
    components: { schemas } },
  { silent: true, defaultNonNullable: false });
writeFileSync(out, astToString(ast));
