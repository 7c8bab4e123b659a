"""docs/openapi.yaml as a checker of answers: which operation a request
names, and whether an answer (status, headers, body, streamed events) is
one the document declares for it. Used by the conformance check of every
answer the test suite's servers sent (conformance.py) and by the schema
fuzzer (schema_fuzz.py).

Rules (docs/api.md, "The API as a contract"):
- A request the document has no operation for must be answered 404
  `not_found` (a path no route takes, or a method a path does not have).
- Any request may be refused before it is routed with one of the
  document's pre-routing refusals (400 malformed, 413, 414, 431, 503),
  whose body is the Error object.
- Otherwise the status must be declared for the operation, its media type
  declared for that status, a JSON body must validate against its schema,
  each event of a text/event-stream body against the schema of its name in
  the media type's `x-spindle-events`, and every header the response
  declares as required must be present.
- A 500 is never conformant, declared or not: it is a defect. Other 5xx
  (502 upstream failure, 504 timeout, 503 unavailable, 507) pass only where
  the operation declares them.
"""
import json
import re
import urllib.parse

import jsonschema
import yaml

METHODS = ("get", "put", "post", "patch", "delete", "head", "options")
PRE_ROUTING = {400, 413, 414, 431, 503}


class Contract:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self._validators = {}
        # (method, compiled path regex, template, operation)
        self._ops = []
        for template, item in self.doc["paths"].items():
            pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+",
                                   re.escape(template)) + "$"
            for method in METHODS:
                if method in item:
                    self._ops.append((method.upper(), re.compile(pattern),
                                      template, item[method]))
        # Literal paths before templated ones (/v1/threads/x vs {id}).
        self._ops.sort(key=lambda o: o[2].count("{"))

    # -- the document ------------------------------------------------------
    def deref(self, node):
        seen = 0
        while isinstance(node, dict) and "$ref" in node and seen < 32:
            at = self.doc
            for key in node["$ref"].lstrip("#/").split("/"):
                at = at[key.replace("~1", "/").replace("~0", "~")]
            node, seen = at, seen + 1
        return node

    def operations(self):
        """("GET /v1/threads/{id}", operation) for every operation."""
        return [(f"{m} {t}", op) for m, _, t, op in self._ops]

    def match(self, method, path):
        """(name, operation) of the operation a request names, or None."""
        for m, rx, template, op in self._ops:
            if m == method and rx.match(path):
                return f"{m} {template}", op
        return None

    def validator(self, schema):
        key = id(schema)
        v = self._validators.get(key)
        if v is None:
            # The schema inside a root that holds the document's
            # components, so that "#/components/..." references resolve.
            root = {"components": self.doc.get("components", {}),
                    "allOf": [schema]}
            v = jsonschema.Draft202012Validator(root)
            self._validators[key] = (v, schema)
            return v
        return v[0]

    def schema_problems(self, schema, value, what):
        errors = sorted(self.validator(schema).iter_errors(value),
                        key=lambda e: list(e.absolute_path))
        out = []
        for e in errors[:3]:
            where = "/".join(str(p) for p in e.absolute_path) or "(top)"
            out.append(f"{what}: at {where}: {e.message[:300]}")
        return out

    # -- answers -----------------------------------------------------------
    def check(self, method, target, status, content_type="", headers=(),
              body="", streamed=False, complete=True, truncated=False):
        """The problems of one answer; empty when it is as declared."""
        path = urllib.parse.urlsplit(target).path or "/"
        headers = {k.lower(): v for k, v in headers}
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        if status == 500:
            return ["500: an internal error"]
        found = self.match(method, path)
        if found is None:
            if status == 404 or status in PRE_ROUTING:
                return self._error_body(body, "undeclared route's answer")
            return [f"{status} for a request no operation describes "
                    "(expected 404 not_found)"]
        name, op = found
        responses = op.get("responses", {})
        declared = responses.get(str(status))
        if declared is None:
            if status in PRE_ROUTING:
                return self._error_body(body, "refusal before routing")
            return [f"{status} is not declared for {name} "
                    f"(declared: {', '.join(sorted(responses))})"]
        declared = self.deref(declared)
        problems = []
        for hname, h in (declared.get("headers") or {}).items():
            h = self.deref(h)
            if h.get("required") and hname.lower() not in headers:
                problems.append(f"{status}: header {hname} is required "
                                "and missing")
        content = declared.get("content") or {}
        base = content_type.split(";")[0].strip().lower()
        if not content:
            if body.strip():
                problems.append(f"{status}: a body where the document "
                                "declares none")
            return problems
        media = content.get(base)
        if media is None:
            problems.append(f"{status}: media type '{content_type}' is not "
                            f"declared (declared: {', '.join(content)})")
            return problems
        if base == "text/event-stream":
            problems += self._events(media, body, complete and not truncated,
                                     status)
        elif base == "application/json":
            try:
                value = json.loads(body)
            except ValueError as e:
                return problems + [f"{status}: the body is not JSON ({e})"]
            if "schema" in media:
                problems += self.schema_problems(media["schema"], value,
                                                 f"{status} body")
        return problems

    def _error_body(self, body, what):
        try:
            value = json.loads(body)
        except ValueError:
            return [f"{what}: the body is not the Error object (not JSON)"]
        schema = {"$ref": "#/components/schemas/Error"}
        return self.schema_problems(schema, value, what)

    def _events(self, media, body, whole, status):
        events = media.get("x-spindle-events")
        if events is None:
            return [f"{status}: text/event-stream without x-spindle-events"]
        blocks = body.replace("\r\n", "\n").split("\n\n")
        if not whole or not body.endswith("\n\n"):
            blocks = blocks[:-1]  # the last block may be cut short
        problems = []
        for block in blocks:
            name, data = "message", []
            for line in block.split("\n"):
                if line.startswith(":") or not line:
                    continue
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "event":
                    name = value
                elif field == "data":
                    data.append(value)
            if not data:
                continue
            text = "\n".join(data)
            schema = events.get(name)
            if schema is None:
                problems.append(f"{status}: event '{name}' is not declared "
                                f"(declared: {', '.join(events)})")
                continue
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            problems += self.schema_problems(schema, value,
                                             f"{status} event '{name}'")
            if len(problems) > 5:
                break
        return problems
