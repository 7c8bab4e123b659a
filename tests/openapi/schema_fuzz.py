#!/usr/bin/env python3
"""Property-based HTTP fuzzer of `spindle serve`, driven by docs/openapi.yaml.

Starts its own server (a free loopback port, --admin-token, so tenancy is on,
--data :memory:, the offline provider), sends --requests generated requests
round robin over every operation of the document, valid ones and invalid ones,
as the admin token (with `Spindle-Tenant: default` on the routes of a tenant's
data) or as a key of a tenant it makes, and checks each answer against the
document:

  * no 5xx, except a 503/504 the operation declares (counted apart); a 500
    always fails, and so do a hang, a crash and a connection dropped unanswered;
  * the status is declared for the operation, or is one of the refusals every
    request may get before routing (info.description);
  * an invalid request gets a 4xx whose body is an `Error` (401 for a missing
    or wrong token, 403 for a token the route is not for or a Spindle-Tenant
    it may not name, 404 for a Spindle-Tenant that names no tenant, 400
    `unknown_field` for an unknown field, 400 `malformed` for a body that is
    not JSON or not an object, 422 for a reused Idempotency-Key, 413/414/431
    with `Connection: close` before routing);
  * a valid request gets a declared status whose body validates against its
    schema; `text/event-stream` bodies are read event by event and each event's
    data is validated against the media type's `x-spindle-events`; declared
    headers validate against their schemas (and are present when `required`);
  * an `Idempotency-Key` retry gets the first answer again, replayed;
  * successful answers agree with their request (the thread or task named,
    the state a transition leads to, ...), and a refused request changes
    nothing;
  * tests/openapi/contract.py, the project's checker of one answer, agrees;
  * GET /healthz is 200 after the run, and the server exits 0 on SIGTERM.

Requests are drawn by a generator of its own (JSON Schema to values, regular
expressions to strings) from a random.Random seeded per request from --seed, so
a seed draws the same sequence of requests whenever the server answers the same.
Only the standard library, PyYAML and jsonschema are needed.

Usage: schema_fuzz.py --binary build/spindle [--requests 10000] [--seed 1]
                      [--report report.json] [--trace trace.txt]
(tests/openapi/README.md)
"""

import argparse
import base64
import collections
import copy
import ctypes
import json
import math
import os
import random
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import warnings

import yaml

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from jsonschema import Draft202012Validator

    try:
        from jsonschema import RefResolver
    except ImportError:  # pragma: no cover - very new jsonschema
        RefResolver = None

try:  # Python 3.11+
    import re._parser as sre_parse
    import re._constants as sre_c
except ImportError:  # pragma: no cover
    import sre_parse
    import sre_constants as sre_c

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SPEC = os.path.normpath(os.path.join(HERE, "..", "..", "docs", "openapi.yaml"))

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
MAX_FAILURES_KEPT = 200        # failures kept whole in the report
MAX_SIGNATURES = 1000          # distinct failure signatures counted
REQUEST_TIMEOUT = 20.0         # seconds an ordinary answer may take
EVENTS_WINDOW = 0.06           # seconds GET /v1/events is read before closing
EVENTS_IDLE = 0.015            # ... or this long after its last byte
REPLY_RESERVE = 4096           # --reply-tokens default: max_context_tokens must exceed it

# The JSON Schema `type` of each error status (Error.error.type's description).
ERROR_TYPE_OF_STATUS = {400: "invalid_request_error", 413: "invalid_request_error",
                        414: "invalid_request_error", 422: "invalid_request_error",
                        431: "invalid_request_error", 401: "authentication_error",
                        403: "permission_error", 404: "not_found_error", 409: "conflict_error",
                        429: "rate_limit_error", 504: "timeout_error"}
# ErrorCode's description: the statuses each code comes with.
STATUS_OF_CODE = {
    "malformed": {400}, "unknown_field": {400}, "invalid_argument": {400}, "invalid_id": {400},
    "unauthorized": {401}, "permission_denied": {403}, "not_found": {404}, "conflict": {409},
    "exhausted": {409},
    "already_exists": {409}, "lease_lost": {409}, "too_large": {413, 414, 431},
    "idempotency_mismatch": {422}, "capacity_exceeded": {422}, "rate_limited": {429},
    "upstream_busy": {429},
    "storage_failure": {500},
    "io_failure": {500}, "internal": {500}, "upstream_failure": {502}, "unavailable": {503},
    "storage_unavailable": {503}, "not_owner": {503}, "timeout": {504}, "storage_full": {507},
}

# Refusals of a schema-valid request that the document states in prose (a rule
# the schemas cannot express); any other 4xx of a valid request is a failure.
# operationId -> {(status, code)}; 404 and 409 declared by an operation are
# accepted for valid requests (resources come and go).
SEMANTIC_REFUSALS = {
    "createThread": {(413, "too_large")},
    "updateThread": {(413, "too_large")},
    "copyThread": {(400, "invalid_argument")},
    "sendMessage": {(400, "invalid_argument"), (413, "too_large")},
    "streamMessage": {(400, "invalid_argument"), (413, "too_large")},
    "appendTurns": {(400, "invalid_argument"), (413, "too_large")},
    "buildContext": {(400, "invalid_argument"), (413, "too_large")},
    "addContextItem": {(422, "capacity_exceeded")},
    "createMemory": {(413, "too_large")},
    "listThreads": {(400, "invalid_argument")},
    "listMemoryEntries": {(400, "invalid_argument")},
    "claimTask": {(400, "invalid_argument")},
    "createSubtask": {(400, "invalid_id")},
    "createChatCompletion": {(400, "invalid_argument"), (413, "too_large")},
    "createTenant": {(413, "too_large")},     # 100000 tenants (never near in a run)
    "createKey": {(413, "too_large")},        # 1000 keys in the tenant (a long run's key tenant)
    # from after to (a `from` past now), a day that does not exist, `after`
    # without group_by or not a day with group_by=day; an `after` or a
    # thread_id that is no valid ID.
    "getUsage": {(400, "invalid_argument"), (400, "invalid_id")},
}

EVENT_TYPES = ["task.created", "task.claimed", "task.completed", "task.failed",
               "task.lease_expired", "task.stale", "task.retried", "task.requeued",
               "thread.created", "thread.turn_appended", "thread.cleared", "thread.forked",
               "thread.deleted", "task", "thread"]

# Valid requests of these operations are sent, at this rate, while a streamed
# message runs on their thread (cancel, on_conflict, delete and writes that wait).
BUSY_OPS = {"cancelMessage": 0.7, "sendMessage": 0.15, "streamMessage": 0.15,
            "createChatCompletion": 0.15, "deleteThread": 0.15, "appendTurns": 0.1,
            "clearTurns": 0.1, "copyThread": 0.1, "updateThread": 0.05, "buildContext": 0.05}

INVALID_KINDS = [
    # kind, weight
    ("drop_required", 10), ("wrong_type", 10), ("unknown_field", 10), ("out_of_bounds", 10),
    ("not_json", 6), ("not_object", 6), ("invalid_utf8", 3), ("bad_query", 10),
    ("bad_path", 6), ("bad_header", 5), ("auth_missing", 5), ("auth_wrong", 5),
    ("idem_mismatch", 4), ("body_too_large", 1), ("uri_too_long", 1), ("too_many_headers", 1),
    ("malformed_http", 1), ("wrong_method", 2), ("tenant_header", 5), ("wrong_principal", 5),
    ("default_tenant", 2),
]

# Who sends a request (docs/tenants.md, "Who a request acts for"): the server
# runs with --admin-token, so tenancy is on.
#   admin      the admin token; `Spindle-Tenant: default` on a route of a tenant's data
#   key        a key of the fuzzer's own tenant, every scope but keys:admin
#   admin@key  the admin token acting in that tenant (`Spindle-Tenant: <its id>`)
PRINCIPAL_WEIGHTS = (("admin", 0.7), ("key", 0.2), ("admin@key", 0.1))
MAX_LIVE_TENANTS = 300         # tenants the fuzzer made and did not delete (the server takes 100000)
# Limits on the model (docs/limits.md) that no run comes near, for the tenants
# the valid requests act in (`default` and the key's): their calls to the model
# are never refused or queued, and their answers carry x-ratelimit-* headers.
HARMLESS_LIMITS = {"requests_per_min": (10 ** 6, 10 ** 9), "tokens_per_min": (10 ** 10, 10 ** 12),
                   "concurrent_exchanges": (1000, 100000)}

# Thread IDs (components.parameters.ThreadId): a tenant's own clients may name an
# end user's thread USER~ID; in the tenant `default` (the admin token's `default`)
# there are no end users, so its thread IDs are drawn without `USER~`.
THREAD_PATTERN = r"^(?:(?!\.\.?~)[A-Za-z0-9._:@+-]{1,128}~)?(?!\.\.?$)[A-Za-z0-9._:-]{1,128}$"
PLAIN_THREAD_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9._:-]{1,128}$"

# Public keys of a JWK Set for PUT /v1/tenants/{id}/auth (RSA 2048 and P-256;
# their private halves were thrown away: no token is signed with them).
FUZZ_JWKS = {"keys": [
    {"kty": "RSA", "kid": "fuzz-rsa", "alg": "RS256", "use": "sig", "e": "AQAB",
     "n": "xjEY3iuaz36RSpDILoIUtRv7Kq6lBSsfdLnyh4gC2NW3xUun5eQcp7W5oxxOByvXVftrBUw8dE9mhDx4HGUhZQQGnVEJhRibBsuk"
          "wpsBUgc_7KaGfu3BqviltNyMLuA4HOXKsTw9INhBauo9v9HaW_nACffLFa2UnXZzDzdrptqWwqYMmSUhIpoyQAQzDTeyY8s10i2y"
          "Q0rOmCwTWJJ_mTuwOu2CJRbsJqVA0omFfMj3QXmjuBpWz3ZMLUq3gbPjm0BcmKijUe6Xhr9RMn3y2HPs39H2XUViUdxZUW_BTZTJ"
          "KaIlh52E21nxaWBmxKeV6QCbMb7OZ44INdZZHf5jMQ"},
    {"kty": "EC", "kid": "fuzz-ec", "crv": "P-256", "alg": "ES256",
     "x": "SIvSC84pyVcZzNeyuImbCu-dC7KM-bzpmMF_xgUZqq4", "y": "XYWMnqUiZcKlX-KIaHbCktWciir9Q1NiKnspda4LE6E"},
]}

# A JSON Web Token whose issuer no tenant accepts (its signature is made up):
# an end user's token refused with 401.
UNKNOWN_ISSUER_JWT = (
    base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode() + "." +
    base64.urlsafe_b64encode(b'{"iss":"https://no-such-issuer.fuzz.example","sub":"u1","exp":4102444800}')
    .rstrip(b"=").decode() + ".c2lnbmF0dXJlLW9mLW5vLWtleS1hdC1hbGwtMDEyMzQ1Njc4OWFiY2RlZg")


class GenError(Exception):
    """The generator could not draw a value for a schema."""


class Transport(Exception):
    """No HTTP answer: the connection failed, closed, or timed out."""


# --------------------------------------------------------------------------
# The document


class Operation:
    def __init__(self, spec, path, method, op):
        self.path = path
        self.method = method.upper()
        self.op = op
        self.id = op["operationId"]
        self.params = []   # (ref name or None, resolved parameter)
        for p in op.get("parameters", []):
            name = p["$ref"].rsplit("/", 1)[-1] if "$ref" in p else None
            self.params.append((name, spec.deref(p)))
        self.path_params = [(n, p) for n, p in self.params if p["in"] == "path"]
        self.query_params = [(n, p) for n, p in self.params if p["in"] == "query"]
        self.header_params = [(n, p) for n, p in self.params if p["in"] == "header"]
        self.body_schema = None
        self.body_required = False
        rb = op.get("requestBody")
        if rb:
            rb = spec.deref(rb)
            self.body_required = bool(rb.get("required"))
            media = rb.get("content", {}).get("application/json")
            if media is not None:
                self.body_schema = media.get("schema", {})
        self.responses = {}
        for st, r in op["responses"].items():
            self.responses[int(st)] = spec.deref(r)
        sec = op.get("security", spec.doc.get("security", []))
        self.secured = bool(sec) and any(bool(s) for s in sec)
        self.idempotent = any(p["name"] == "Idempotency-Key" for _, p in self.header_params)
        # A route of a tenant's data: the admin token must name a tenant there.
        self.tenant_data = any(p["name"] == "Spindle-Tenant" for _, p in self.header_params)
        # Who may send it with tenancy on (runtime/server/auth.cpp, rule_of).
        if not self.secured:
            self.access = "open"
        elif self.tenant_data:
            self.access = "tenant"
        elif path.startswith("/v1/keys/") or path.endswith("/keys") or path.endswith("/auth"):
            self.access = "tenant_admin"   # the admin token, or a key with keys:admin
        elif path in ("/v1/tokens/count", "/v1/me"):
            self.access = "any"            # any valid key
        else:
            self.access = "admin"          # the admin token only
        d400 = self.responses.get(400, {}).get("description", "")
        # "unknown_field`: another query parameter" or "a query parameter (the route takes none)"
        self.refuses_unknown_query = "query parameter" in d400 and "unknown_field" in d400
        self.rx = re.compile(re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(path)))

    def matches(self, path):
        return self.rx.fullmatch(path.split("?")[0]) is not None

    def __repr__(self):
        return "%s %s" % (self.method, self.path)


def load_contract(spec_path):
    """tests/openapi/contract.py's checker of answers, when it is there."""
    try:
        sys.path.insert(0, HERE)
        import contract
    except ImportError:
        return None
    finally:
        sys.path.remove(HERE)
    return contract.Contract(spec_path)


class Spec:
    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self._validators = collections.OrderedDict()   # id(schema) -> (validator, schema), LRU
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.resolver = RefResolver.from_schema(self.doc) if RefResolver else None
        self.ops = []
        for path, item in self.doc["paths"].items():
            for method in METHODS:
                if method in item:
                    self.ops.append(Operation(self, path, method, item[method]))
        info = self.doc["info"].get("description", "")
        # "Any request may be refused before it is routed: 400 `malformed` ..., 413 ...,
        # 414 ..., 431 ..., 503 `unavailable` ...; a path no route takes is 404"
        # (404 is the answer to a request no operation describes, not one of these.)
        self.prerouting = ({int(s) for s in re.findall(r"\b([45]\d\d)\b", info)} - {404}) or \
            {400, 413, 414, 431, 503}
        self.error_schema = {"$ref": "#/components/schemas/Error"}

    def deref(self, node, depth=0):
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not ref.startswith("#/"):
                raise ValueError("only local $refs are supported: %s" % ref)
            cur = self.doc
            for part in ref[2:].split("/"):
                cur = cur[part.replace("~1", "/").replace("~0", "~")]
            if len(node) > 1:   # siblings of $ref (2020-12): merge, the sibling wins
                merged = dict(cur)
                merged.update({k: v for k, v in node.items() if k != "$ref"})
                cur = merged
            node = cur
            depth += 1
            if depth > 50:
                raise ValueError("$ref loop at %s" % ref)
        return node

    def validator(self, schema):
        # Keyed by identity: the document's schemas live as long as the run, the
        # merged ones drawing and walking make are dropped with the oldest entries
        # (an entry keeps its schema alive, so no other object takes its id).
        key = id(schema)
        v = self._validators.get(key)
        if v is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                v = Draft202012Validator(schema, resolver=self.resolver)
            self._validators[key] = (v, schema)
            if len(self._validators) > 4096:
                self._validators.popitem(last=False)
            return v
        self._validators.move_to_end(key)
        return v[0]

    def errors(self, schema, instance, limit=3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = []
            for e in self.validator(schema).iter_errors(instance):
                where = "/".join(str(p) for p in e.absolute_path)
                out.append(("%s: %s" % (where or "(root)", e.message))[:300])
                if len(out) >= limit:
                    break
            return out

    def valid(self, schema, instance):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.validator(schema).is_valid(instance)


# --------------------------------------------------------------------------
# Values from schemas


class RegexGen:
    """Strings matching a regular expression, drawn from its parse tree."""

    def __init__(self):
        self._cache = {}
        self.substitute = {}   # pattern -> the pattern drawn from instead

    def parse(self, pattern):
        p = self._cache.get(pattern)
        if p is None:
            p = (sre_parse.parse(pattern), re.compile(pattern))
            self._cache[pattern] = p
        return p

    def generate(self, rng, pattern, min_len=0, max_len=None):
        tree, compiled = self.parse(self.substitute.get(pattern, pattern))
        for _ in range(200):
            s = self._seq(rng, tree)
            if compiled.search(s) and len(s) >= min_len and (max_len is None or len(s) <= max_len):
                return s
        raise GenError("cannot draw a string for /%s/" % pattern)

    def _count(self, rng, lo, hi):
        if hi == sre_c.MAXREPEAT:
            hi = lo + 8
        r = rng.random()
        if r < 0.1:
            return lo
        if r < 0.15:
            return hi
        if r < 0.75:
            return rng.randint(lo, min(hi, lo + 12))
        return rng.randint(lo, hi)

    def _class(self, rng, items):
        negate = False
        choices = []   # (lo, hi) code point ranges
        for op, av in items:
            if op is sre_c.NEGATE:
                negate = True
            elif op is sre_c.LITERAL:
                choices.append((av, av))
            elif op is sre_c.RANGE:
                choices.append(av)
            elif op is sre_c.CATEGORY:
                choices.extend(self._category(av))
            else:
                raise GenError("unsupported class item %s" % op)
        if negate:
            for _ in range(100):
                c = rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff)])
                if not any(lo <= c <= hi for lo, hi in choices):
                    return chr(c)
            raise GenError("cannot draw outside a class")
        total = sum(hi - lo + 1 for lo, hi in choices)
        k = rng.randrange(total)
        for lo, hi in choices:
            if k <= hi - lo:
                return chr(lo + k)
            k -= hi - lo + 1
        raise AssertionError

    @staticmethod
    def _category(cat):
        if cat is sre_c.CATEGORY_DIGIT:
            return [(0x30, 0x39)]
        if cat is sre_c.CATEGORY_WORD:
            return [(0x30, 0x39), (0x41, 0x5a), (0x61, 0x7a), (0x5f, 0x5f)]
        if cat is sre_c.CATEGORY_SPACE:
            return [(0x20, 0x20), (0x09, 0x0d)]
        if cat is sre_c.CATEGORY_NOT_DIGIT:
            return [(0x41, 0x5a), (0x61, 0x7a)]
        if cat is sre_c.CATEGORY_NOT_WORD:
            return [(0x21, 0x2f)]
        if cat is sre_c.CATEGORY_NOT_SPACE:
            return [(0x21, 0x7e)]
        raise GenError("unsupported category %s" % cat)

    def _seq(self, rng, tree):
        out = []
        for op, av in tree:
            if op is sre_c.LITERAL:
                out.append(chr(av))
            elif op is sre_c.NOT_LITERAL:
                c = av
                while c == av:
                    c = rng.randint(0x20, 0x7e)
                out.append(chr(c))
            elif op is sre_c.ANY:
                out.append(chr(rng.randint(0x20, 0x7e)))
            elif op is sre_c.IN:
                out.append(self._class(rng, av))
            elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) or \
                    op is getattr(sre_c, "POSSESSIVE_REPEAT", None):
                lo, hi, sub = av
                for _ in range(self._count(rng, lo, hi)):
                    out.append(self._seq(rng, sub))
            elif op is sre_c.SUBPATTERN:
                out.append(self._seq(rng, av[-1]))
            elif op is sre_c.BRANCH:
                out.append(self._seq(rng, rng.choice(av[1])))
            elif op in (sre_c.AT, sre_c.ASSERT, sre_c.ASSERT_NOT):
                pass    # anchors are implied; lookarounds are checked after drawing
            elif op is sre_c.CATEGORY:
                lo, hi = rng.choice(self._category(av))
                out.append(chr(rng.randint(lo, hi)))
            else:
                raise GenError("unsupported regex node %s" % op)
        return "".join(out)


ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz",
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ",
    "".join(chr(c) for c in range(0x20, 0x7f)),
    "\t\n\r \"\\/'<>&{}[]%$#@!\u0001\u001f\u007f",
    "äöüßéèçñ€£¥©®µ¶§°±²³½¼",
    "中文字符日本語한국어",
    "\U0001F600\U0001F4A9\U0001F680\u200b\u200d\ufeff\ufffd",
    "\u0000abc",
]


class Gen:
    """Draws JSON values that satisfy a JSON Schema of the document."""

    def __init__(self, spec, regex):
        self.spec = spec
        self.regex = regex

    # -- scalars
    def string(self, rng, s):
        s = s or {}
        mn = s.get("minLength", 0)
        mx = s.get("maxLength")
        if "pattern" in s:
            return self.regex.generate(rng, s["pattern"], mn, mx)
        r = rng.random()
        if r < 0.05:
            n = mn
        elif r < 0.08 and mx is not None:
            n = mx
        elif r < 0.85:
            n = rng.randint(mn, max(mn, min(mx if mx is not None else 24, 24)))
        elif r < 0.98:
            n = rng.randint(mn, max(mn, min(mx if mx is not None else 400, 400)))
        else:
            n = rng.randint(mn, max(mn, min(mx if mx is not None else 6000, 6000)))
        if rng.random() < 0.6:
            alpha = ALPHABETS[1]
        else:
            alpha = rng.choice(ALPHABETS)
        return "".join(rng.choice(alpha) for _ in range(n))

    def integer(self, rng, s):
        mn = s.get("minimum")
        mx = s.get("maximum")
        if "exclusiveMinimum" in s:
            mn = s["exclusiveMinimum"] + 1
        if "exclusiveMaximum" in s:
            mx = s["exclusiveMaximum"] - 1
        mn = int(math.ceil(mn)) if mn is not None else None
        mx = int(math.floor(mx)) if mx is not None else None
        lo = mn if mn is not None else -(2 ** 31)
        hi = mx if mx is not None else (2 ** 63 - 1 if s.get("format") == "int64" else 2 ** 31)
        r = rng.random()
        if r < 0.15 and mn is not None:
            return mn
        if r < 0.25 and mx is not None:
            return mx
        if r < 0.3:
            return hi if mx is None and rng.random() < 0.5 else lo
        if r < 0.8:
            base = max(lo, min(0, hi)) if mn is None else mn
            return min(hi, base + rng.randint(0, 20))
        return rng.randint(lo, hi)

    def number(self, rng, s):
        mn = s.get("minimum", -1e6)
        mx = s.get("maximum", 1e6)
        r = rng.random()
        if r < 0.15:
            return mn if isinstance(mn, int) else float(mn)
        if r < 0.25:
            return mx
        if r < 0.5:
            return rng.randint(int(math.ceil(mn)), int(math.floor(mx)))
        return round(rng.uniform(mn, mx), rng.choice([0, 1, 3, 6]))

    def any_json(self, rng, depth=0):
        r = rng.random()
        if depth > 2 or r < 0.5:
            return rng.choice([None, True, False, rng.randint(-1000, 10 ** 6),
                               rng.uniform(-1e3, 1e3), self.string(rng, {"maxLength": 30}),
                               "", 0, -1, 2 ** 53])
        if r < 0.75:
            return [self.any_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
        return {self.string(rng, {"maxLength": 10}): self.any_json(rng, depth + 1)
                for _ in range(rng.randint(0, 4))}

    # -- composite
    @staticmethod
    def merge(base, branch):
        out = dict(base)
        for k, v in branch.items():
            if k == "properties":
                props = dict(base.get("properties", {}))
                props.update(v)
                out["properties"] = props
            elif k == "required":
                out["required"] = sorted(set(base.get("required", [])) | set(v))
            elif k != "description":
                out[k] = v
        return out

    def value(self, rng, schema, depth=0):
        s = self.spec.deref(schema)
        if s is True or s == {} or (isinstance(s, dict) and set(s) <= {"description", "default", "examples", "title"}):
            return self.any_json(rng)
        if "const" in s:
            return copy.deepcopy(s["const"])
        if "enum" in s:
            return copy.deepcopy(rng.choice(s["enum"]))
        for comb in ("oneOf", "anyOf"):
            if comb in s:
                base = {k: v for k, v in s.items() if k not in (comb, "description")}
                for _ in range(20):
                    branch = self.spec.deref(rng.choice(s[comb]))
                    sub = self.merge(base, branch) if base else branch
                    v = self.value(rng, sub, depth)
                    if self.spec.valid(s, v):
                        return v
                raise GenError("no branch of %s fits" % comb)
        if "if" in s and "then" in s:
            # if/then: draw from the base, or from the base with `then` applied
            # (the caller validates the whole and draws again when it misses).
            base = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
            return self.value(rng, self.merge(base, self.spec.deref(s["then"])) if rng.random() < 0.5 else base, depth)
        t = s.get("type")
        if isinstance(t, list):
            ts = [x for x in t if x != "null"]
            t = "null" if ("null" in t and (not ts or rng.random() < 0.12)) else rng.choice(ts)
        if t is None:
            if "properties" in s or "required" in s or "additionalProperties" in s:
                t = "object"
            elif "items" in s or "prefixItems" in s:
                t = "array"
            elif "pattern" in s or "minLength" in s or "maxLength" in s:
                t = "string"
            else:
                return self.any_json(rng)
        if t == "null":
            return None
        if t == "boolean":
            return rng.random() < 0.5
        if t == "integer":
            return self.integer(rng, s)
        if t == "number":
            return self.number(rng, s)
        if t == "string":
            return self.string(rng, s)
        if t == "array":
            return self.array(rng, s, depth)
        if t == "object":
            return self.object(rng, s, depth)
        raise GenError("unsupported type %r" % t)

    def array(self, rng, s, depth):
        out = [self.value(rng, p, depth + 1) for p in s.get("prefixItems", [])]
        mn = max(s.get("minItems", 0) - len(out), 0)
        mx = s.get("maxItems")
        if mx is not None:
            mx = max(mx - len(out), 0)
        if "prefixItems" in s and "items" not in s:
            return out
        items = s.get("items", {})
        r = rng.random()
        if r < 0.02 and mx is not None and mx <= 1000:
            n = mx
        elif r < 0.1:
            n = mn
        else:
            hi = 4 if depth < 2 else 2
            n = rng.randint(mn, max(mn, min(hi, mx) if mx is not None else hi))
        return out + [self.value(rng, items, depth + 1) for _ in range(n)]

    def object(self, rng, s, depth):
        props = s.get("properties", {})
        req = set(s.get("required", []))
        maxp = s.get("maxProperties")
        out = {}
        p_opt = 0.5 if depth < 2 else 0.3
        for name, ps in props.items():
            if name in req or rng.random() < p_opt:
                out[name] = self.value(rng, ps, depth + 1)
        ap = s.get("additionalProperties", True)
        if ap is not False and maxp != 0:
            if isinstance(ap, dict) or not props:
                n = rng.choice([0, 0, 1, 2, 3])
            else:
                n = 1 if rng.random() < 0.1 else 0
            if maxp is not None:
                n = min(n, max(maxp - len(out), 0))
                if rng.random() < 0.03:
                    n = max(maxp - len(out), 0)
            pn = s.get("propertyNames", {})
            for _ in range(n):
                key = self.string(rng, pn) if pn else "x_" + self.string(rng, {"pattern": "^[a-z0-9_]{1,12}$"})
                if key in props:
                    continue
                out[key] = self.value(rng, ap, depth + 1) if isinstance(ap, dict) else self.any_json(rng, 1)
        return out

    def draw(self, rng, schema, tries=30):
        """A value valid against `schema`."""
        last = None
        for _ in range(tries):
            v = self.value(rng, schema)
            if self.spec.valid(schema, v):
                return v
            last = v
        raise GenError("drew no valid value; last %r: %s" % (
            last, self.spec.errors(schema, last)))


# --------------------------------------------------------------------------
# Walking a value along its schema (for mutations)


def schema_type_set(spec, s):
    s = spec.deref(s)
    if "const" in s:
        return {json_type(s["const"])}
    if "enum" in s:
        return {json_type(v) for v in s["enum"]}
    t = s.get("type")
    if t is None:
        for comb in ("oneOf", "anyOf"):
            if comb in s:
                out = set()
                for b in s[comb]:
                    bt = schema_type_set(spec, b)
                    if bt is None:
                        return None
                    out |= bt
                return out
        return None
    return set(t) if isinstance(t, list) else {t}


def json_type(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def walk(spec, value, schema, path=()):
    """Yields (path, value, schema) for the value and every part of it whose schema is known."""
    s = spec.deref(schema)
    for comb in ("oneOf", "anyOf"):
        if comb in s:
            base = {k: v for k, v in s.items() if k not in (comb, "description")}
            for b in s[comb]:
                sub = Gen.merge(base, spec.deref(b)) if base else spec.deref(b)
                if spec.valid(sub, value):
                    s = sub
                    break
            else:
                yield path, value, s
                return
            break
    yield path, value, s
    if isinstance(value, dict):
        props = s.get("properties", {})
        ap = s.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                yield from walk(spec, v, props[k], path + (k,))
            elif isinstance(ap, dict):
                yield from walk(spec, v, ap, path + (k,))
    elif isinstance(value, list):
        pre = s.get("prefixItems", [])
        for i, v in enumerate(value):
            if i < len(pre):
                yield from walk(spec, v, pre[i], path + (i,))
            elif "items" in s:
                yield from walk(spec, v, s["items"], path + (i,))


def set_at(root, path, value):
    if not path:
        return value
    cur = root
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return root


def del_at(root, path):
    cur = root
    for p in path[:-1]:
        cur = cur[p]
    del cur[path[-1]]
    return root


def fmt_path(path):
    out = ""
    for p in path:
        out += "[%d]" % p if isinstance(p, int) else ("." + p if out else p)
    return out or "(body)"


# --------------------------------------------------------------------------
# HTTP


class Response:
    def __init__(self, status, reason, headers, body, events=None, elapsed=0.0, closed=False, retry=None,
                 complete=True):
        self.status = status
        self.reason = reason
        self.headers = headers          # list of (lower name, value)
        self.body = body
        self.events = events            # list of (name, data text, id) for event streams
        self.elapsed = elapsed
        self.closed = closed            # the server closed the connection after it
        self.retry = retry              # an event stream's `retry:` field
        self.complete = complete        # False: an endless stream read for a while

    def header(self, name):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def media_type(self):
        ct = self.header("content-type")
        return ct.split(";")[0].strip().lower() if ct else None


class SSEParser:
    def __init__(self):
        self.buf = b""
        self.events = []
        self.data = []
        self.name = None
        self.last_id = None
        self.retry = None

    def feed(self, chunk):
        self.buf += chunk
        while True:
            m = re.search(rb"\r\n|\n|\r", self.buf)
            if not m or (m.group() == b"\r" and m.end() == len(self.buf)):
                return
            line, self.buf = self.buf[:m.start()], self.buf[m.end():]
            self.line(line.decode("utf-8", "replace"))

    def line(self, line):
        if line == "":
            if self.data:
                self.events.append((self.name or "message", "\n".join(self.data), self.last_id))
            self.data = []
            self.name = None
            return
        if line.startswith(":"):
            return
        field, _, val = line.partition(":")
        if val.startswith(" "):
            val = val[1:]
        if field == "data":
            self.data.append(val)
        elif field == "event":
            self.name = val
        elif field == "id":
            self.last_id = val
        elif field == "retry":
            self.retry = val


class Conn:
    """One HTTP/1.1 connection, kept alive between requests."""

    def __init__(self, host, port):
        self.host = host
        self.port = port
        self.sock = None
        self.buf = b""
        self.used = False

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self.buf = b""
        self.used = False

    def _connect(self):
        self.sock = socket.create_connection((self.host, self.port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.used = False

    def _fill(self, deadline):
        """Reads more bytes; False at EOF. Raises TimeoutError past the deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        r, _, _ = select.select([self.sock], [], [], left)
        if not r:
            raise TimeoutError
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            return False
        if not data:
            return False
        self.buf += data
        return True

    def _line(self, deadline):
        while b"\r\n" not in self.buf:
            if not self._fill(deadline):
                raise Transport("connection closed mid-answer")
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n, deadline):
        while len(self.buf) < n:
            if not self._fill(deadline):
                raise Transport("connection closed mid-body")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def request(self, raw, method, timeout, stream_window=None, stream_idle=None):
        """Sends raw request bytes and reads the answer. `stream_window`: read an
        event stream that never ends for that long, then close the connection."""
        for attempt in (0, 1):
            if self.sock is None:
                self._connect()
            reused = self.used
            t0 = time.monotonic()
            deadline = t0 + timeout
            try:
                self.sock.sendall(raw)
            except (BrokenPipeError, ConnectionResetError) as e:
                # The server may answer early (413, 431) and close while we still send.
                if not self._peek_answer(deadline):
                    self.close()
                    if reused and attempt == 0:
                        continue
                    raise Transport("sending failed: %s" % e)
            try:
                return self._answer(method, t0, deadline, stream_window, stream_idle)
            except _Unanswered:
                self.close()
                if reused and attempt == 0:
                    continue   # a kept-alive connection the server had closed
                raise Transport("connection closed without an answer")
            except TimeoutError:
                self.close()
                raise Transport("no answer within %.0f s" % timeout)

    def _peek_answer(self, deadline):
        try:
            return self._fill(min(deadline, time.monotonic() + 2))
        except (TimeoutError, OSError):
            return False

    def _answer(self, method, t0, deadline, stream_window, stream_idle):
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline):
                if self.buf:
                    raise Transport("connection closed mid-head: %r" % self.buf[:200])
                raise _Unanswered()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/1\.[01] (\d{3})(?: (.*))?$", lines[0])
        if not m:
            raise Transport("bad status line %r" % lines[0][:200])
        status = int(m.group(1))
        if 100 <= status < 200:   # 100 Continue: the answer follows
            return self._answer(method, t0, deadline, stream_window, stream_idle)
        headers = []
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers.append((k.strip().lower(), v.strip()))
        hd = dict(headers)
        self.used = True
        closing = hd.get("connection", "").lower() == "close"
        ctype = hd.get("content-type", "").split(";")[0].strip().lower()
        sse = ctype == "text/event-stream"
        parser = SSEParser() if sse else None
        body = b""
        ended = True
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            pass
        elif "chunked" in hd.get("transfer-encoding", "").lower():
            parts = []
            win_end = t0 + stream_window if stream_window else None
            last_byte = time.monotonic()
            try:
                while True:
                    dl = deadline
                    if win_end is not None:
                        dl = min(win_end, last_byte + stream_idle if parser.events else win_end)
                    size_line = self._line(dl)
                    size = int(size_line.split(b";")[0].strip(), 16)
                    if size == 0:
                        while self._line(dl) != b"":
                            pass
                        break
                    chunk = self._exact(size, dl)
                    self._exact(2, dl)
                    last_byte = time.monotonic()
                    parts.append(chunk)
                    if parser:
                        parser.feed(chunk)
            except TimeoutError:
                if win_end is None:
                    raise
                ended = False   # an endless stream, read for its window
            body = b"".join(parts)
        elif "content-length" in hd:
            body = self._exact(int(hd["content-length"]), deadline)
            if parser:
                parser.feed(body)
        else:
            parts = [self.buf]
            self.buf = b""
            try:
                while self._fill(deadline):
                    parts.append(self.buf)
                    self.buf = b""
            except TimeoutError:
                if not stream_window:
                    raise
            body = b"".join(parts)
            if parser:
                parser.feed(body)
            closing = True
        if parser and ended:
            parser.feed(b"\n\n" if parser.buf or parser.data else b"")
        if closing or not ended:
            self.close()
        return Response(status, m.group(2) or "", headers, body,
                        events=parser.events if parser else None,
                        retry=parser.retry if parser else None, complete=ended,
                        elapsed=time.monotonic() - t0, closed=closing)


class _Unanswered(Exception):
    pass


class _Recorded(Conn):
    """Parses an answer already read whole (a side stream's bytes)."""

    def __init__(self, data):
        super().__init__(None, None)
        self.buf = data

    def _fill(self, deadline):
        return False


class SideStream:
    """A streamed message kept running on a connection of its own while other
    requests are sent: it keeps its thread busy (cancel, on_conflict, delete)."""

    def __init__(self, port, raw):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(raw)
        self.data = b""
        self.t0 = time.monotonic()
        self.eof = False

    def _read(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0 or self.eof:
            return False
        r, _, _ = select.select([self.sock], [], [], left)
        if not r:
            return False
        try:
            d = self.sock.recv(65536)
        except OSError:
            d = b""
        if not d:
            self.eof = True
            return False
        self.data += d
        return True

    def wait_for(self, token, timeout):
        deadline = time.monotonic() + timeout
        while token not in self.data and self._read(deadline):
            pass
        return token in self.data

    def finish(self, timeout):
        """Reads to the end (the request asked for Connection: close)."""
        deadline = time.monotonic() + timeout
        while self._read(deadline):
            pass
        timed_out = not self.eof
        try:
            self.sock.close()
        except OSError:
            pass
        if timed_out:
            raise Transport("the stream did not end within %.0f s" % timeout)
        return _Recorded(self.data)._answer("POST", self.t0, time.monotonic() + 1, None, None)


class Request:
    def __init__(self, op, kind, method, path, query=None, headers=None, body=None):
        self.op = op
        self.kind = kind          # "valid", "replay" or an invalid kind
        self.method = method
        self.path = path          # already percent-encoded
        self.query = query or []  # [(name, value)] unencoded
        self.headers = headers if headers is not None else {}
        self.body = body          # bytes or None
        self.note = ""            # what an invalid request breaks
        self.expect = None        # for invalid ones: {"status": {...}, "code": ..., "param": ...}
        self.raw_target = None    # overrides path+query (uri_too_long)
        self.extra_headers = []   # (name, value) sent besides `headers`
        self.ids = {}             # pool facts: {"live": bool, ...}
        self.json_body = None     # the JSON value of the body, when it is one
        self.chunked = False      # send the body with Transfer-Encoding: chunked
        self.raw_override = None  # bytes sent instead (a request that is not HTTP)
        self.principal = "admin"  # whose pools it was drawn from (PRINCIPAL_WEIGHTS)

    def target(self):
        if self.raw_target is not None:
            return self.raw_target
        if not self.query:
            return self.path
        return self.path + "?" + urllib.parse.urlencode(self.query, quote_via=urllib.parse.quote)

    def raw(self, host):
        lines = ["%s %s HTTP/1.1" % (self.method, self.target()), "Host: %s" % host]
        for k, v in self.headers.items():
            lines.append("%s: %s" % (k, v))
        for k, v in self.extra_headers:
            lines.append("%s: %s" % (k, v))
        body = self.body
        if self.raw_override is not None:
            return self.raw_override
        if body is not None and self.chunked:
            lines.append("Transfer-Encoding: chunked")
            parts = []
            for i in range(0, len(body), 97):
                piece = body[i:i + 97]
                parts.append(b"%x\r\n%s\r\n" % (len(piece), piece))
            body = b"".join(parts) + b"0\r\n\r\n"
        elif body is not None:
            lines.append("Content-Length: %d" % len(body))
        elif self.method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        return head + (body or b"")

    def curl(self, base):
        parts = ["curl", "-sS", "-i", "-X", self.method, base + self.target()]
        for k, v in self.headers.items():
            parts += ["-H", "%s: %s" % (k, v)]
        if len(self.extra_headers) > 5:
            cmd = " ".join(shlex.quote(p) for p in parts)
            return cmd + " $(for i in $(seq %d); do printf -- '-H X-Fuzz-%%d:x ' $i; done)" % len(self.extra_headers)
        for k, v in self.extra_headers:
            parts += ["-H", "%s: %s" % (k, v)]
        if self.raw_override is not None:
            return "printf '%s' | nc -q 2 HOST PORT" % "".join(
                "\\x%02x" % b if b < 0x20 or b > 0x7e or b in b"'%\\" else chr(b) for b in self.raw_override)
        if self.chunked:
            parts += ["-H", "Transfer-Encoding: chunked"]
        if self.body is not None and "Content-Type" not in self.headers:
            parts += ["-H", "Content-Type:"]
        if self.body is None:
            return " ".join(shlex.quote(p) for p in parts)
        if len(self.body) > 4096:
            return (" ".join(shlex.quote(p) for p in parts) +
                    " --data-binary @body.bin   # body: %d bytes, starts %r" % (len(self.body), self.body[:80]))
        try:
            text = self.body.decode("utf-8")
            if "\x00" in text:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "nul")
            return " ".join(shlex.quote(p) for p in parts + ["--data-binary", text])
        except UnicodeDecodeError:
            esc = "".join("\\x%02x" % b for b in self.body)
            return "printf '%s' | " % esc + " ".join(shlex.quote(p) for p in parts + ["--data-binary", "@-"])

    def describe(self):
        body = None
        if self.body is not None:
            body = self.body[:2000].decode("utf-8", "backslashreplace")
            if len(self.body) > 2000:
                body += "... (%d bytes)" % len(self.body)
        return {"method": self.method, "target": self.target()[:3000],
                "headers": dict(self.headers), "extra_headers": len(self.extra_headers),
                "body": body}


# --------------------------------------------------------------------------
# The server


class Server:
    def __init__(self, binary, token, workdir):
        self.binary = binary
        self.token = token
        self.workdir = workdir
        self.proc = None
        self.port = None
        self.out_path = os.path.join(workdir, "server.stdout")
        self.err_path = os.path.join(workdir, "server.stderr")

    def start(self):
        out = open(self.out_path, "wb")
        err = open(self.err_path, "wb")

        def child_setup():
            try:  # die with the fuzzer, even when it is killed outright
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
            except Exception:
                pass

        self.proc = subprocess.Popen(
            [self.binary, "serve", "--port", "0", "--bind", "127.0.0.1", "--admin-token", self.token,
             "--data", ":memory:", "--log-level", "warn", "--llm", "offline",
             "--idempotency-retention", "600", "--llm-delta-delay-ms", "2"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, preexec_fn=child_setup)
        out.close()
        err.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(self.out_path, "rb") as f:
                m = re.search(rb"serving on http://[^\s:]+:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                raise RuntimeError("spindle serve exited with %s: %s" % (self.proc.returncode, self.stderr_tail()))
            time.sleep(0.02)
        raise RuntimeError("spindle serve did not say its port within 30 s")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self, n=4000):
        try:
            with open(self.err_path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - n))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        """SIGTERM, then SIGKILL after 15 s; returns the exit status (None if killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


# --------------------------------------------------------------------------
# The fuzzer


class Pools:
    """IDs that exist on the server (bounded, most recent kept)."""

    def __init__(self):
        self.threads = collections.deque(maxlen=48)
        self.thread_turns = {}                        # thread -> completed turns seen
        self.gone_threads = collections.deque(maxlen=16)
        self.orchestrations = collections.deque(maxlen=32)
        self.tasks = collections.deque(maxlen=64)
        self.leases = collections.deque(maxlen=32)    # (task, token)
        self.memories = collections.deque(maxlen=48)  # ids
        self.memory_users = collections.deque(maxlen=16)
        self.event_ids = collections.deque(maxlen=32)
        self.thread_cursors = collections.deque(maxlen=8)  # (cursor, filters)
        self.memory_cursors = collections.deque(maxlen=8)  # (cursor, scope)
        self.idem = collections.defaultdict(lambda: collections.deque(maxlen=6))  # op -> [(key, Request, Response)]
        self.console_files = []
        self.etags = {}
        self.call_seq = 0

    def add_thread(self, tid, turns=None):
        if not tid:
            return
        if tid in self.threads:
            self.threads.remove(tid)
        self.threads.append(tid)
        if turns is not None:
            self.thread_turns[tid] = turns
        if len(self.thread_turns) > 256:
            keep = set(self.threads)
            self.thread_turns = {k: v for k, v in self.thread_turns.items() if k in keep}

    def drop_thread(self, tid):
        try:
            self.threads.remove(tid)
        except ValueError:
            pass
        self.thread_turns.pop(tid, None)
        self.gone_threads.append(tid)


class Tenancy:
    """Tenants and keys the fuzzer made (server-wide, not a principal's)."""

    def __init__(self):
        self.live = collections.OrderedDict()        # tenant id -> name, made and not deleted
        self.gone = collections.deque(maxlen=16)     # tenant ids deleted
        self.keys = collections.OrderedDict()        # key id -> (tenant, secret), not revoked
        self.revoked = collections.deque(maxlen=16)  # key ids revoked
        self.revoked_secrets = collections.deque(maxlen=16)
        self.key_tenant = None                       # the tenant whose key the fuzzer acts with
        self.key_tenant_name = None
        self.key_secret = None
        self.key_id = None
        self.names = 0                               # makes tenant names unique
        self.issuers = {}                            # tenant id -> the issuer of its end users' tokens

    def add_key(self, kid, tenant, secret):
        if kid == self.key_id:
            return
        self.keys[kid] = (tenant, secret)
        while len(self.keys) > 256:   # forgotten, not revoked: a tenant holds at most 1000
            self.keys.popitem(last=False)

    def revoke_key(self, kid):
        got = self.keys.pop(kid, None)
        self.revoked.append(kid)
        if got is not None:
            self.revoked_secrets.append(got[1])

    def drop_tenant(self, tid):
        self.live.pop(tid, None)
        self.issuers.pop(tid, None)
        self.gone.append(tid)
        for kid in [k for k, (t, _) in self.keys.items() if t == tid]:
            self.revoke_key(kid)   # deleting a tenant revokes its keys


class Stats:
    def __init__(self, ops):
        self.total = 0
        self.setup = 0
        self.per_status = collections.Counter()
        self.per_kind = collections.Counter()
        self.per_op = {op.id: {"method": op.method, "path": op.path, "requests": 0, "valid": 0,
                               "invalid": 0, "status": collections.Counter(),
                               "valid_2xx": 0, "seconds": 0.0} for op in ops}
        self.overload = collections.Counter()    # "503 getThread" -> n
        self.failures = []
        self.failure_count = 0
        self.signatures = collections.Counter()
        self.events_seen = collections.Counter()
        self.replays = 0
        self.aux = 0
        self.valid_refused = collections.Counter()
        self.refused_example = {}
        self.busy = collections.Counter()
        self.per_principal = collections.Counter()


class Fuzzer:
    def __init__(self, spec, server, seed, log):
        self.spec = spec
        self.server = server
        self.seed = seed
        self.log = log
        self.gen = Gen(spec, RegexGen())
        # Each tenant its own pools: another tenant's thread is a missing one.
        self.pools_of = {"default": Pools(), "key": Pools()}
        self.principal = "admin"
        self.pools = self.pools_of["default"]
        self.ten = Tenancy()
        self.stats = Stats(spec.ops)
        self.conn = None
        self.base = None
        self.host = None
        self.ops_by_id = {op.id: op for op in spec.ops}
        self.fatal = None
        self.current_i = -1
        self.trace = None
        self.contract = load_contract(spec.path)
        self.jwks_file = None

    # -- plumbing
    def connect(self):
        self.host = "127.0.0.1:%d" % self.server.port
        self.base = "http://" + self.host
        self.conn = Conn("127.0.0.1", self.server.port)

    def use(self, principal):
        """Draw and learn as `principal`, from its tenant's pools."""
        if principal != "admin" and not self.ten.key_secret:
            principal = "admin"   # the setup could not make the key: the admin token only
        self.principal = principal
        self.pools = self.pools_of["default" if principal == "admin" else "key"]
        # The tenant `default` has no end users: no USER~ID thread IDs there.
        self.gen.regex.substitute = {THREAD_PATTERN: PLAIN_THREAD_PATTERN} if principal == "admin" else {}
        return principal

    def auth(self, op=None, principal=None):
        """The headers that authenticate a valid request of `op` as `principal`."""
        principal = principal or self.principal
        if principal == "key" and self.ten.key_secret:
            return {"Authorization": "Bearer " + self.ten.key_secret}
        h = {"Authorization": "Bearer " + self.server.token}
        if op is not None and op.tenant_data:
            h["Spindle-Tenant"] = self.ten.key_tenant if principal == "admin@key" else "default"
        return h

    def pick_principal(self, i, op):
        if op.access not in ("tenant", "any") or not self.ten.key_secret:
            return "admin"
        r = random.Random((self.seed * 7919 + i) ^ 0x7E4A47).random()
        for name, w in PRINCIPAL_WEIGHTS:
            if r < w:
                break
            r -= w
        if op.access == "any" and name == "admin@key":
            name = "key"
        return name

    def send(self, req, timeout=REQUEST_TIMEOUT):
        raw = req.raw(self.host)
        if req.op.id == "subscribeEvents":
            c = Conn("127.0.0.1", self.server.port)   # an endless stream: a connection of its own
            try:
                return c.request(raw, req.method, timeout, stream_window=EVENTS_WINDOW,
                                 stream_idle=EVENTS_IDLE)
            finally:
                c.close()
        return self.conn.request(raw, req.method, timeout)

    def fail(self, req, problem, resp=None):
        st = self.stats
        st.failure_count += 1
        sig = "%s %s %s: %s" % (req.op.id, req.kind, resp.status if resp else "-",
                                re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+", "N", problem)[:160])
        if sig not in st.signatures and len(st.signatures) >= MAX_SIGNATURES:
            sig = "(other)"
        st.signatures[sig] += 1
        if len(st.failures) < MAX_FAILURES_KEPT and st.signatures[sig] <= 3:
            entry = {"operation": req.op.id, "kind": req.kind, "note": req.note,
                     "problem": problem, "request": req.describe(), "curl": req.curl(self.base)}
            if resp is not None:
                entry["status"] = resp.status
                entry["response_headers"] = dict(resp.headers)
                entry["response_body"] = resp.body[:1500].decode("utf-8", "backslashreplace")
            st.failures.append(entry)
            self.log("FAIL %s [%s] %s\n  %s" % (req.op.id, req.kind, problem, entry["curl"][:600]))

    # -- pools from answers
    def learn(self, req, resp):
        if resp is None or resp.status >= 300:
            return
        p = self.pools
        opid = req.op.id
        body = None
        if resp.media_type() == "application/json" and resp.body:
            try:
                body = json.loads(resp.body)
            except ValueError:
                return
        if opid in ("createThread", "copyThread") and isinstance(body, dict):
            p.add_thread(body.get("thread_id"), body.get("turns"))
        elif opid == "updateThread" and isinstance(body, dict):
            p.add_thread(body.get("thread_id"), body.get("turns"))
        elif opid == "getThread" and isinstance(body, dict):
            p.thread_turns[body.get("thread_id")] = body.get("turns")
        elif opid == "sendMessage" and isinstance(body, dict):
            p.add_thread(body.get("thread_id"), body.get("turns"))
        elif opid == "streamMessage" and resp.events:
            for name, data, _ in resp.events:
                if name in ("done", "cancelled"):
                    try:
                        d = json.loads(data)
                        p.add_thread(d["thread_id"], d.get("turns"))
                    except (ValueError, KeyError, TypeError):
                        pass
        elif opid == "createChatCompletion":
            tid = resp.header("spindle-thread-id")
            if tid:
                p.add_thread(tid)
        elif opid == "deleteThread" and resp.status == 204:
            p.drop_thread(urllib.parse.unquote(req.path.rsplit("/", 1)[-1]))
        elif opid == "clearTurns":
            p.thread_turns[urllib.parse.unquote(req.path.split("/")[3])] = 0
        elif opid == "appendTurns" and isinstance(body, dict):
            p.thread_turns[body.get("thread_id")] = body.get("turns")
        elif opid in ("createOrchestration", "issueId") and isinstance(body, dict):
            i = body.get("id", "")
            if re.fullmatch(r"[0-9A-Z]{4}", i or "") and opid == "createOrchestration":
                p.orchestrations.append(i)
                p.tasks.append(i)
        elif opid == "createSubtask" and isinstance(body, dict):
            p.tasks.append(body.get("id"))
        elif opid in ("claimTask", "heartbeatTask") and isinstance(body, dict) and "lease" in body:
            p.leases.append((body["id"], body["lease"]["token"]))
        elif opid == "createMemory" and isinstance(body, dict):
            p.memories.append(body.get("id"))
        elif opid == "deleteMemory":
            try:
                p.memories.remove(int(req.path.rsplit("/", 1)[-1]))
            except ValueError:
                pass
        elif opid == "listThreads" and isinstance(body, dict) and body.get("next_cursor"):
            filters = [(k, v) for k, v in req.query if k != "cursor"]
            p.thread_cursors.append((body["next_cursor"], filters))
        elif opid == "listMemoryEntries" and isinstance(body, dict) and body.get("next_cursor"):
            scope = [(k, v) for k, v in req.query if k in ("user_id", "thread_id")]
            p.memory_cursors.append((body["next_cursor"], scope))
        elif opid == "subscribeEvents" and resp.events:
            for name, _, eid in resp.events:
                if eid:
                    p.event_ids.append(eid)
        elif opid == "createTenant" and isinstance(body, dict) and body.get("id"):
            self.ten.live[body["id"]] = body.get("name")
        elif opid == "updateTenant" and isinstance(body, dict) and body.get("id") in self.ten.live:
            self.ten.live[body["id"]] = body.get("name")
        elif opid == "updateTenant" and isinstance(body, dict) and body.get("id") == self.ten.key_tenant:
            self.ten.key_tenant_name = body.get("name")
        elif opid == "deleteTenant" and isinstance(body, dict) and body.get("id"):
            self.ten.drop_tenant(body["id"])
        elif opid == "createKey" and isinstance(body, dict) and body.get("id"):
            self.ten.add_key(body["id"], body.get("tenant"), body.get("key"))
        elif opid == "revokeKey" and isinstance(body, dict) and body.get("id"):
            self.ten.revoke_key(body["id"])
        elif opid == "setTenantAuth" and isinstance(body, dict) and body.get("tenant"):
            self.ten.issuers[body["tenant"]] = body.get("issuer")
        elif opid == "deleteTenantAuth" and isinstance(body, dict) and body.get("tenant"):
            self.ten.issuers.pop(body["tenant"], None)
        elif opid in ("getConsole", "getConsoleFile"):
            et = resp.header("etag")
            if et:
                p.etags[req.path] = et
                if len(p.etags) > 64:
                    p.etags.pop(next(iter(p.etags)))
        if req.op.idempotent and "Idempotency-Key" in req.headers and 200 <= resp.status < 300 \
                and req.kind == "valid":
            p.idem[opid].append((req.headers["Idempotency-Key"], req, resp, time.monotonic()))

    # -- checking answers
    def check(self, req, resp):
        op = req.op
        st = resp.status
        problems = []
        if req.kind == "wrong_method":   # no operation describes it: 404 not_found
            if st != 404 and st not in self.spec.prerouting:
                problems.append("%s %s (no operation) got %d, not 404" % (req.method, req.path, st))
            try:
                err = json.loads(resp.body)
            except ValueError:
                err = None
            problems += ["404 body: " + e for e in self.spec.errors(self.spec.error_schema, err)]
            return problems + self.check_error(resp, err)
        declared = st in op.responses
        if st >= 500:
            if st in (503, 504) and declared:
                self.stats.overload["%d %s" % (st, op.id)] += 1
            else:
                problems.append("server error %d%s" % (st, "" if declared else " (not declared)"))
        if not declared and st not in self.spec.prerouting:
            problems.append("status %d is not declared for %s %s" % (st, op.method, op.path))
        rspec = op.responses.get(st)
        if rspec is None and st in self.spec.prerouting:
            rspec = {"content": {"application/json": {"schema": self.spec.error_schema}}}
        err = None
        if rspec is not None:
            problems += self.check_body(req, resp, rspec)
            problems += self.check_headers(resp, rspec)
        if st >= 400 and resp.media_type() == "application/json":
            try:
                err = json.loads(resp.body)
            except ValueError:
                err = None
            problems += self.check_error(resp, err)
        if not problems and self.contract is not None and req.raw_override is None:
            # The project's shared rules (tests/openapi/contract.py) as a cross-check.
            for p in self.contract.check(req.method, req.target(), st, resp.header("content-type") or "",
                                         resp.headers, resp.body, streamed=resp.events is not None,
                                         complete=resp.complete):
                problems.append("contract.py: " + p)
        code = err["error"].get("code") if isinstance(err, dict) and isinstance(err.get("error"), dict) else None
        tlen = len(req.target().encode("utf-8"))
        if tlen > 8192 + 256 or st == 414:
            # Refused before routing whatever else the request holds (info.description).
            if tlen > 8192 + 256 and st != 414:
                problems.append("a request target of %d bytes (over 8 KiB) was not refused with 414" % tlen)
            elif st == 414 and tlen <= 8192 - 256:
                problems.append("414 for a request target of only %d bytes" % tlen)
            elif st == 414 and not resp.closed:
                problems.append("a refusal before routing without Connection: close")
            return problems
        if req.kind in ("valid", "replay"):
            if 400 <= st < 500:
                allowed = SEMANTIC_REFUSALS.get(op.id, set())
                if st in (404, 409) and declared:
                    pass
                elif (st, code) in allowed:
                    key = "%s %d %s" % (op.id, st, code)
                    self.stats.valid_refused[key] += 1
                    if key not in self.stats.refused_example:
                        msg = err.get("error", {}).get("message", "") if isinstance(err, dict) else ""
                        self.stats.refused_example[key] = msg[:200]
                else:
                    problems.append("a request valid by the document was refused: %d %s: %s" % (
                        st, code, (err or {}).get("error", {}).get("message", "")[:300]
                        if isinstance(err, dict) else resp.body[:200]))
        else:
            exp = req.expect or {}
            if not 400 <= st < 500:
                problems.append("an invalid request (%s: %s) was not refused with a 4xx but %d" % (
                    req.kind, req.note, st))
            elif "status" in exp and st not in exp["status"]:
                problems.append("an invalid request (%s: %s) got %d, expected %s" % (
                    req.kind, req.note, st, "/".join(map(str, sorted(exp["status"])))))
            elif exp.get("code") and st == 400 and code not in exp["code"]:
                problems.append("an invalid request (%s: %s) got 400 %s, expected %s" % (
                    req.kind, req.note, code, "/".join(sorted(exp["code"]))))
            elif st in exp.get("code_of", {}) and code not in exp["code_of"][st]:
                problems.append("an invalid request (%s: %s) got %d %s, expected %s" % (
                    req.kind, req.note, st, code, "/".join(sorted(exp["code_of"][st]))))
            elif exp.get("param") and isinstance(err, dict) and st in exp.get("status", {400}) and \
                    err.get("error", {}).get("param") != exp["param"]:
                problems.append("an invalid request (%s: %s) got param %r, expected %r" % (
                    req.kind, req.note, err.get("error", {}).get("param"), exp["param"]))
            if exp.get("close") and not resp.closed:
                problems.append("a refusal before routing without Connection: close")
        return problems

    def check_error(self, resp, err):
        if not isinstance(err, dict) or not isinstance(err.get("error"), dict):
            return ["an error answer that is no Error object"]
        e = err["error"]
        out = []
        want = ERROR_TYPE_OF_STATUS.get(resp.status, "api_error" if resp.status >= 500 else None)
        if want and e.get("type") is not None and e.get("type") != want and resp.status != 500:
            out.append("error type %r with status %d (the document says %r)" % (e.get("type"), resp.status, want))
        sts = STATUS_OF_CODE.get(e.get("code"))
        if sts and resp.status not in sts:
            out.append("error code %r with status %d (the document says %s)" % (
                e.get("code"), resp.status, "/".join(map(str, sorted(sts)))))
        return out

    def check_headers(self, resp, rspec):
        out = []
        for name, h in (rspec.get("headers") or {}).items():
            h = self.spec.deref(h)
            v = resp.header(name)
            if v is None:
                if h.get("required"):
                    out.append("required header %s missing" % name)
                continue
            if "schema" in h:
                errs = self.spec.errors(h["schema"], v)
                if errs:
                    out.append("header %s: %r: %s" % (name, v, errs[0]))
        return out

    def check_body(self, req, resp, rspec):
        content = rspec.get("content")
        mt = resp.media_type()
        if not content:
            if resp.body:
                return ["a body (%d bytes) where the document declares none" % len(resp.body)]
            return []
        if mt not in content:
            if not resp.body and req.method == "HEAD":
                return []
            return ["media type %r is not declared (%s)" % (mt, ", ".join(content))]
        media = content[mt]
        schema = media.get("schema", {})
        if mt == "application/json" or mt.endswith("+json"):
            try:
                value = json.loads(resp.body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                return ["body is not JSON: %s: %r" % (e, resp.body[:200])]
            errs = self.spec.errors(schema, value)
            return ["body does not match the schema: " + "; ".join(errs)] if errs else []
        if mt == "text/event-stream":
            return self.check_events(req, resp, media)
        try:
            text = resp.body.decode("utf-8")
        except UnicodeDecodeError:
            return ["a %s body that is not UTF-8" % mt]
        errs = self.spec.errors(schema, text)
        return ["body does not match the schema: " + "; ".join(errs)] if errs else []

    def check_events(self, req, resp, media):
        evs = media.get("x-spindle-events")
        out = []
        if evs is None:
            return ["a text/event-stream media type without x-spindle-events"]
        if resp.events is None:
            return ["an event stream that was not read as one"]
        for name, data, _ in resp.events:
            self.stats.events_seen["%s:%s" % (req.op.id, name)] += 1
            schema = evs.get(name)
            if schema is None:
                out.append("event %r is not declared (data %r)" % (name, data[:200]))
                continue
            try:
                value = json.loads(data)
            except ValueError:
                value = data
            errs = self.spec.errors(schema, value)
            if errs:
                out.append("event %r: %s (data %r)" % (name, "; ".join(errs), data[:300]))
        if req.op.id in ("streamMessage",) and resp.status == 200:
            # thread first, then delta / tool_call pieces, then done, cancelled or error
            names = [n for n, _, _ in resp.events]
            if not names or names[0] != "thread":
                out.append("a message stream that does not begin with `thread`: %s" % names[:5])
            elif names[-1] not in ("done", "cancelled", "error"):
                out.append("a message stream that does not end with done/cancelled/error: %s" % names[-5:])
            elif any(n not in ("delta", "tool_call") for n in names[1:-1]):
                out.append("a message stream with %s between `thread` and its end" % sorted(set(names[1:-1])))
        if req.op.id == "createChatCompletion" and resp.status == 200:
            datas = [d for _, d, _ in resp.events]
            if not datas or (datas[-1] != "[DONE]" and '"error"' not in datas[-1]):
                out.append("a chat completion stream that ends neither with [DONE] nor an error")
            ids = set()
            for d in datas:
                try:
                    v = json.loads(d)
                except ValueError:
                    continue
                if isinstance(v, dict) and "id" in v:
                    ids.add(v["id"])
            if len(ids) > 1:
                out.append("chunks of one chat completion stream with %d ids" % len(ids))
        if req.op.id == "subscribeEvents" and resp.status == 200:
            # begins with `retry: 2000`; every event has an `id:` (EPOCH-SEQ), growing by one
            if resp.retry != "2000":
                out.append("an event stream that does not begin with `retry: 2000` (%r)" % resp.retry)
            last = None
            for name, _, eid in resp.events:
                m = re.fullmatch(r"(\d{1,19})-(\d{1,19})", eid or "")
                if not m:
                    if name != "reset":
                        out.append("event %r with id %r, not EPOCH-SEQ" % (name, eid))
                    continue
                seq = (int(m.group(1)), int(m.group(2)))
                if last is not None and seq <= last:
                    out.append("event ids that do not grow: %s after %s" % (eid, "%d-%d" % last))
                last = seq
        return out[:5]

    def check_semantics(self, req, resp):
        """Rules the document states in prose, on 2xx answers of valid requests."""
        op = req.op.id
        if resp.media_type() != "application/json":
            return []
        try:
            b = json.loads(resp.body)
        except ValueError:
            return []
        if not isinstance(b, dict):
            return []
        out = []
        pid = req.ids.get("id")
        if pid is None and req.op.path_params:
            rx = re.escape(req.op.path).replace(re.escape("{id}"), "([^/]+)").replace(re.escape("{file}"), "([^/]+)")
            m = re.fullmatch(rx, req.path)
            if not m:
                return []
            pid = urllib.parse.unquote(m.group(1))
        thread_ops = ("getThread", "updateThread", "getHistory", "appendTurns", "clearTurns",
                      "buildContext", "listContextItems", "cancelMessage")
        if op in thread_ops and "thread_id" in b and b["thread_id"] != pid:
            out.append("thread_id %r in the answer for thread %r" % (b["thread_id"], pid))
        fresh = pid == "new" or str(pid).endswith("~new")   # `new`, or an end user's `USER~new`
        if op in ("sendMessage",) and not fresh and "forked_from" not in b and b.get("thread_id") != pid:
            out.append("a reply on thread %r names thread %r" % (pid, b.get("thread_id")))
        if op == "sendMessage" and str(pid).endswith("~new") and \
                not str(b.get("thread_id", "")).startswith(pid[:-3]):
            out.append("a new thread of end user %r is %r" % (pid[:-4], b.get("thread_id")))
        if op == "sendMessage" and not fresh and b.get("created") and "forked_from" not in b:
            if pid in self.pools.threads:
                out.append("`created: true` for a message to the existing thread %r" % pid)
        if op == "copyThread" and b.get("copied_from") != pid:
            out.append("a copy of %r says copied_from %r" % (pid, b.get("copied_from")))
        if op == "copyThread" and isinstance(req.json_body, dict) and isinstance(req.json_body.get("at_turn"), int) \
                and b.get("turns") != req.json_body["at_turn"]:
            out.append("a copy at_turn %d has %r turns" % (req.json_body["at_turn"], b.get("turns")))
        if op == "updateThread" and isinstance(req.json_body, dict) and isinstance(req.json_body.get("metadata"), dict):
            for k, v in req.json_body["metadata"].items():
                if v is None and k in b.get("metadata", {}):
                    out.append("PATCH removed metadata key %r but it is still there" % k)
                elif v is not None and b.get("metadata", {}).get(k) != v:
                    out.append("PATCH set metadata %r but the thread holds %r" % (k, b.get("metadata", {}).get(k)))
        if op == "createThread" and isinstance(req.json_body, dict) and isinstance(req.json_body.get("metadata"), dict) \
                and b.get("metadata") != req.json_body["metadata"]:
            out.append("a thread created with metadata %r holds %r" % (req.json_body["metadata"], b.get("metadata")))
        if op == "appendTurns" and b.get("appended") != len(req.json_body.get("turns", [])):
            out.append("appended %r of %d turns" % (b.get("appended"), len(req.json_body.get("turns", []))))
        if op == "getHistory":
            mt = dict(req.query).get("max_turns")
            n = int(mt) if mt and mt.isdigit() else 20
            if len(b.get("turns", [])) > n:
                out.append("history of %d turns for max_turns %d" % (len(b["turns"]), n))
        if op in ("getTask", "heartbeatTask", "completeTask", "failTask", "requeueTask") and b.get("id") != pid:
            out.append("task %r in the answer for task %r" % (b.get("id"), pid))
        want_state = {"claimTask": {"running"}, "heartbeatTask": {"running"}, "completeTask": {"completed"},
                      "failTask": {"failed", "pending"}, "requeueTask": {"pending"}}.get(op)
        if want_state and b.get("state") not in want_state:
            out.append("%s answered a task in state %r" % (op, b.get("state")))
        if op == "getOrchestration" and b.get("id") != pid:
            out.append("orchestration %r in the answer for %r" % (b.get("id"), pid))
        if op == "getOrchestration":
            ids = [t.get("id") for t in b.get("tasks", [])]
            if not ids or ids[0] != pid or any(not (i == pid or i.startswith(pid + "_t")) for i in ids):
                out.append("orchestration %r lists tasks %s" % (pid, ids[:5]))
            if not set(b.get("executable", [])) <= set(ids):
                out.append("executable tasks that are not the orchestration's")
        if op == "createSubtask" and not str(b.get("id", "")).startswith(pid + ("_t" if len(pid) == 4 else ".")):
            out.append("subtask %r of %r" % (b.get("id"), pid))
        if op == "deleteMemory" and str(b.get("id")) != str(pid):
            out.append("deleted memory %r for %r" % (b.get("id"), pid))
        if op == "createMemory" and isinstance(req.json_body, dict):
            tags = []
            if req.json_body.get("user_id"):
                tags.append("user:" + req.json_body["user_id"])
            if req.json_body.get("thread_id"):
                tags.append("thread:" + req.json_body["thread_id"])
            if b.get("tags") != tags:
                out.append("memory tags %r, expected %r" % (b.get("tags"), tags))
        if op == "listThreads":
            lim = dict(req.query).get("limit")
            n = int(lim) if lim and lim.isdigit() else 20
            if len(b.get("data", [])) > n:
                out.append("%d threads for limit %d" % (len(b["data"]), n))
            if b.get("has_more") != (b.get("next_cursor") is not None):
                out.append("has_more %r with next_cursor %r" % (b.get("has_more"), b.get("next_cursor")))
            for k, v in req.query:
                if k.startswith("metadata."):
                    for t in b.get("data", []):
                        if t.get("metadata", {}).get(k[9:]) != v:
                            out.append("listed thread %s does not match filter %s=%s" % (t.get("thread_id"), k, v))
                            break
        if op == "countTokens" and isinstance(req.json_body, dict) and req.json_body.get("encoding") \
                and b.get("encoding") != req.json_body["encoding"]:
            out.append("counted in %r, asked for %r" % (b.get("encoding"), req.json_body["encoding"]))
        if op == "issueId" and isinstance(req.json_body, dict):
            kind = req.json_body.get("kind")
            i = str(b.get("id", ""))
            ok = {"context": re.fullmatch(r"ctx-[1-9][0-9]*", i),
                  "orchestration": re.fullmatch(r"[0-9A-Z]{4}", i),
                  "task": i.startswith(str(req.json_body.get("parent")) + ("_t" if len(str(req.json_body.get("parent"))) == 4 else "."))}.get(kind)
            if not ok:
                out.append("issued %r for kind %r" % (i, kind))
        rb = req.json_body if isinstance(req.json_body, dict) else {}
        if op in ("getTenant", "updateTenant", "deleteTenant", "revokeKey") and b.get("id") != pid:
            out.append("%s answered %r for %r" % (op, b.get("id"), pid))
        if op == "listTenants" and "default" not in [t.get("id") for t in b.get("data", [])]:
            out.append("the tenant list lacks `default`")
        if op in ("createTenant", "updateTenant"):
            if "name" in rb and b.get("name") != rb["name"]:
                out.append("tenant named %r, asked for %r" % (b.get("name"), rb["name"]))
            if rb.get("weight") is not None and b.get("weight") != rb["weight"]:
                out.append("tenant weight %r, asked for %r" % (b.get("weight"), rb["weight"]))
            if op == "createTenant" and rb.get("weight") is None and b.get("weight") != 1:
                out.append("a new tenant without a weight has weight %r, not 1" % b.get("weight"))
        if op == "createKey":
            if b.get("tenant") != pid:
                out.append("a key of tenant %r made for %r" % (b.get("tenant"), pid))
            # without `scopes`: every scope but keys:admin (the Scope enum)
            want = set(rb["scopes"]) if rb.get("scopes") is not None else \
                set(self.spec.doc["components"]["schemas"]["Scope"]["enum"]) - {"keys:admin"}
            if set(b.get("scopes", [])) != want:
                out.append("key scopes %s, asked for %s" % (sorted(b.get("scopes", [])), sorted(want)))
            if not str(b.get("key", "")).startswith(str(b.get("prefix"))):
                out.append("key prefix %r is not the secret's start" % b.get("prefix"))
            if (b.get("expires_at") is None) != (rb.get("expires_in_s") is None):
                out.append("expires_at %r for expires_in_s %r" % (b.get("expires_at"), rb.get("expires_in_s")))
        if op == "listKeys" and any(k.get("tenant") != pid for k in b.get("data", [])):
            out.append("tenant %r lists keys of another tenant" % pid)
        if op in ("setTenantAuth", "getTenantAuth", "deleteTenantAuth") and b.get("tenant") != pid:
            out.append("%s answered tenant %r for %r" % (op, b.get("tenant"), pid))
        if op == "setTenantAuth":
            if b.get("issuer") != rb.get("issuer"):
                out.append("end users' issuer %r, asked for %r" % (b.get("issuer"), rb.get("issuer")))
            if b.get("audience") != (rb.get("audience") or None):
                out.append("end users' audience %r, asked for %r" % (b.get("audience"), rb.get("audience")))
            if b.get("hs256") != bool(rb.get("hs256_secret")):
                out.append("hs256 %r for hs256_secret %r" % (b.get("hs256"), (rb.get("hs256_secret") or "")[:20]))
            if (b.get("jwks") is None) != (rb.get("jwks") is None):
                out.append("jwks %r for jwks %r" % (str(b.get("jwks"))[:40], str(rb.get("jwks"))[:40]))
            if rb.get("hs256_secret") and rb["hs256_secret"] in b.values():
                out.append("the HS256 secret is shown")
        if op == "getMe":
            want = {"admin": ("admin", None), "key": ("key", self.ten.key_tenant),
                    "admin@key": ("admin", None)}.get(req.principal)
            if want and (b.get("kind"), b.get("tenant")) != want:
                out.append("%s is %r in tenant %r, expected %r" % (req.principal, b.get("kind"), b.get("tenant"), want))
            if req.principal == "key" and b.get("key_id") != self.ten.key_id:
                out.append("the key %r says it is %r" % (self.ten.key_id, b.get("key_id")))
        return out

    # -- running one request
    def run(self, req, setup=False):
        st = self.stats
        st.total += 1
        self.use(req.principal)
        if setup:
            st.setup += 1
        else:
            o = st.per_op[req.op.id]
            o["requests"] += 1
            o["valid" if req.kind in ("valid", "replay") else "invalid"] += 1
            st.per_kind[req.kind] += 1
            st.per_principal["%s %s" % (req.principal, "valid" if req.kind in ("valid", "replay")
                                        else "invalid")] += 1
        side = None
        if req.ids.get("busy"):
            side = self.start_side(req.ids["busy"], req.principal)
        snap = None
        if req.ids.get("snapshot"):
            snap = self.thread_snapshot(req.ids["snapshot"], req.principal)
        try:
            resp = self.send(req)
        except (Transport, OSError) as e:
            if side is not None:
                self.finish_side(side, None, None)
            if not self.server.alive():
                self.fail(req, "the server died (exit status %s): %s" % (
                    self.server.proc.returncode, self.server.stderr_tail(1500)))
                self.fatal = "server died"
            else:
                self.fail(req, "no answer: %s" % e)
                self.conn.close()
            return None
        st.per_status[resp.status] += 1
        if self.trace:
            self.trace.write("%d %s%s %s %s %s -> %d %s\n" % (
                self.current_i, req.kind, "" if req.principal == "admin" else "@" + req.principal,
                req.method, req.target()[:300],
                (req.body or b"")[:300].decode("utf-8", "replace").replace("\n", " "), resp.status,
                resp.body[:300].decode("utf-8", "replace").replace("\n", " ")))
        if not setup:
            st.per_op[req.op.id]["seconds"] += resp.elapsed
            st.per_op[req.op.id]["status"][resp.status] += 1
            if 200 <= resp.status < 300 and req.kind == "valid":
                st.per_op[req.op.id]["valid_2xx"] += 1
        problems = self.check(req, resp)
        if req.kind == "replay":
            problems += self.check_replay(req, resp)
        elif req.kind == "valid" and 200 <= resp.status < 300:
            problems += self.check_semantics(req, resp)
            if resp.header("idempotent-replayed") is not None:
                problems.append("Idempotent-Replayed on a first answer")
        for p in problems[:4]:
            self.fail(req, p, resp)
        if req.kind == "valid" or setup:   # a replay's answer is the past's: it teaches nothing
            self.learn(req, resp)
        if snap is not None and 400 <= resp.status < 500:
            after = self.thread_snapshot(req.ids["snapshot"], req.principal)
            if after is not None and after != snap:
                self.fail(req, "a request refused with %d changed its thread: %s, then %s" % (
                    resp.status, snap, after), resp)
        if side is not None:
            self.finish_side(side, req, resp)
        return resp

    def thread_snapshot(self, tid, principal):
        """The thread as GET /v1/threads/{id} shows it (an extra, checked request)."""
        op = self.ops_by_id["getThread"]
        req = self.json_req(op, "valid", "/v1/threads/%s" % urllib.parse.quote(tid, safe=":@+"), _NO_BODY,
                            principal=principal)
        self.stats.total += 1
        self.stats.aux += 1
        try:
            resp = self.conn.request(req.raw(self.host), "GET", REQUEST_TIMEOUT)
        except (Transport, OSError) as e:
            self.fail(req, "no answer: %s" % e)
            self.conn.close()
            return None
        self.stats.per_status[resp.status] += 1
        for p in self.check(req, resp)[:4]:
            self.fail(req, p, resp)
        if resp.status != 200:
            return None
        try:
            b = json.loads(resp.body)
            return {k: b.get(k) for k in ("turns", "metadata", "updated_at")}
        except ValueError:
            return None

    def start_side(self, tid, principal):
        op = self.ops_by_id["streamMessage"]
        req = self.json_req(op, "valid", "/v1/threads/%s/messages/stream" % urllib.parse.quote(tid, safe=":@+"),
                            {"content": "keep the thread busy " * 3}, headers={"Connection": "close"},
                            principal=principal)
        self.stats.total += 1
        self.stats.aux += 1
        try:
            side = SideStream(self.server.port, req.raw(self.host))
        except OSError as e:
            self.fail(req, "no answer: %s" % e)
            return None
        started = side.wait_for(b"event: thread", 10)
        self.stats.busy["started" if started else "not started"] += 1
        return (side, req)

    def finish_side(self, side, main_req, main_resp):
        if side is None:
            return
        stream, req = side
        try:
            resp = stream.finish(REQUEST_TIMEOUT)
        except (Transport, OSError) as e:
            self.fail(req, "busy-thread stream: %s" % e)
            return
        self.stats.per_status[resp.status] += 1
        for p in self.check(req, resp)[:4]:
            self.fail(req, "busy-thread stream: " + p, resp)
        names = [n for n, _, _ in resp.events or []]
        if names:
            self.stats.busy["ended with " + names[-1]] += 1
        if main_req is not None and main_resp is not None and main_req.op.id == "cancelMessage" \
                and main_resp.status == 200 and resp.status == 200 and names and names[-1] != "cancelled":
            self.fail(main_req, "cancel answered 200 but the running stream ended with %r, not `cancelled`"
                      % names[-1], main_resp)

    def check_replay(self, req, resp):
        first = req.ids["first"]
        out = []
        if resp.status != first.status:
            out.append("an Idempotency-Key retry got %d, the first answer was %d" % (resp.status, first.status))
        elif resp.header("idempotent-replayed") != "true":
            out.append("an Idempotency-Key retry without Idempotent-Replayed: true")
        elif first.events is not None:
            a = [(n, d) for n, d, _ in first.events]
            b = [(n, d) for n, d, _ in resp.events or []]
            if a != b:
                out.append("a replayed stream differs from the first (%d vs %d events)" % (len(a), len(b)))
        elif resp.body != first.body:
            out.append("a replayed answer differs from the first: %r vs %r" % (resp.body[:200], first.body[:200]))
        return out

    # -- building requests
    def rng_for(self, i):
        return random.Random((self.seed * 1000003 + i) & 0xFFFFFFFFFFFF)

    def json_req(self, op, kind, path, body, query=None, headers=None, principal=None):
        principal = principal or self.principal
        h = self.auth(op, principal)
        h.update(headers or {})
        data = None
        if body is not _NO_BODY:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            h["Content-Type"] = "application/json"
        r = Request(op, kind, op.method, path, query, h, data)
        r.json_body = None if body is _NO_BODY else body
        r.principal = principal
        return r

    def path_value(self, rng, op, name, p, valid=True):
        """A value for a path parameter: an existing resource most of the time."""
        pools = self.pools
        schema = p.get("schema", {})
        r = rng.random()
        live = None
        if name == "ThreadIdOrNew":
            if r < 0.4:
                if self.principal != "admin" and rng.random() < 0.25:
                    return "fu%d~new" % rng.randrange(3), False   # a new thread of an end user
                return "new", False
            live = list(pools.threads)
        elif name in ("ThreadId", "ThreadIdItems"):
            if r < 0.1 and pools.gone_threads:
                return rng.choice(list(pools.gone_threads)), False
            live = list(pools.threads)
        elif name == "TaskId":
            if op.id in ("heartbeatTask", "completeTask", "failTask") and pools.leases and r < 0.7:
                task, token = rng.choice(list(pools.leases))
                return task, token
            live = list(pools.tasks)
        elif name == "OrchestrationId":
            live = list(pools.orchestrations)
        elif name == "MemoryId":
            live = list(pools.memories)
        elif name == "ConsoleFile":
            if r < 0.85 and pools.console_files:
                return rng.choice(pools.console_files), True
            return self.gen.string(rng, {"pattern": "^[a-z]{1,8}\\.(js|css|html|svg|txt)$"}), False
        elif name == "TenantId":
            return self.tenant_value(rng, op, schema)
        elif name == "KeyId":
            keys = list(self.ten.keys)
            if keys and r < 0.8:
                return rng.choice(keys), True
            if self.ten.revoked and r < 0.85:
                return rng.choice(list(self.ten.revoked)), False
            return self.gen.draw(rng, schema), False
        if live and rng.random() < 0.8:
            return rng.choice(live), True
        return self.gen.draw(rng, schema), False

    def fresh_tenant_id(self, rng):
        """A tenant ID no tenant has (made ones are `t` and 11 characters)."""
        ten = self.ten
        for _ in range(20):
            v = rng.choice(["t" + self.gen.string(rng, {"pattern": "^[a-z0-9]{11}$"}),
                            self.gen.string(rng, {"pattern": "^[a-z0-9]{1,32}$"})])
            if v != "default" and v not in ten.live and v != ten.key_tenant:
                return v
        return "nosuchtenant0"

    def tenant_value(self, rng, op, schema):
        """A tenant of the path: mostly one the fuzzer made, never `default` or the
        key's tenant for a delete (those are the invalid kind default_tenant's)."""
        ten = self.ten
        live = list(ten.live)
        r = rng.random()
        if op.id == "deleteTenant":
            if live and (r < 0.85 or len(live) > MAX_LIVE_TENANTS):
                return rng.choice(live), True
            if ten.gone and r < 0.9:
                return rng.choice(list(ten.gone)), False
            return self.fresh_tenant_id(rng), False
        if live and r < 0.55:
            return rng.choice(live), True
        if ten.key_tenant and r < 0.65:
            return ten.key_tenant, True
        if r < 0.8:
            return "default", True
        if ten.gone and r < 0.85:
            return rng.choice(list(ten.gone)), False
        return self.fresh_tenant_id(rng), False

    def tenant_name(self, rng, drawn=None):
        """A name no tenant has: the drawn one with `-N` at its end."""
        self.ten.names += 1
        suffix = "-%d" % self.ten.names
        if not isinstance(drawn, str):
            drawn = self.gen.string(rng, {"pattern": "^[A-Za-z0-9._-][A-Za-z0-9 ._-]{0,20}$"})
        return drawn[:64 - len(suffix)].rstrip(" ") + suffix

    def build_valid(self, rng, op, kind="valid"):
        fix = getattr(self, "fix_" + op.id, None)
        facts = {}
        # path
        path = op.path
        for name, p in op.path_params:
            v, fact = self.path_value(rng, op, name, p)
            facts[p["name"]] = v
            facts["fact"] = fact
            path = path.replace("{%s}" % p["name"], urllib.parse.quote(str(v), safe=":@+"))
        # query
        query = []
        for name, p in op.query_params:
            if p.get("required") or rng.random() < 0.45:
                v = self.query_text(self.gen.draw(rng, p.get("schema", {})))
                query.append((p["name"], v[:300]))
        # headers
        headers = {}
        for name, p in op.header_params:
            if p["name"] == "Idempotency-Key":
                if rng.random() < 0.35:   # made unique: a key belongs to one request
                    headers["Idempotency-Key"] = self.gen.draw(rng, p["schema"])[:200] + "~%d" % self.current_i
            elif p["name"] == "If-None-Match":
                if rng.random() < 0.4:
                    headers["If-None-Match"] = self.pools.etags.get(path, '"%016x"' % rng.getrandbits(64))
            elif p["name"] == "Spindle-Tenant":
                # Set by auth(): the admin token names `default` (or the key's tenant);
                # a key may name its own tenant, or send none.
                if self.principal == "key" and rng.random() < 0.3:
                    headers["Spindle-Tenant"] = self.ten.key_tenant
            elif rng.random() < 0.3:
                headers[p["name"]] = self.gen.draw(rng, p.get("schema", {}))
        # body
        body = _NO_BODY
        if op.body_schema is not None and (op.body_required or rng.random() < 0.8):
            body = self.gen.draw(rng, op.body_schema)
        req = self.json_req(op, kind, path, body, query, headers)
        req.ids = facts
        if fix:
            fix(rng, req)
            if req.json_body is not None and req.body is not None:
                req.body = json.dumps(req.json_body, ensure_ascii=False).encode("utf-8")
        if req.body is not None:
            r = rng.random()
            if r < 0.05:
                req.chunked = True                        # HTTP/1.1 allows either framing
            elif r < 0.08:
                req.headers["Expect"] = "100-continue"    # honoured (api.md, "Connections and limits")
        return req

    @staticmethod
    def query_text(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (dict, list)):
            return json.dumps(v)
        return str(v)

    def set_body(self, req, value):
        req.json_body = value
        req.body = json.dumps(value, ensure_ascii=False).encode("utf-8")
        req.headers["Content-Type"] = "application/json"

    # -- per-operation rules the schemas cannot state (valid requests)
    def fix_issueId(self, rng, req):
        b = req.json_body
        if b.get("kind") == "task":
            cands = list(self.pools.tasks)
            b["parent"] = rng.choice(cands) if cands and rng.random() < 0.8 else \
                self.gen.draw(rng, self.spec.doc["components"]["parameters"]["TaskId"]["schema"])
        else:
            b.pop("parent", None)

    def fix_listThreads(self, rng, req):
        q = [(k, v) for k, v in req.query if k != "cursor"]
        if rng.random() < 0.25:
            for _ in range(rng.randint(1, 3)):
                key = self.gen.string(rng, {"pattern": "^[a-z0-9_.:-]{1,10}$"})
                q.append(("metadata." + key, rng.choice(["a", "b", self.gen.string(rng, {"maxLength": 8})])))
        if self.pools.thread_cursors and rng.random() < 0.4:
            cur, filters = rng.choice(list(self.pools.thread_cursors))
            q = list(filters) + [("cursor", cur)]
        elif any(k == "cursor" for k, _ in req.query) and rng.random() < 0.7:
            pass    # a random cursor: 400 invalid_argument, a documented refusal
        names = set()
        req.query = [(k, v) for k, v in q if not (k in names or names.add(k))]

    def fix_copyThread(self, rng, req):
        b = req.json_body
        if isinstance(b, dict) and isinstance(b.get("at_turn"), int):
            tid = req.ids.get("id")
            turns = self.pools.thread_turns.get(tid)
            if turns is not None and rng.random() < 0.8:
                b["at_turn"] = rng.randint(0, max(turns, 0))

    def _fix_tools(self, rng, b):
        tools = b.get("tools")
        if isinstance(tools, list):
            seen = set()
            uniq = []
            for t in tools:
                n = t["function"]["name"]
                if n not in seen:
                    seen.add(n)
                    uniq.append(t)
            b["tools"] = tools = uniq
        tc = b.get("tool_choice")
        if tc is not None:
            if not tools:
                if rng.random() < 0.5:
                    b.pop("tool_choice")
                else:
                    b["tools"] = tools = [{"type": "function", "function": {"name": "fuzz_tool"}}]
            if isinstance(tc, dict) and tools:
                tc["function"]["name"] = rng.choice(tools)["function"]["name"]

    def _fix_budget(self, rng, b):
        mct = b.get("max_context_tokens")
        if isinstance(mct, int) and mct <= REPLY_RESERVE + 200 and rng.random() < 0.9:
            b["max_context_tokens"] = rng.choice([REPLY_RESERVE + 2000, 20000, 128000, 10000000])

    def fix_sendMessage(self, rng, req):
        b = req.json_body
        self._fix_tools(rng, b)
        self._fix_budget(rng, b)
        b["content"] = b["content"][:2000]

    fix_streamMessage = fix_sendMessage

    def fix_buildContext(self, rng, req):
        self._fix_budget(rng, req.json_body)

    def fix_appendTurns(self, rng, req):
        turns = req.json_body["turns"]
        open_calls = []
        for t in turns:
            role = t["role"]
            if role != "assistant":
                t.pop("tool_calls", None)
            if role != "tool":
                t.pop("tool_call_id", None)
            if role in ("user", "system"):
                if not isinstance(t.get("content"), str) or not t["content"]:
                    t["content"] = "fuzz " + self.gen.string(rng, {"maxLength": 20})
            elif role == "assistant":
                calls = t.get("tool_calls") or []
                for c in calls:
                    self.pools.call_seq += 1
                    c["id"] = ("f%d-%s" % (self.pools.call_seq, c["id"]))[:256]
                    open_calls.append(c["id"])
                if not calls and t.get("content") is None:
                    t["content"] = self.gen.string(rng, {"maxLength": 20})
            elif role == "tool":
                if open_calls:
                    t["tool_call_id"] = open_calls.pop(rng.randrange(len(open_calls)))
                    if t.get("content") is None:
                        t["content"] = "result"
                else:
                    t.clear()
                    t.update({"role": "user", "content": "instead of a tool turn"})

    def fix_addContextItem(self, rng, req):
        md = req.json_body.get("metadata")
        if isinstance(md, dict) and "start_line" in md and "end_line" in md and \
                md["start_line"] > md["end_line"]:
            md["start_line"], md["end_line"] = md["end_line"], md["start_line"]

    def _one_scope(self, rng, req, also=()):
        q = [(k, v) for k, v in req.query if k not in ("user_id", "thread_id")]
        if rng.random() < 0.5:
            users = list(self.pools.memory_users)
            q.append(("user_id", rng.choice(users) if users and rng.random() < 0.7 else
                      self.gen.draw(rng, {"type": "string", "pattern": r"^(?!\.\.?$)[A-Za-z0-9._:@+-]{1,128}$"})))
        else:
            threads = list(self.pools.threads)
            q.append(("thread_id", rng.choice(threads) if threads and rng.random() < 0.7 else
                      self.gen.draw(rng, {"type": "string", "pattern": r"^(?!\.\.?$)[A-Za-z0-9._:-]{1,128}$"})))
        req.query = q

    def fix_retrieveMemories(self, rng, req):
        q = dict(req.query)
        if self.pools.threads and rng.random() < 0.7:
            q["thread_id"] = rng.choice(list(self.pools.threads))
        if "user_id" in q and self.pools.memory_users and rng.random() < 0.6:
            q["user_id"] = rng.choice(list(self.pools.memory_users))
        req.query = list(q.items())

    def fix_deleteMemories(self, rng, req):
        self._one_scope(rng, req)

    def fix_listMemoryEntries(self, rng, req):
        self._one_scope(rng, req)
        req.query = [(k, v) for k, v in req.query if k != "cursor"]
        if self.pools.memory_cursors and rng.random() < 0.4:
            cur, scope = rng.choice(list(self.pools.memory_cursors))
            req.query = [(k, v) for k, v in req.query if k not in ("user_id", "thread_id")] + \
                list(scope) + [("cursor", cur)]

    def fix_createMemory(self, rng, req):
        b = req.json_body
        if b.get("user_id") is None and b.get("thread_id") is None:
            if rng.random() < 0.5 and self.pools.threads:
                b["thread_id"] = rng.choice(list(self.pools.threads))
            else:
                b["user_id"] = self.gen.draw(rng, {"type": "string", "pattern": r"^(?!\.\.?$)[A-Za-z0-9._:@+-]{1,128}$"})
        elif b.get("thread_id") and self.pools.threads and rng.random() < 0.5:
            b["thread_id"] = rng.choice(list(self.pools.threads))
        if b.get("user_id"):
            self.pools.memory_users.append(b["user_id"])

    def fix_claimTask(self, rng, req):
        b = req.json_body
        b["worker"] = rng.choice(["w1", "worker-2", "fuzz.worker_3", "w:4"])
        if b.get("wait_s") is not None:
            b["wait_s"] = rng.choice([0, 0, 0.01, 0.05])
        if isinstance(b.get("lease_s"), (int, float)) and rng.random() < 0.3:
            b["lease_s"] = 1

    def _lease_body(self, rng, req):
        b = req.json_body
        token = req.ids.get("fact")
        if isinstance(token, str) and isinstance(b, dict) and rng.random() < 0.9:
            b["lease"] = token

    def fix_heartbeatTask(self, rng, req):
        self._lease_body(rng, req)

    fix_completeTask = fix_heartbeatTask
    fix_failTask = fix_heartbeatTask

    def fix_subscribeEvents(self, rng, req):
        q = [(k, v) for k, v in req.query if k not in ("types", "last_event_id", "orchestration", "thread")]
        if rng.random() < 0.4:
            q.append(("types", ",".join(rng.sample(EVENT_TYPES, rng.randint(1, 3)))))
        if rng.random() < 0.15:
            q.append(("orchestration", rng.choice(list(self.pools.orchestrations) or ["0001"])))
        if rng.random() < 0.15:
            q.append(("thread", rng.choice(list(self.pools.threads) or ["t1"])))
        ids = list(self.pools.event_ids)
        r = rng.random()
        if r < 0.5 and ids:
            eid = rng.choice(ids)
        elif r < 0.65:
            eid = "%d-%d" % (rng.randint(0, 10 ** 13), rng.randint(0, 10 ** 6))
        else:
            eid = None
        req.headers.pop("Last-Event-ID", None)
        if eid:
            if rng.random() < 0.5:
                req.headers["Last-Event-ID"] = eid
            else:
                q.append(("last_event_id", eid))
        req.query = q

    def fix_createChatCompletion(self, rng, req):
        b = req.json_body
        self._fix_tools(rng, b)
        msgs = b["messages"]
        for m in msgs:
            if m["role"] != "assistant":
                m.pop("tool_calls", None)
            if m["role"] == "tool":
                m.setdefault("tool_call_id", "call_" + self.gen.string(rng, {"pattern": "^[a-z0-9]{1,8}$"}))
            if m.get("content") is None and not (m["role"] == "assistant" and m.get("tool_calls")):
                m["content"] = "hello"
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or []:
                    self.pools.call_seq += 1
                    c["id"] = ("f%d-%s" % (self.pools.call_seq, c["id"]))[:256]
        last = msgs[-1]
        if last["role"] != "user":
            msgs.append({"role": "user", "content": self.gen.string(rng, {"minLength": 1, "maxLength": 40})})
        threads = list(self.pools.threads)
        mode = rng.random()
        tid = None
        if mode < 0.45:
            for k in ("thread_id", "user_id", "on_conflict", "max_turns"):
                b.pop(k, None)
            req.headers.pop("Spindle-Thread-Id", None)
        else:
            tid = rng.choice(threads) if threads and rng.random() < 0.6 else "new"
            where = rng.random()
            b.pop("thread_id", None)
            req.headers.pop("Spindle-Thread-Id", None)
            if where < 0.4:
                b["thread_id"] = tid
            elif where < 0.8:
                req.headers["Spindle-Thread-Id"] = tid
            else:
                b["thread_id"] = tid
                req.headers["Spindle-Thread-Id"] = tid

    def fix_createTenant(self, rng, req):
        b = req.json_body
        names = [n for n in list(self.ten.live.values()) + [self.ten.key_tenant_name] if n]
        if names and rng.random() < 0.04:
            b["name"] = rng.choice(names)        # taken: 409 conflict, declared
        else:
            b["name"] = self.tenant_name(rng, b.get("name"))

    def fix_updateTenant(self, rng, req):
        b = req.json_body
        tid = req.ids.get("id")
        if tid == "default":
            b.pop("name", None)                  # `default` keeps its name (kind default_tenant)
        elif "name" in b:
            others = [n for t, n in self.ten.live.items() if n and t != tid]
            if others and rng.random() < 0.04:
                b["name"] = rng.choice(others)   # another tenant's: 409 conflict, declared
            else:
                b["name"] = self.tenant_name(rng, b.get("name"))
        if not b:
            b["weight"] = rng.choice([None, 1, rng.randint(1, 1000), 1000])
        limits = b.get("limits")
        if tid in ("default", self.ten.key_tenant) and isinstance(limits, dict):
            # 0 (no limit) or one no run comes near (HARMLESS_LIMITS)
            for k, (lo, hi) in HARMLESS_LIMITS.items():
                v = limits.get(k)
                if type(v) is int and v != 0 and not lo <= v <= hi:
                    limits[k] = rng.choice([0, lo, rng.randint(lo, hi), hi])

    def fix_setTenantAuth(self, rng, req):
        """An issuer no other tenant has (sometimes a taken one: 409), exactly one
        of hs256_secret and jwks, byte lengths in bounds, a real JWK Set (or the
        admin token's file of one), a tenant other than `default`."""
        ten = self.ten
        tid = req.ids.get("id")
        if tid == "default":   # no end users there (kind default_tenant)
            tid = rng.choice(list(ten.live) or [ten.key_tenant or "nosuchtenant0"])
            req.ids["id"] = tid
            req.path = self.ops_by_id["setTenantAuth"].path.replace("{id}", tid)
        b = req.json_body

        def cut(text, limit):
            return text.encode("utf-8")[:limit].decode("utf-8", "ignore")

        ten.names += 1
        taken = [i for t, i in ten.issuers.items() if t != tid]
        if taken and rng.random() < 0.04:
            b["issuer"] = rng.choice(taken)          # another tenant's: 409 conflict, declared
        else:
            b["issuer"] = cut(b.get("issuer") or "iss", 480) + "#%d" % ten.names
        if isinstance(b.get("audience"), str):
            b["audience"] = cut(b["audience"], 512)
        if rng.random() < 0.5:
            secret = b.get("hs256_secret")
            if not isinstance(secret, str) or len(secret.encode("utf-8")) < 32:
                secret = self.gen.string(rng, {"pattern": "^[A-Za-z0-9_-]{32,64}$"})
            b["hs256_secret"] = cut(secret, 1024)
            if rng.random() < 0.5:
                b.pop("jwks", None)
            else:
                b["jwks"] = None
        else:
            if rng.random() < 0.5:
                b.pop("hs256_secret", None)
            else:
                b["hs256_secret"] = None
            if self.jwks_file and rng.random() < 0.2:
                b["jwks"] = self.jwks_file           # the admin token's file
            else:
                keys = [k for k in FUZZ_JWKS["keys"] if rng.random() < 0.7] or FUZZ_JWKS["keys"][:1]
                b["jwks"] = {"keys": copy.deepcopy(keys)}

    # -- invalid requests
    def build_invalid(self, rng, op, kind):
        """An invalid request of `kind`, or None when the kind does not apply to `op`."""
        req = self.build_valid(rng, op, kind)
        body = req.json_body
        has_body = op.body_schema is not None
        if kind in ("drop_required", "wrong_type", "out_of_bounds", "unknown_field"):
            if not has_body:
                return None
            if body is None:
                body = self.gen.draw(rng, op.body_schema)
            for _ in range(12):
                cand = copy.deepcopy(body)
                mutated = self.mutate(rng, kind, cand, op.body_schema)
                if mutated is None:
                    return None
                cand, note, where = mutated
                if not self.spec.valid(op.body_schema, cand):
                    self.set_body(req, cand)
                    req.note = note
                    break
            else:
                return None
            req.expect = {}
            if kind == "unknown_field":
                # Top level: unknown_field (info.description). Inside a value the
                # route checks as a whole (a tool, a turn) it may be that value's
                # invalid_argument or malformed (api.md, "Tools").
                codes = {"unknown_field"} if len(where) <= 1 else {"unknown_field", "invalid_argument", "malformed"}
                req.expect = {"status": {400, 404}, "code": codes}
            return req
        if kind == "not_json":
            if not has_body:
                return None
            req.body = rng.choice([b"{", b'{"a":}', b"nul", b'{"content": "x",}', b"{} x", b"[1,2",
                                   b'{"x": NaN}', b"\x00\x01garbage", b"'single'", b'{"a" 1}',
                                   b'{"content": "unterminated}', b"01", b"+1", b".5", b'"\\u12"'])
            req.headers["Content-Type"] = "application/json"
            req.note = "body %r" % req.body
            req.expect = {"status": {400, 404}, "code": {"malformed"}}
            return req
        if kind == "not_object":
            if not has_body:
                return None
            v = rng.choice([[], [1], "text", 42, -1.5, True, False, None, [{"content": "x"}]])
            self.set_body(req, v)
            req.note = "body %s" % json.dumps(v)
            req.expect = {"status": {400, 404}, "code": {"malformed"}}
            return req
        if kind == "invalid_utf8":
            if not has_body:
                return None
            b = body if isinstance(body, dict) else self.gen.draw(rng, op.body_schema)
            strs = [p for p, v, s in walk(self.spec, b, op.body_schema) if isinstance(v, str) and p]
            bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
            if strs:
                path = rng.choice(strs)
                set_at(b, path, "FUZZ_PLACEHOLDER_9q")
                raw = json.dumps(b, ensure_ascii=False).encode("utf-8")
                req.body = raw.replace(b"FUZZ_PLACEHOLDER_9q", b"a" + bad + b"b", 1)
                req.note = "invalid UTF-8 in %s" % fmt_path(path)
            else:
                req.body = b'{"\xff": 1}'
                req.note = "invalid UTF-8 in a key"
            req.headers["Content-Type"] = "application/json"
            req.expect = {"status": {400, 404}, "code": {"malformed"}}
            return req
        if kind == "bad_query":
            return self.bad_query(rng, op, req)
        if kind == "bad_path":
            if not op.path_params:
                return None
            name, p = rng.choice(op.path_params)
            schema = p.get("schema", {})
            cands = {
                "string": ["..", ".", "a b", "x" * 129, "é", "a%", "a\"b", "<x>", "a;b", "~"],
                "integer": ["0", "-1", "abc", "1.5", "1e3", "99999999999999999999999", "0x10", "+1"],
            }[schema.get("type", "string")]
            if p["name"] == "id" and "[0-9A-Z]{4}" in schema.get("pattern", ""):
                cands = ["0001_t0", "001", "00001", "abcd", "0001_t1.", "0001_t01", "0001-t1", "ZZZZ_x"]
            bad = None
            for v in rng.sample(cands, len(cands)):
                if schema.get("type") == "integer" or not self.spec.valid(schema, v):
                    bad = v
                    break
            if bad is None:
                return None
            path = op.path
            for n2, p2 in op.path_params:
                v = bad if p2 is p else req.ids.get(p2["name"])
                path = path.replace("{%s}" % p2["name"], urllib.parse.quote(str(v), safe=":@+"))
            req.path = path
            req.note = "path parameter %s = %r" % (p["name"], bad)
            req.expect = {"status": {400, 404}}
            if op.id.startswith("getConsole"):
                return None
            return req
        if kind == "bad_header":
            names = [p["name"] for _, p in op.header_params if p["name"] not in ("If-None-Match", "Spindle-Tenant")]
            if not names:
                return None
            name = rng.choice(names)
            if name == "Idempotency-Key":
                v = rng.choice(["has space", "x" * 256, "tab\tin", "caf\u00e9", ""])
                req.expect = {"status": {400}, "code": {"invalid_argument"}, "param": "Idempotency-Key"}
            elif name == "Last-Event-ID":
                v = rng.choice(["abc", "1", "1-", "-1", "1-2-3", "12345678901234567890-1", "1_2"])
                req.expect = {"status": {400}, "code": {"invalid_argument"}}
                req.query = [(k, x) for k, x in req.query if k != "last_event_id"]
            elif name == "Spindle-Thread-Id":
                v = rng.choice(["..", "a b", "x" * 129, "a/b", "é"])
                req.expect = {"status": {400}, "code": {"invalid_id", "invalid_argument"}}
                if isinstance(req.json_body, dict):
                    req.json_body.pop("thread_id", None)
                    req.json_body.pop("user_id", None)
                    req.json_body.pop("on_conflict", None)
                    req.json_body.pop("max_turns", None)
                    self.set_body(req, req.json_body)
            else:
                return None
            req.headers[name] = v
            req.note = "header %s: %r" % (name, v)
            return req
        if kind in ("auth_missing", "auth_wrong"):
            if not op.secured:
                return None
            if kind == "auth_missing":
                del req.headers["Authorization"]
                req.note = "no Authorization header"
            else:
                wrong = ["Bearer wrong", "Bearer " + self.server.token + "x", "Basic " + self.server.token,
                         "bearer", "Bearer", "Token " + self.server.token, "Bearer  " + self.server.token[:-1],
                         "Bearer spk_" + "A" * 40, "Bearer " + UNKNOWN_ISSUER_JWT]
                if self.ten.key_secret:
                    wrong += ["Bearer " + self.ten.key_secret[:-1], "Basic " + self.ten.key_secret]
                if self.ten.revoked_secrets:   # revoked, or its tenant deleted
                    wrong.append("Bearer " + rng.choice(list(self.ten.revoked_secrets)))
                req.headers["Authorization"] = rng.choice(wrong)
                req.note = "Authorization: %s" % req.headers["Authorization"]
            req.expect = {"status": {401}}
            return req
        if kind == "tenant_header":
            # Spindle-Tenant (tenants.md, "Who a request acts for")
            if not op.tenant_data:
                return None
            pp = {"status": {403}, "code_of": {403: {"permission_denied"}}}
            if req.principal == "key":
                # a key names another tenant (or one that does not exist): 403, param Spindle-Tenant
                v = rng.choice(["default", self.fresh_tenant_id(rng)] + list(self.ten.live)[-4:])
                req.headers["Spindle-Tenant"] = v
                req.note = "a key with Spindle-Tenant: %s, not its tenant" % v
                req.expect = dict(pp, param="Spindle-Tenant")
                return req
            r = rng.random()
            if r < 0.3:
                req.headers.pop("Spindle-Tenant", None)
                req.note = "the admin token without Spindle-Tenant"
                req.expect = pp
            elif r < 0.8:
                v = rng.choice(list(self.ten.gone)) if self.ten.gone and rng.random() < 0.3 \
                    else self.fresh_tenant_id(rng)
                req.headers["Spindle-Tenant"] = v
                req.note = "Spindle-Tenant: %s, no tenant" % v
                req.expect = {"status": {404}, "code_of": {404: {"not_found"}}, "param": "Spindle-Tenant"}
            else:
                v = rng.choice(["Default", "DEFAULT", "a b", "x" * 33, "t-1", "t_1", "t.x", "t~x"])
                req.headers["Spindle-Tenant"] = v
                req.note = "Spindle-Tenant: %r, off its pattern" % v
                req.expect = {"status": {400, 404}, "param": "Spindle-Tenant"}
            return req
        if kind == "wrong_principal":
            # A valid token on a route it may not use: 403 permission_denied.
            exp = {"status": {403}, "code_of": {403: {"permission_denied"}}}
            if op.access in ("admin", "tenant_admin") and self.ten.key_secret:
                req.headers["Authorization"] = "Bearer " + self.ten.key_secret
                req.headers.pop("Spindle-Tenant", None)
                req.note = "a tenant's key (without keys:admin) on a route %s" % {
                    "admin": "for the admin token", "tenant_admin": "for keys:admin"}[op.access]
                if op.access == "tenant_admin":
                    exp["param"] = "keys:admin"
                req.expect = exp
                return req
            if op.access == "tenant":
                req.headers["Authorization"] = "Bearer " + self.server.token
                req.headers.pop("Spindle-Tenant", None)
                req.note = "the admin token without Spindle-Tenant"
                req.expect = exp
                return req
            return None
        if kind == "default_tenant":
            # What the tenant `default` refuses (api.md, "Tenants and keys")
            if op.id == "deleteTenant":
                req.note = "DELETE of the tenant default"
            elif op.id == "updateTenant":
                if not isinstance(req.json_body, dict):
                    return None
                req.json_body["name"] = self.tenant_name(rng)
                self.set_body(req, req.json_body)
                req.note = "a new name for the tenant default"
            elif op.id == "setTenantAuth":
                req.note = "end users' tokens for the tenant default"
            else:
                return None
            req.path = op.path.replace("{id}", "default")
            req.expect = {"status": {400}, "code": {"invalid_argument"}}
            return req
        if kind == "idem_mismatch":
            prior = self.recent_keys(op)
            if not prior:
                return None
            key, first, _, _ = rng.choice(prior)
            req.headers["Idempotency-Key"] = key
            if req.path == first.path and req.body == first.body:
                return None
            req.note = "Idempotency-Key %r of an earlier, different request" % key
            req.expect = {"status": {422, 404, 409}}
            return req
        if kind == "body_too_large":
            req.body = b'{"content": "' + b"x" * (1048576 + 10) + b'"}'
            req.headers["Content-Type"] = "application/json"
            req.note = "a body over --body-limit"
            req.expect = {"status": {413}, "close": True}
            return req
        if kind == "uri_too_long":
            req.raw_target = req.target() + ("&" if "?" in req.target() else "?") + "pad=" + "x" * 8300
            req.note = "a request target over 8 KiB"
            req.expect = {"status": {414}, "close": True}
            return req
        if kind == "malformed_http":
            raw = req.raw(self.host)
            head, _, rest = raw.partition(b"\r\n\r\n")
            variant = rng.randrange(5)
            if variant == 0:
                head = head.replace(b" HTTP/1.1", b" HTTP/9.9", 1)
            elif variant == 1:
                head += b"\r\nA header line without a colon"
            elif variant == 2:
                head = head.replace(b" ", b"\x00", 1)
            elif variant == 3:
                head += b"\r\nContent-Length: -5"
            else:
                head += b"\r\nContent-Length: 12abc"
            req.raw_override = head + b"\r\n\r\n" + rest
            req.note = "a request that is not HTTP (variant %d)" % variant
            req.expect = {"status": {400}, "code": {"malformed"}, "close": True}
            return req
        if kind == "wrong_method":
            # a method no operation takes on this path (another template may match it:
            # DELETE /v1/memories/entries is DELETE /v1/memories/{id})
            others = [m for m in ("GET", "POST", "PUT", "PATCH", "DELETE")
                      if not any(o.method == m and o.matches(req.path) for o in self.spec.ops)]
            if not others:
                return None
            req.method = rng.choice(others)
            req.note = "%s, a method %s does not have" % (req.method, op.path)
            req.expect = {"status": {404}, "code": {"not_found"}}
            return req
        if kind == "too_many_headers":
            if rng.random() < 0.5:
                req.extra_headers = [("X-Fuzz-%d" % i, "x") for i in range(101)]
                req.note = "more than 100 header fields"
            else:
                req.extra_headers = [("X-Fuzz", "x" * 33000)]
                req.note = "headers over 32 KiB"
            req.expect = {"status": {431}, "close": True}
            return req
        raise ValueError(kind)

    def bad_query(self, rng, op, req):
        choices = []
        for name, p in op.query_params:
            choices.append(("value", p))
            if p.get("required"):
                choices.append(("missing", p))
        if op.refuses_unknown_query:
            choices.append(("unknown", None))
        if not choices:
            return None
        what, p = rng.choice(choices)
        q = [(k, v) for k, v in req.query if p is None or k != p["name"]]
        if p is not None and p["name"] == "last_event_id":
            req.headers.pop("Last-Event-ID", None)   # the header would take precedence
        if what == "unknown":
            q.append(("fuzz_" + self.gen.string(rng, {"pattern": "^[a-z]{1,8}$"}), "1"))
            req.query = q
            req.note = "unknown query parameter"
            req.expect = {"status": {400}, "code": {"unknown_field"}}
            return req
        if what == "missing":
            req.query = q
            req.note = "required query parameter %s missing" % p["name"]
            req.expect = {"status": {400}}
            return req
        s = self.spec.deref(p.get("schema", {}))
        cands = []
        if s.get("type") == "integer":
            cands = ["abc", "1.5", "", "1e2", "0x10", " 1", "99999999999999999999999"]
            if "minimum" in s:
                cands.append(str(s["minimum"] - 1))
            if "maximum" in s:
                cands.append(str(s["maximum"] + 1))
        elif "pattern" in s:
            cands = ["..", "a b", "x" * 129, "é", "-", "0", "1-", "abc", ""]
        if not cands:
            return None
        for v in rng.sample(cands, len(cands)):
            test = v
            if s.get("type") == "integer":
                try:
                    test = int(v) if re.fullmatch(r"-?\d+", v) else v
                except ValueError:
                    pass
            if not self.spec.valid(s, test):
                q.append((p["name"], v))
                req.query = q
                req.note = "query %s=%r" % (p["name"], v)
                req.expect = {"status": {400}}
                return req
        return None

    def mutate(self, rng, kind, body, schema):
        """Breaks `body` (in place where it can) by `kind`; returns (body, note) or None."""
        nodes = list(walk(self.spec, body, schema))
        if kind == "drop_required":
            cands = [(p, v, s) for p, v, s in nodes if isinstance(v, dict) and
                     any(r in v for r in s.get("required", []))]
            if not cands:
                return None
            p, v, s = rng.choice(cands)
            field = rng.choice([r for r in s["required"] if r in v])
            del v[field]
            return body, "required %s dropped" % fmt_path(p + (field,)), p + (field,)
        if kind == "unknown_field":
            cands = [(p, v, s) for p, v, s in nodes if isinstance(v, dict) and
                     s.get("additionalProperties") is False]
            if not cands:
                return None
            p, v, s = rng.choice(cands)
            name = rng.choice(["fuzz_unknown", "Content", "id", "extra", "thread", "x"])
            if name in s.get("properties", {}):
                name = "fuzz_" + name
            v[name] = rng.choice([1, "x", None, {}, []])
            return body, "unknown field %s" % fmt_path(p + (name,)), p + (name,)
        if kind == "wrong_type":
            cands = [(p, v, s) for p, v, s in nodes if p and schema_type_set(self.spec, s)]
            rng.shuffle(cands)
            for p, v, s in cands:
                options = ["text", 12, 1.5, True, None, [], {}, [1], {"a": 1}]
                rng.shuffle(options)
                for o in options:
                    if not self.spec.valid(s, o):
                        set_at(body, p, o)
                        return body, "%s = %s (wrong type)" % (fmt_path(p), json.dumps(o)), p
            return None
        if kind == "out_of_bounds":
            cands = []
            for p, v, s in nodes:
                for o, note in self.violations(rng, v, s):
                    cands.append((p, o, note))
            if not cands:
                return None
            p, o, note = rng.choice(cands)
            if not p:
                return o, note, p
            set_at(body, p, o)
            return body, "%s: %s" % (fmt_path(p), note), p
        raise ValueError(kind)

    def violations(self, rng, v, s):
        """Values of v's type that break one bound of s."""
        out = []
        t = json_type(v)
        if "enum" in s and t == "string":
            out.append(("bogus_" + self.gen.string(rng, {"pattern": "^[a-z]{1,6}$"}), "not in enum"))
        if "const" in s:
            c = s["const"]
            if isinstance(c, str):
                out.append((c + "x", "not the const %r" % c))
            elif isinstance(c, bool):
                out.append((not c, "not the const %r" % c))
        if t in ("integer", "number"):
            if "minimum" in s:
                m = s["minimum"]
                out.append((m - 1 if isinstance(m, int) and t == "integer" else m - 0.5, "below minimum %s" % m))
            if "maximum" in s:
                m = s["maximum"]
                out.append((m + 1 if isinstance(m, int) and t == "integer" else m + 0.5, "above maximum %s" % m))
        if t == "string":
            if "maxLength" in s:
                out.append(("y" * (s["maxLength"] + 1), "longer than maxLength %d" % s["maxLength"]))
            if s.get("minLength", 0) > 0:
                out.append(("", "shorter than minLength %d" % s["minLength"]))
            if "pattern" in s:
                for bad in ("..", "a b", "x" * 129, "é", "", "-", "0001_t0", "ctx-"):
                    if not re.search(s["pattern"], bad):
                        out.append((bad, "off pattern %s" % s["pattern"]))
                        break
        if t == "array":
            if "maxItems" in s and s["maxItems"] < 1200:
                n = s["maxItems"] + 1
                item = v[0] if v else self.gen.draw(rng, s.get("items", {}))
                out.append(([copy.deepcopy(item) for _ in range(n)], "more than maxItems %d" % s["maxItems"]))
            if s.get("minItems", 0) > 0:
                out.append(([], "fewer than minItems %d" % s["minItems"]))
        if t == "object":
            if "maxProperties" in s:
                n = s["maxProperties"] + 1
                ap = s.get("additionalProperties", True)
                val = self.gen.draw(rng, ap) if isinstance(ap, dict) else "v"
                o = dict(v)
                i = 0
                while len(o) < n:
                    o["k%d" % i] = val
                    i += 1
                out.append((o, "more than maxProperties %d" % s["maxProperties"]))
            pn = s.get("propertyNames")
            if isinstance(pn, dict) and "pattern" in pn:
                o = dict(v)
                o["bad key!"] = "v"
                out.append((o, "a key off %s" % pn["pattern"]))
        return out

    def recent_keys(self, op):
        """Keys of earlier successes still kept (--idempotency-retention 600 s)."""
        now = time.monotonic()
        return [e for e in self.pools.idem.get(op.id, ()) if now - e[3] < 300]

    def build_replay(self, rng, op):
        prior = self.recent_keys(op)
        if not prior:
            return None
        key, first, first_resp, _ = rng.choice(prior)
        req = Request(op, "replay", first.method, first.path, list(first.query), dict(first.headers), first.body)
        req.json_body = first.json_body
        req.principal = first.principal
        req.ids = {"first": first_resp}
        return req

    # -- setup
    def setup(self):
        rng = random.Random(self.seed ^ 0x5EED)

        def run(op_id, path, body=_NO_BODY, method=None, query=None, headers=None, principal="admin"):
            op = self.ops_by_id[op_id]
            req = self.json_req(op, "valid", path, body, query, headers, principal=principal)
            if method:
                req.method = method
            return self.run(req, setup=True)

        def answer(resp, status):
            if resp is None or resp.status != status:
                return None
            try:
                return json.loads(resp.body)
            except ValueError:
                return None

        # A JWK Set file the admin token may name in PUT /v1/tenants/{id}/auth.
        self.jwks_file = os.path.join(os.path.abspath(self.server.workdir), "jwks.json")
        with open(self.jwks_file, "w", encoding="utf-8") as f:
            json.dump(FUZZ_JWKS, f)
        # Tenancy (the server runs with --admin-token): the fuzzer's own tenant and
        # its key (every scope but keys:admin), a few more tenants with keys.
        ten = self.ten
        t = answer(run("createTenant", "/v1/tenants", {"name": "fuzz key tenant"}), 201)
        if t:
            ten.live.pop(t["id"], None)
            k = answer(run("createKey", "/v1/tenants/%s/keys" % t["id"], {}), 201)
            if k:
                ten.keys.pop(k["id"], None)
                ten.key_tenant, ten.key_tenant_name = t["id"], t["name"]
                ten.key_secret, ten.key_id = k["key"], k["id"]
        for i in range(3):
            t = answer(run("createTenant", "/v1/tenants", {"name": self.tenant_name(rng, "fuzz tenant")}), 201)
            if t:
                run("createKey", "/v1/tenants/%s/keys" % t["id"], {"name": "k%d" % i, "scopes": ["threads:read"]})
        if ten.key_secret:
            for i in range(3):
                who = "key" if i < 2 else "admin@key"
                r = answer(run("createThread", "/v1/threads", {"metadata": {"fuzz": "key%d" % i}}, principal=who), 201)
                if r:
                    tid = r["thread_id"]
                    run("sendMessage", "/v1/threads/%s/messages" % tid,
                        {"content": "hello %d" % i, "user_id": "ku%d" % i}, principal=who)
                    run("addContextItem", "/v1/threads/%s/items" % tid, {"type": "text", "content": "item %d" % i},
                        principal=who)
                    run("createMemory", "/v1/memories", {"content": "remember %d" % i, "user_id": "ku%d" % i},
                        principal=who)
                    self.pools_of["key"].memory_users.append("ku%d" % i)

        resp = run("getConsole", "/")
        if resp is not None and resp.status == 200:
            files = sorted(set(re.findall(rb"/console/([A-Za-z0-9_.-]+)", resp.body)))
            self.pools.console_files = [f.decode() for f in files]
        for i in range(4):
            r = run("createThread", "/v1/threads", {"metadata": {"fuzz": str(i), "k": "v%d" % (i % 2)}})
            if r is not None and r.status == 201:
                tid = json.loads(r.body)["thread_id"]
                run("sendMessage", "/v1/threads/%s/messages" % tid, {"content": "hello %d" % i, "user_id": "u%d" % i})
                run("addContextItem", "/v1/threads/%s/items" % tid, {"type": "text", "content": "item %d" % i})
                run("createMemory", "/v1/memories", {"content": "remember %d" % i, "user_id": "u%d" % i})
                run("createMemory", "/v1/memories", {"content": "thread memory %d" % i, "thread_id": tid})
                self.pools.memory_users.append("u%d" % i)
        for i in range(3):
            r = run("createOrchestration", "/v1/orchestrations", {"payload": {"n": i}, "max_attempts": 2})
            if r is not None and r.status == 201:
                oid = json.loads(r.body)["id"]
                for j in range(2):
                    run("createSubtask", "/v1/tasks/%s/subtasks" % oid, {"payload": [i, j]})
        run("claimTask", "/v1/tasks/claim", {"worker": "w1", "lease_s": 60})
        run("claimTask", "/v1/tasks/claim", {"worker": "w1", "lease_s": 1})
        run("subscribeEvents", "/v1/events", query=[("last_event_id", "0-0")])
        del rng

    # -- the run
    def make(self, i, op):
        rng = self.rng_for(i)
        self.use(self.pick_principal(i, op))
        r = rng.random()
        if op.idempotent and r < 0.08:
            req = self.build_replay(rng, op)
            if req is not None:
                self.stats.replays += 1
                return req
        if r < 0.5:
            req = self.build_valid(rng, op)
            p = BUSY_OPS.get(op.id)
            if p and rng.random() < p:
                tid = None
                if op.id == "createChatCompletion":
                    b = req.json_body if isinstance(req.json_body, dict) else {}
                    tid = req.headers.get("Spindle-Thread-Id") or b.get("thread_id")
                elif req.ids.get("fact") is True:
                    tid = req.ids.get("id")
                if tid and tid in self.pools.threads:
                    req.ids["busy"] = tid
            return req
        kinds = [k for k, _ in INVALID_KINDS]
        weights = [w for _, w in INVALID_KINDS]
        for _ in range(8):
            kind = rng.choices(kinds, weights)[0]
            req = self.build_invalid(rng, op, kind)
            if req is not None:
                # "a request refused with a 4xx changes nothing": look at its thread before and after
                if op.path.startswith("/v1/threads/{id}") and req.ids.get("fact") is True \
                        and rng.random() < 0.2:
                    req.ids["snapshot"] = req.ids.get("id")
                return req
        return self.build_valid(rng, op)

    def fuzz(self, n, progress_every=1000):
        ops = self.spec.ops
        t0 = time.monotonic()
        for i in range(n):
            if self.fatal:
                break
            op = ops[i % len(ops)]
            self.current_i = i
            try:
                req = self.make(i, op)
            except GenError as e:
                raise RuntimeError("request %d (%s): %s" % (i, op.id, e))
            self.run(req)
            if progress_every and (i + 1) % progress_every == 0:
                self.log("%d requests, %.1f s, %d failures" % (i + 1, time.monotonic() - t0,
                                                               self.stats.failure_count))


class _NoBody:
    def __repr__(self):
        return "<no body>"


_NO_BODY = _NoBody()


# --------------------------------------------------------------------------
# main


def summary(fz, elapsed, healthz, exit_status, args):
    st = fz.stats
    per_op = {}
    for opid, o in st.per_op.items():
        per_op[opid] = {"method": o["method"], "path": o["path"], "requests": o["requests"],
                        "valid": o["valid"], "invalid": o["invalid"], "valid_2xx": o["valid_2xx"],
                        "seconds": round(o["seconds"], 2),
                        "status": {str(k): v for k, v in sorted(o["status"].items())}}
    return {
        "seed": args.seed, "requests": args.requests, "sent": st.total, "setup_requests": st.setup,
        "elapsed_s": round(elapsed, 2),
        "per_status": {str(k): v for k, v in sorted(st.per_status.items())},
        "per_kind": dict(sorted(st.per_kind.items())),
        "per_operation": per_op,
        "declared_503_504": dict(st.overload),
        "events_seen": dict(sorted(st.events_seen.items())),
        "idempotent_replays": st.replays,
        "busy_thread_streams": dict(st.busy),
        "per_principal": dict(sorted(st.per_principal.items())),
        "aux_requests": st.aux,
        "valid_refused_as_documented": {k: {"count": n, "example": st.refused_example.get(k)}
                                        for k, n in st.valid_refused.most_common()},
        "healthz_after": healthz,
        "server_exit_status": exit_status,
        "failures_total": st.failure_count,
        "failure_signatures": dict(st.signatures.most_common()),
        "failures": st.failures,
        "ok": st.failure_count == 0,
    }


def print_summary(rep, out):
    w = out.write
    w("\n== spindle OpenAPI fuzz: seed %s, %d requests (+%d setup, +%d busy-thread streams and reads) in %.1f s\n" % (
        rep["seed"], rep["sent"] - rep["setup_requests"] - rep["aux_requests"], rep["setup_requests"],
        rep["aux_requests"], rep["elapsed_s"]))
    w("status: %s\n" % ", ".join("%s x%d" % kv for kv in rep["per_status"].items()))
    w("kinds:  %s\n" % ", ".join("%s x%d" % kv for kv in rep["per_kind"].items()))
    w("who:    %s\n" % ", ".join("%s x%d" % kv for kv in rep["per_principal"].items()))
    w("%-24s %6s %6s %6s %6s %7s  %s\n" % ("operation", "sent", "valid", "2xx", "inval", "secs", "statuses"))
    for opid, o in rep["per_operation"].items():
        w("%-24s %6d %6d %6d %6d %7.2f  %s\n" % (opid, o["requests"], o["valid"], o["valid_2xx"], o["invalid"],
                                                o["seconds"], " ".join("%s:%d" % kv for kv in o["status"].items())))
    if rep["declared_503_504"]:
        w("declared 503/504 (not failures): %s\n" % rep["declared_503_504"])
    w("healthz after the run: %s; server exit status on SIGTERM: %s\n" % (
        rep["healthz_after"], rep["server_exit_status"]))
    if rep["failures_total"]:
        w("\nFAILURES: %d\n" % rep["failures_total"])
        for sig, n in list(rep["failure_signatures"].items())[:60]:
            w("  %5d  %s\n" % (n, sig))
        w("\nfirst failures with their requests:\n")
        seen = set()
        for f in rep["failures"]:
            key = (f["operation"], f["problem"][:80])
            if key in seen:
                continue
            seen.add(key)
            w("- %s [%s] %s\n  %s\n  -> %s %s\n" % (f["operation"], f["kind"], f["problem"], f["curl"][:1500],
                                                 f.get("status", "-"), f.get("response_body", "")[:300]))
            if len(seen) >= 40:
                break
    else:
        w("no failures\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="the spindle executable")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report", help="write the summary as JSON here")
    ap.add_argument("--spec", default=DEFAULT_SPEC, help="the OpenAPI document (default: docs/openapi.yaml)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--trace", help="write every request and its status to this file")
    args = ap.parse_args()

    def log(msg):
        if not args.quiet:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()

    spec = Spec(args.spec)
    workdir = tempfile.mkdtemp(prefix="spindle-fuzz-")
    token = "fuzz-token-%d" % args.seed
    server = Server(os.path.abspath(args.binary), token, workdir)

    def on_signal(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    t0 = time.monotonic()
    fz = None
    healthz = None
    exit_status = None
    interrupted = False
    try:
        server.start()
        fz = Fuzzer(spec, server, args.seed, log)
        if args.trace:
            fz.trace = open(args.trace, "w", encoding="utf-8")
        fz.connect()
        log("spindle serve on port %d; %d operations; %d requests, seed %d" % (
            server.port, len(spec.ops), args.requests, args.seed))
        fz.setup()
        fz.fuzz(args.requests)
        if server.alive():
            try:
                c = Conn("127.0.0.1", server.port)
                r = c.request(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "GET", 10)
                healthz = r.status
                c.close()
            except (Transport, OSError) as e:
                healthz = "no answer: %s" % e
    except KeyboardInterrupt as e:
        interrupted = True
        log("interrupted: %s" % e)
    finally:
        if fz is not None and fz.conn is not None:
            fz.conn.close()
        alive = server.alive()
        exit_status = server.stop()
        if not alive and fz is not None and not fz.fatal and server.proc is not None:
            exit_status = "died before the end: %s" % server.proc.returncode
    elapsed = time.monotonic() - t0
    if fz is None:
        sys.stderr.write(server.stderr_tail())
        shutil.rmtree(workdir, ignore_errors=True)
        return 2
    rep = summary(fz, elapsed, healthz, exit_status, args)
    ok = rep["ok"] and healthz == 200 and exit_status == 0 and not interrupted
    rep["ok"] = ok
    if healthz != 200:
        rep["problems_after"] = "GET /healthz after the run: %s" % healthz
    if exit_status != 0:
        rep["server_stderr_tail"] = server.stderr_tail()
    print_summary(rep, sys.stdout)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1, ensure_ascii=False)
    if ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print("server logs kept in %s" % workdir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
