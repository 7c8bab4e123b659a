// The API reference: GET /v1/openapi.json (docs/openapi.yaml, served by
// this server, nothing fetched from elsewhere) rendered as a page: every
// operation by tag, with its parameters, request body, responses and the
// events of streamed answers. Text goes in through textContent (dom.js).

import { h, replace, $ } from "/console/dom.js";

const METHODS = ["get", "post", "put", "patch", "delete"];

/** Follows a local $ref ("#/components/schemas/Turn") in the document. */
function deref(doc, node) {
  let seen = 0;
  while (node && node.$ref && seen++ < 32) {
    const parts = node.$ref.replace(/^#\//, "").split("/");
    node = parts.reduce((at, key) => (at ? at[key.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined), doc);
  }
  return node || {};
}

function refName(node) {
  return node && node.$ref ? node.$ref.split("/").pop() : null;
}

/** A schema's type in one line: "string", "Turn[]", "integer | null". */
function typeOf(doc, schema) {
  if (!schema) return "any";
  const name = refName(schema);
  if (name) return name;
  if (schema.const !== undefined) return JSON.stringify(schema.const);
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  for (const key of ["oneOf", "anyOf"]) {
    if (schema[key]) return schema[key].map((s) => typeOf(doc, s)).join(" | ");
  }
  const types = Array.isArray(schema.type) ? schema.type : schema.type ? [schema.type] : [];
  if (types.includes("array")) return `${typeOf(doc, schema.items)}[]`;
  return types.length ? types.join(" | ") : "any";
}

function limits(schema) {
  const out = [];
  const s = schema || {};
  if (s.minimum !== undefined) out.push(`min ${s.minimum}`);
  if (s.maximum !== undefined) out.push(`max ${s.maximum}`);
  if (s.minLength !== undefined) out.push(`min length ${s.minLength}`);
  if (s.maxLength !== undefined) out.push(`max length ${s.maxLength}`);
  if (s.maxItems !== undefined) out.push(`at most ${s.maxItems} items`);
  if (s.default !== undefined) out.push(`default ${JSON.stringify(s.default)}`);
  return out.join(", ");
}

/** An object schema's fields as a table; other schemas as their type. */
function schemaView(doc, schema, depth = 0) {
  const name = refName(schema);
  const s = deref(doc, schema);
  const props = s.properties || {};
  const keys = Object.keys(props);
  if (!keys.length || depth > 1) {
    return h("p", { class: "ref-type" }, h("code", { text: typeOf(doc, schema) }));
  }
  const required = new Set(s.required || []);
  return h(
    "div",
    null,
    name ? h("p", { class: "ref-type" }, h("code", { text: name })) : null,
    h(
      "table",
      { class: "ref-fields" },
      h("thead", null, h("tr", null, h("th", { text: "field" }), h("th", { text: "type" }), h("th", { text: "notes" }))),
      h(
        "tbody",
        null,
        keys.map((key) => {
          const p = deref(doc, props[key]);
          return h(
            "tr",
            null,
            h("td", null, h("code", { text: key }), required.has(key) ? h("span", { class: "ref-req", text: " required" }) : null),
            h("td", null, h("code", { text: typeOf(doc, props[key]) })),
            h("td", { text: [p.description || "", limits(p)].filter(Boolean).join(" ") })
          );
        })
      )
    )
  );
}

function parametersView(doc, params) {
  if (!params || !params.length) return null;
  return h(
    "table",
    { class: "ref-fields" },
    h("thead", null, h("tr", null, h("th", { text: "parameter" }), h("th", { text: "in" }), h("th", { text: "type" }), h("th", { text: "notes" }))),
    h(
      "tbody",
      null,
      params.map((raw) => {
        const p = deref(doc, raw);
        return h(
          "tr",
          null,
          h("td", null, h("code", { text: p.name }), p.required ? h("span", { class: "ref-req", text: " required" }) : null),
          h("td", { text: p.in }),
          h("td", null, h("code", { text: typeOf(doc, p.schema) })),
          h("td", { text: [p.description || "", limits(deref(doc, p.schema))].filter(Boolean).join(" ") })
        );
      })
    )
  );
}

function contentView(doc, content) {
  if (!content) return null;
  return Object.entries(content).map(([type, media]) =>
    h(
      "div",
      { class: "ref-media" },
      h("p", null, h("code", { text: type })),
      media.schema ? schemaView(doc, media.schema) : null,
      media["x-spindle-events"]
        ? h(
            "dl",
            { class: "ref-events" },
            Object.entries(media["x-spindle-events"]).map(([event, schema]) => [
              h("dt", null, h("code", { text: `event: ${event}` })),
              h("dd", null, schemaView(doc, schema)),
            ])
          )
        : null
    )
  );
}

function operationView(doc, path, method, op) {
  const id = op.operationId || `${method}-${path}`;
  const responses = Object.entries(op.responses || {});
  return h(
    "section",
    { class: "ref-op", id },
    h("h3", null, h("span", { class: `ref-method ref-${method}`, text: method.toUpperCase() }), " ", h("code", { text: path })),
    op.summary ? h("p", { class: "ref-summary", text: op.summary }) : null,
    op.description ? h("p", { text: op.description }) : null,
    op.security && op.security.length === 0 ? h("p", { class: "ref-open", text: "No token needed." }) : null,
    parametersView(doc, op.parameters),
    op.requestBody ? [h("h4", { text: "Request body" }), contentView(doc, deref(doc, op.requestBody).content)] : null,
    h("h4", { text: "Responses" }),
    h(
      "dl",
      { class: "ref-responses" },
      responses.map(([status, raw]) => {
        const r = deref(doc, raw);
        return [h("dt", null, h("code", { text: status }), " ", r.description || ""), h("dd", null, contentView(doc, r.content))];
      })
    )
  );
}

async function main() {
  const status = $("#ref-status");
  let doc;
  try {
    const res = await fetch("/v1/openapi.json");
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    doc = await res.json();
  } catch (err) {
    status.textContent = `The API description could not be loaded: ${err.message}`;
    return;
  }
  document.title = `${doc.info.title} ${doc.info.version} API reference`;
  const byTag = new Map();
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const tag = (op.tags && op.tags[0]) || "Other";
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push([path, method, op]);
    }
  }
  const order = (doc.tags || []).map((t) => t.name);
  const tags = [...byTag.keys()].sort((a, b) => (order.indexOf(a) + 1 || 1e9) - (order.indexOf(b) + 1 || 1e9));
  const count = [...byTag.values()].reduce((n, ops) => n + ops.length, 0);
  status.textContent = `${doc.info.title} ${doc.info.version}: ${count} operations. The document itself: /v1/openapi.json`;
  replace(
    $("#ref-index"),
    h(
      "ul",
      null,
      tags.map((tag) =>
        h("li", null, h("a", { href: `#tag-${tag}`, text: tag }), h("ul", null, byTag.get(tag).map(([path, method, op]) => h("li", null, h("a", { href: `#${op.operationId}`, text: `${method.toUpperCase()} ${path}` })))))
      )
    )
  );
  replace(
    $("#ref-body"),
    h("h2", { text: `${doc.info.title} ${doc.info.version}` }),
    doc.info.description ? doc.info.description.split("\n\n").map((p) => h("p", { text: p })) : null,
    tags.map((tag) => {
      const info = (doc.tags || []).find((t) => t.name === tag);
      return h(
        "section",
        { id: `tag-${tag}`, class: "ref-tag" },
        h("h2", { text: tag }),
        info && info.description ? h("p", { text: info.description }) : null,
        byTag.get(tag).map(([path, method, op]) => operationView(doc, path, method, op))
      );
    })
  );
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

main();
