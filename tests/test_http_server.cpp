// The connection layer in-process (runtime/server/http_server.hpp): a
// dispatch function of the test's own answers through the responder, so a
// test can call it from the threads and in the orders real routes do.

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "http_server.hpp"
#include "net/io_pool.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono;

namespace {

// A server on its own loops answering every request with `handler`.
struct in_process {
  explicit in_process(http::dispatch_fn handler, size_t loops = 1)
    : pool(loops),
      server(pool, http::limits{}, std::move(handler),
             [](const http::request&, int status, const std::string& m) {
               http::response r;
               r.status = status;
               r.set_content(m, "text/plain");
               return r;
             }) {
    auto p = server.listen("127.0.0.1", 0);
    REQUIRE(p);
    port = *p;
  }
  ~in_process() {
    server.stop();
    server.wait_drained(steady_clock::now() + seconds{5});
  }
  net::io_pool pool;
  http::http_server server;
  int port = 0;
};

// Sends a GET with Connection: close and reads until the server closes
// (or `timeout`); `closed` says which.
struct raw_reply {
  std::string bytes;
  bool closed = false;
};

raw_reply get(int port, const std::string& path,
              milliseconds timeout = milliseconds{5000}) {
  raw_reply out;
  test::fd_guard guard;
  int fd = test::connect_to(port);
  REQUIRE(fd >= 0);
  guard.fds.push_back(fd);
  REQUIRE(test::send_all(fd, "GET " + path
                                  + " HTTP/1.1\r\nHost: x\r\n"
                                    "Connection: close\r\n\r\n"));
  auto deadline = steady_clock::now() + timeout;
  char buf[16384];
  while (steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0)
      continue;
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      out.closed = true;
      break;
    }
    out.bytes.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// The body of a chunked reply, or "<malformed: ...>" when its framing is
// wrong (a chunk before the head, data after the last chunk, ...).
std::string dechunk(const std::string& raw) {
  if (raw.compare(0, 12, "HTTP/1.1 200") != 0)
    return "<malformed: no status line first>";
  auto at = raw.find("\r\n\r\n");
  if (at == std::string::npos)
    return "<malformed: no end of head>";
  std::string body;
  size_t pos = at + 4;
  while (true) {
    auto eol = raw.find("\r\n", pos);
    if (eol == std::string::npos)
      return "<malformed: no last chunk>";
    auto size = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (size == 0) {
      if (raw.size() != eol + 4)
        return "<malformed: bytes after the last chunk>";
      return body;
    }
    body += raw.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

} // namespace

TEST_CASE("http server: a stream begun on the loop and ended at once by "
          "another thread goes out in the order it was written") {
  // The route's handler begins the stream and writes on the loop thread;
  // another thread (an upstream's loop answering at once) writes the rest
  // and ends it before the handler has returned.
  in_process s{[](std::shared_ptr<http::request>, http::responder_ptr r) {
    r->begin_stream(200, "text/plain", {});
    r->write("a");
    std::thread other{[r] {
      r->write("b");
      r->write("c");
      r->end_stream();
    }};
    other.join();
  }};
  for (int i = 0; i < 20; ++i) {
    auto reply = get(s.port, "/");
    INFO(reply.bytes);
    CHECK(dechunk(reply.bytes) == "abc");
    CHECK(reply.closed); // Connection: close is honoured after the end
  }
}

TEST_CASE("http server: 64 concurrent streams written by a loop thread and "
          "a producer thread each arrive whole and in order") {
  constexpr int pieces = 200;
  auto expected = [] {
    std::string e;
    for (int i = 0; i < pieces; ++i)
      e += std::to_string(i) + ",";
    return e;
  }();
  // The first pieces on the loop, the rest on a producer thread that the
  // handler does not wait for, so producers and loops run at once.
  std::mutex mx;
  std::vector<std::thread> producers;
  auto join_producers = [&] {
    std::lock_guard<std::mutex> guard{mx};
    for (auto& t : producers)
      t.join();
    producers.clear();
  };
  in_process s{[&](std::shared_ptr<http::request>, http::responder_ptr r) {
                 r->begin_stream(200, "text/plain", {});
                 for (int i = 0; i < 3; ++i)
                   r->write(std::to_string(i) + ",");
                 std::lock_guard<std::mutex> guard{mx};
                 producers.emplace_back([r] {
                   for (int i = 3; i < pieces; ++i)
                     r->write(std::to_string(i) + ",");
                   r->end_stream();
                 });
               },
               2};
  std::vector<raw_reply> replies(64);
  std::vector<std::thread> clients;
  for (size_t c = 0; c < replies.size(); ++c)
    clients.emplace_back([&, c] { replies[c] = get(s.port, "/"); });
  for (auto& t : clients)
    t.join();
  join_producers(); // before the server and its loops go
  for (auto& reply : replies) {
    INFO(reply.bytes.substr(0, 300));
    CHECK(dechunk(reply.bytes) == expected);
    CHECK(reply.closed);
  }
}

TEST_CASE("http server: Authorization and Spindle-Tenant are found as the "
          "headers are read, in any case, and a request made in code finds "
          "them by searching") {
  in_process s{[](std::shared_ptr<http::request> req, http::responder_ptr r) {
    http::response res;
    res.status = 200;
    res.set_content(std::string{req->authorization()} + "|"
                      + std::string{req->tenant_header()} + "|"
                      + (req->indexed ? "indexed" : "searched"),
                    "text/plain");
    r->send(std::move(res));
  }};
  auto ask = [&](const std::string& headers) {
    test::fd_guard guard;
    int fd = test::connect_to(s.port);
    REQUIRE(fd >= 0);
    guard.fds.push_back(fd);
    REQUIRE(test::send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n" + headers
                                 + "Connection: close\r\n\r\n"));
    std::string bytes;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0)
      bytes.append(buf, static_cast<size_t>(n));
    auto at = bytes.find("\r\n\r\n");
    REQUIRE(at != std::string::npos);
    return bytes.substr(at + 4);
  };
  CHECK(ask("Authorization: Bearer k1\r\nSpindle-Tenant: t1\r\n")
        == "Bearer k1|t1|indexed");
  CHECK(ask("authorization: Bearer k2\r\nSPINDLE-TENANT: t2\r\n")
        == "Bearer k2|t2|indexed");
  // Others beside and between them; the first of a repeated one counts.
  CHECK(ask("X-A: 1\r\nspindle-tenant: t3\r\nX-Spindle-Tenant: no\r\n"
            "AUTHORIZATION: Bearer k3\r\nAuthorization: Bearer later\r\n")
        == "Bearer k3|t3|indexed");
  CHECK(ask("X-Authorization: Bearer no\r\n") == "||indexed");

  http::request made;
  made.headers = {{"x-a", "1"}, {"AUTHORIZATION", "Bearer k4"},
                  {"Spindle-tenant", "t4"}};
  CHECK(made.authorization() == "Bearer k4");
  CHECK(made.tenant_header() == "t4");
  CHECK(http::request{}.authorization().empty());
}
