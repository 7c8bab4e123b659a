#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <caf/expected.hpp>

namespace spindle {

class runtime;

/// How `spindle serve` listens and behaves.
struct server_options {
  /// Address to bind; loopback by default.
  std::string bind = "127.0.0.1";
  /// Port; 0 picks a free one (see `server::bind`).
  int port = 8080;
  /// When set, every route but /healthz requires `Authorization: Bearer
  /// <token>`.
  std::string token;
  /// Largest request body accepted; larger ones get 413.
  size_t body_limit = 1024 * 1024;
  /// Threads serving HTTP connections (each handles one connection at a
  /// time).
  size_t http_threads = 64;
  /// How long a stopping server waits for in-flight requests.
  std::chrono::milliseconds shutdown_grace{10000};
};

/// spindle's HTTP API (docs/api.md) over a running `runtime`.
/// `bind` and `run` are called by one thread; `stop` may be called from any
/// thread, including while `run` blocks.
class server {
public:
  server(runtime& rt, server_options options);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds the listening socket and returns the port it listens on.
  /// Errors: `io_failure` naming the address.
  caf::expected<int> bind();

  /// Serves until `stop()`; returns once in-flight requests are done (or
  /// the shutdown grace ran out). Requires a successful `bind()`.
  void run();

  /// Stops accepting connections; in-flight requests finish. Thread-safe,
  /// idempotent.
  void stop();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace spindle
