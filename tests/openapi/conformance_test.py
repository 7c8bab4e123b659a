#!/usr/bin/env python3
"""The conformance check catches what it is for: a real server's recorded
answers pass, and each way of changing an answer so that it breaks the
document (a field's type, a required field dropped, an undeclared field, an
undeclared status, a streamed event's data, an unknown event, a 500, an
unknown route answered 200) is reported.

Usage: conformance_test.py SPINDLE_BINARY"""
import copy
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from contract import Contract  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DOCUMENT = os.path.join(HERE, "..", "..", "docs", "openapi.yaml")
BINARY = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Conformance(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.contract = Contract(DOCUMENT)
        cls.dir = tempfile.TemporaryDirectory()
        port = free_port()
        env = dict(os.environ, SPINDLE_RECORD_RESPONSES=cls.dir.name)
        server = subprocess.Popen(
            [BINARY, "serve", "--port", str(port), "--data", ":memory:",
             "--log-level", "warn"], env=env, stdout=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    if request(port, "GET", "/healthz")[0] == 200:
                        break
                except OSError:
                    time.sleep(0.05)
            request(port, "POST", "/v1/threads", {"metadata": {"a": "b"}})
            request(port, "POST", "/v1/threads/conf-1/messages",
                    {"content": "hello"})
            request(port, "POST", "/v1/threads/conf-1/messages/stream",
                    {"content": "again"})
            request(port, "GET", "/v1/threads/conf-1/history")
            request(port, "GET", "/v1/threads/conf-1/nothing-here")
            request(port, "POST", "/v1/orchestrations", {"payload": "p"})
        finally:
            server.terminate()
            server.wait(timeout=30)
        cls.records = []
        for name in os.listdir(cls.dir.name):
            with open(os.path.join(cls.dir.name, name)) as f:
                cls.records += [json.loads(line) for line in f]

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def problems(self, r):
        return self.contract.check(r["method"], r["target"], r["status"],
                                   r["content_type"], r["headers"], r["body"],
                                   r["streamed"], r["complete"],
                                   r["truncated"])

    def record(self, method, target_prefix):
        for r in self.records:
            if r["method"] == method and r["target"].startswith(target_prefix):
                return copy.deepcopy(r)
        self.fail(f"no recorded answer to {method} {target_prefix}")

    def changed_body(self, r, change):
        body = json.loads(r["body"])
        change(body)
        r["body"] = json.dumps(body)
        return r

    def test_recorded_answers_pass(self):
        self.assertGreaterEqual(len(self.records), 7)
        for r in self.records:
            self.assertEqual(self.problems(r), [], r["target"])

    def test_a_field_of_the_wrong_type_fails(self):
        r = self.record("POST", "/v1/threads/conf-1/messages")
        r = self.changed_body(r, lambda b: b.update(turns="many"))
        self.assertTrue(self.problems(r))

    def test_a_required_field_dropped_fails(self):
        r = self.record("POST", "/v1/threads/conf-1/messages")
        r = self.changed_body(r, lambda b: b.pop("reply"))
        self.assertTrue(self.problems(r))

    def test_an_undeclared_field_fails(self):
        r = self.record("GET", "/v1/threads/conf-1/history")
        r = self.changed_body(r, lambda b: b.update(surprise=1))
        self.assertTrue(self.problems(r))

    def test_an_undeclared_status_fails(self):
        r = self.record("POST", "/v1/threads/conf-1/messages")
        r["status"] = 418
        self.assertTrue(self.problems(r))

    def test_a_500_fails(self):
        r = self.record("POST", "/v1/threads/conf-1/messages")
        r["status"] = 500
        r["body"] = json.dumps({"code": "internal", "message": "x"})
        self.assertTrue(self.problems(r))

    def test_a_broken_event_fails(self):
        r = self.record("POST", "/v1/threads/conf-1/messages/stream")
        self.assertTrue(r["streamed"])
        self.assertIn("event: delta", r["body"])
        broken = r["body"].replace("event: delta\ndata: ",
                                   "event: delta\ndata: {\"nope\":", 1)
        self.assertNotEqual(broken, r["body"])
        r["body"] = broken
        self.assertTrue(self.problems(r))

    def test_an_unknown_event_fails(self):
        r = self.record("POST", "/v1/threads/conf-1/messages/stream")
        r["body"] += "event: surprise\ndata: {}\n\n"
        self.assertTrue(self.problems(r))

    def test_a_route_the_document_lacks_fails_unless_404(self):
        r = self.record("GET", "/v1/threads/conf-1/nothing-here")
        self.assertEqual(r["status"], 404)
        self.assertEqual(self.problems(r), [])
        r["status"] = 200
        self.assertTrue(self.problems(r))


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
