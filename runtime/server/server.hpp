#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/runtime/limits.hpp"

namespace spindle {

class runtime;

namespace net {
class io_pool;
} // namespace net

/// How `spindle serve` listens and behaves.
struct server_options {
  /// Address to bind; loopback by default.
  std::string bind = "127.0.0.1";
  /// Port; 0 picks a free one (see `server::bind`).
  int port = 8080;
  /// When set, every route but /healthz and the console's page and files
  /// requires `Authorization: Bearer <token>`.
  std::string token;
  /// When set, tenancy is on (docs/tenants.md): this token manages tenants
  /// and keys, every other request needs a tenant's key, and each acts in
  /// its tenant only. `token` is then not used.
  std::string admin_token;
  /// Each tenant's limits on the model where it sets none of its own, and
  /// the implicit tenant's without tenancy (docs/limits.md); none by
  /// default.
  rate_limits default_limits;
  /// What is sent the provider as a whole; past it calls wait, tenants
  /// served by their weights (docs/limits.md, "The upstream"). Unbounded
  /// by default.
  upstream_limits upstream;
  /// Largest request body accepted; larger ones get 413.
  size_t body_limit = 1024 * 1024;
  /// Event-loop threads holding the connections; 0: one per core. Ignored
  /// when `loops` is given.
  size_t http_threads = 0;
  /// The event loops to serve on (shared with an OpenAI-compatible
  /// provider); null: the server starts `http_threads` of its own.
  std::shared_ptr<net::io_pool> loops;
  /// Threads for routes that wait on the runtime (every route but health,
  /// messages and streams, which never block a thread).
  size_t http_workers = 16;
  /// Open connections at once; past it a new one gets 503 and is closed.
  size_t max_connections = 10000;
  /// Request line plus headers, in bytes (431 past it).
  size_t header_limit = 32 * 1024;
  /// Header fields per request (431 past it).
  size_t max_headers = 100;
  /// Request target length (414 past it).
  size_t url_limit = 8 * 1024;
  /// A request's headers must arrive within this from its first byte.
  std::chrono::milliseconds header_timeout{10000};
  /// Its body within this after the headers.
  std::chrono::milliseconds body_timeout{30000};
  /// An idle kept-alive connection is closed after this.
  std::chrono::milliseconds keepalive_timeout{60000};
  /// Unsent bytes of a streamed reply a slow reader may fall behind by;
  /// past it the client is cut off and its reply stored as interrupted.
  /// A generation that can wait is paused long before (at 64 KiB, or half
  /// of this when smaller) and resumed once the client caught up.
  size_t stream_buffer = 1024 * 1024;
  /// The kernel's send buffer of each client connection (SO_SNDBUF); 0
  /// leaves it to the kernel's autotuning, which on loopback starts at
  /// about 4 MB a connection.
  size_t send_buffer = 0;
  /// How long a stopping server waits for in-flight requests.
  std::chrono::milliseconds shutdown_grace{10000};
  /// The encoding `POST /v1/tokens/count` uses for every model
  /// (`o200k_base`, `cl100k_base`); empty: the model's, from tiktoken's
  /// table (docs/tokens.md). A request's own `encoding` still wins.
  std::string tokenizer;
  /// How long the answer to a request with an Idempotency-Key is kept for
  /// its retries (docs/api.md, "Idempotent retries").
  std::chrono::seconds idempotency_retention{24 * 3600};
  /// When set, every answer is recorded in this directory for the
  /// contract's conformance check (recorder.hpp); `spindle serve` takes it
  /// from SPINDLE_RECORD_RESPONSES. Empty: nothing is recorded.
  std::string record_dir;
};

/// Counters of the connection layer (see /metrics).
struct server_stats {
  uint64_t open_connections = 0;
  uint64_t accepted = 0;
  uint64_t refused = 0;
  uint64_t timed_out = 0;
  uint64_t cut_off = 0;
  uint64_t streams_paused = 0;
  uint64_t stream_pauses = 0;
  /// Open connections of each event loop (`--http-threads` of them).
  std::vector<uint64_t> open_per_loop;
};

/// spindle's HTTP API (docs/api.md) over a running `runtime`, served on
/// event loops (docs/architecture.md, "Serving").
/// `bind` and `run` are called by one thread; `stop` may be called from any
/// thread, including while `run` blocks.
class server {
public:
  server(runtime& rt, server_options options);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds the listening socket and returns the port it listens on.
  /// Errors: `io_failure` naming the address; `storage_failure` when the
  /// data directory's `idempotency.db` cannot be opened.
  caf::expected<int> bind();

  /// Serves until `stop()`; returns once in-flight requests are done (or
  /// the shutdown grace ran out). Requires a successful `bind()`.
  void run();

  /// Connection counters. Thread-safe.
  server_stats stats() const;

  /// Every route's name ("GET /v1/threads/{id}"), as the router has them.
  std::vector<std::string> routes() const;

  /// Stops accepting connections; in-flight requests finish. Thread-safe,
  /// idempotent.
  void stop();

private:
  void add_connection_gauges();
  /// The body of GET /v1/stats over the last `window_s` seconds.
  std::string stats_body(int window_s);

  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace spindle
