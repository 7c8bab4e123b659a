// The HTTP API (docs/api.md) as a client can reach it: the input is sent
// as raw bytes to `spindle serve`'s server, in process, over loopback, so
// the request parser, the limits, the router and every route's query and
// body handling see it, with a real runtime behind them (state in memory,
// the offline provider).
//
// Invariants: every reply is an HTTP/1.1 status line; no request gets a
// 500 (a handler let an exception escape or broke an assumption).

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.hpp"
#include "core/logging.hpp"
#include "spindle/runtime/runtime.hpp"
#include "server/server.hpp"

using namespace spindle;
using spindle::fuzz::check;

namespace {

struct served {
  std::unique_ptr<runtime> rt;
  std::unique_ptr<server> srv;
  int port = 0;
};

served* the_server = nullptr;

std::string exchange(std::string_view input);

// Started once per process and never stopped: its threads serve until the
// process ends. Tearing it down in an exit handler would race the static
// destructors that run before it (a handler runs after every static
// constructed later), so the process leaves at once instead, once what the
// first requests construct lazily (the metrics' buckets, ...) exists and its
// destructors are ordered after the handler. libFuzzer reaches exit() only
// after a run without findings; a finding leaves through _Exit or abort.
int port() {
  if (the_server)
    return the_server->port;
  (void) setup_logging("off", "text");
  auto s = new served;
  runtime_options opts;
  opts.scheduler_threads = 2;
  opts.default_timeout = std::chrono::milliseconds(2000);
  s->rt = std::make_unique<runtime>(opts);
  server_options http;
  http.port = 0;
  http.http_threads = 1;
  http.http_workers = 2;
  http.header_timeout = std::chrono::milliseconds(2000);
  http.body_timeout = std::chrono::milliseconds(2000);
  http.shutdown_grace = std::chrono::milliseconds(2000);
  s->srv = std::make_unique<server>(*s->rt, http);
  auto bound = s->srv->bind();
  check(static_cast<bool>(bound), "the server binds");
  s->port = *bound;
  the_server = s;
  exchange("GET /healthz HTTP/1.1\r\n\r\n");
  exchange("POST /v1/threads HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  std::atexit([] { std::_Exit(0); });
  return s->port;
}

// libFuzzer's timer (SIGALRM, every timeout / 2 + 1 seconds) interrupts
// whatever call it lands in, without SA_RESTART: an interrupted connect()
// goes on in the background and is waited for here; send() and recv()
// are called again.
int settle(int fd, int error) {
  if (error != EINTR)
    return error;
  pollfd p{fd, POLLOUT, 0};
  int n;
  while ((n = ::poll(&p, 1, 5000)) < 0 && errno == EINTR) {
  }
  if (n == 0)
    return ETIMEDOUT;
  socklen_t size = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0)
    return errno;
  return error;
}

// Sends `input`, half-closes, and reads the replies until the server
// closes (or 5 s pass: a stream the client never ends).
std::string exchange(std::string_view input) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // The client half-closes first, so each exchange leaves its connection
  // in TIME_WAIT for a minute; tens of thousands a minute from one source
  // address would run its ephemeral ports out wherever the kernel does not
  // reuse them early (connect() then fails with EADDRNOTAVAIL: a finding
  // about the harness, not the server). Each exchange leaves from the next
  // of 250 loopback addresses, each with ports of its own, and one whose
  // ports are spent is passed over for the next. Any other failure to
  // connect is the server's.
  static unsigned next_source = 0;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    check(fd >= 0, "a socket");
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + next_source++ % 250);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int error = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0)
      error = errno;
    else if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr))
             != 0)
      error = settle(fd, errno);
    if (error == 0)
      break;
    ::close(fd);
    fd = -1;
    bool ports_spent = error == EADDRNOTAVAIL || error == EADDRINUSE;
    if (!ports_spent || attempt == 250) {
      std::fprintf(stderr, "connect (attempt %d): %s\n", attempt + 1,
                   std::strerror(error));
      check(false, "the server accepts");
    }
  }
  size_t sent = 0;
  while (sent < input.size()) {
    auto n = ::send(fd, input.data() + sent, input.size() - sent,
                    MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; // the server refused and closed: its reply is still read
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0
         || (n < 0 && errno == EINTR))
    if (n > 0)
      reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return reply;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto reply = exchange(fuzz::text(data, size));
  // Every status line of the replies (pipelined requests get several).
  for (size_t at = reply.find("HTTP/1.1 "); at != std::string::npos;
       at = reply.find("\r\nHTTP/1.1 ", at + 1)) {
    if (reply.compare(at, 2, "\r\n") == 0)
      at += 2;
    check(reply.size() >= at + 12, "a status line is whole");
    check(reply.compare(at + 9, 3, "500") != 0, "no request gets a 500");
  }
  check(reply.empty() || reply.compare(0, 9, "HTTP/1.1 ") == 0,
        "a reply starts with a status line");
  return 0;
}
