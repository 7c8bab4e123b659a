#pragma once

// An HTTP/1.1 server on event loops (Boost.Asio, Beast's parser): every
// connection lives on one loop of an io_pool and nothing on a loop blocks.
// It knows no routes: a dispatch function receives each complete request
// with a responder (http.hpp). docs/architecture.md, "Serving", has the
// picture; docs/api.md, "Limits", the limits below.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "http.hpp"

namespace spindle::net {
class io_pool;
} // namespace spindle::net

namespace spindle::http {

/// What one connection may cost the server.
struct limits {
  /// Open connections at once; a connection past it gets 503 and is closed.
  size_t max_connections = 10000;
  /// Request line and header fields together, in bytes (431 past it).
  size_t header_bytes = 32 * 1024;
  /// Header fields of one request (431 past it).
  size_t header_count = 100;
  /// Length of the request target (414 past it).
  size_t url_bytes = 8 * 1024;
  /// Request body (413 past it).
  size_t body_bytes = 1024 * 1024;
  /// A request's line and headers must arrive within this, from its first
  /// byte (a new connection: from the accept).
  std::chrono::milliseconds header_timeout{10000};
  /// Its body must arrive within this after the headers.
  std::chrono::milliseconds body_timeout{30000};
  /// A kept-alive connection may wait this long for its next request.
  std::chrono::milliseconds keepalive_timeout{60000};
  /// Unsent bytes of a streamed reply a slow client may fall behind by
  /// before it is cut off (its producer is told to stop). A producer that
  /// honours the stream's flow control is paused long before: past 64 KiB
  /// unsent, or half this when that is smaller.
  size_t stream_buffer = 1024 * 1024;
  /// SO_SNDBUF of each connection; 0 leaves it to the kernel.
  size_t send_buffer = 0;
};

/// Counters of the connection layer, read at any time. Thread-safe.
struct connection_stats {
  uint64_t open = 0;
  uint64_t accepted = 0;
  uint64_t refused = 0;   // over max_connections
  uint64_t timed_out = 0; // header, body or keep-alive timeouts
  uint64_t cut_off = 0;   // slow stream readers past stream_buffer
  uint64_t paused = 0;    // streams whose producer waits for a slow reader
  uint64_t pauses = 0;    // times a stream's producer was paused
  /// Open connections of each event loop, in the loops' order: a loop
  /// takes up to 16 before the next gets one, past that a new one goes to
  /// the loop holding the fewest.
  std::vector<uint64_t> open_per_loop;
};

/// Receives each complete request on the connection's loop thread. It must
/// not block; it answers through the responder, now or later.
using dispatch_fn
  = std::function<void(std::shared_ptr<request>, responder_ptr)>;

/// Replies to a request refused before dispatch (bad request line, headers
/// too large, body too large, ...): status, code and message.
using refusal_fn = std::function<response(const request& partial, int status,
                                          const std::string& message)>;

class http_server {
public:
  http_server(net::io_pool& loops, limits lim, dispatch_fn dispatch,
              refusal_fn refuse);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// Binds and listens; returns the port (a free one for port 0).
  /// Errors: io_failure naming the address.
  caf::expected<int> listen(const std::string& address, int port);

  /// Stops accepting, closes connections waiting for a request, and lets
  /// the others finish their current request. Thread-safe, idempotent.
  void stop();

  /// True after stop().
  bool stopping() const noexcept;

  /// Blocks until stop() was called and every connection is closed, or
  /// until `deadline`; returns true when drained.
  bool wait_drained(std::chrono::steady_clock::time_point deadline);

  connection_stats stats() const;

  struct impl;

private:
  std::shared_ptr<impl> impl_;
};

} // namespace spindle::http
