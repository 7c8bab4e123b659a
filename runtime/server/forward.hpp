#pragma once
// Forwarding a request to the node that owns its thread (docs/cluster.md,
// "Forwarding"): plain HTTP between nodes, on the server's event loops.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "http.hpp"

namespace spindle::http {

/// The header a forwarded request carries: the name of the node that
/// forwarded it. A node never forwards a request that carries it.
inline constexpr const char* forwarded_header = "Spindle-Forwarded-By";

struct forward_options {
  /// Connecting to the owner.
  std::chrono::milliseconds connect_timeout{2000};
  /// The longest silence of the owner once connected (a queued message
  /// waits for its thread, a model thinks before its first token).
  std::chrono::milliseconds idle_timeout{600000};
};

/// Sends `req` to the node at `url` (http://host:port) on `loop` and passes
/// its answer to `res` as it comes: a whole reply as one, a streamed
/// (chunked) one piece by piece, so a forwarded stream's first event is as
/// early as the owner's. `from` names this node in `forwarded_header`.
/// When the owner cannot be reached, `res` gets 503 `not_owner` (nothing
/// happened there: send the request again); when it breaks off after the
/// request was sent, 503 `unavailable` saying the outcome is unknown (a
/// stream that began just ends). A client that goes away closes the
/// connection to the owner, which sees its client gone. `done` is called
/// once, with the status the client got.
void forward(boost::asio::io_context& loop, const std::string& url,
             const std::string& owner, const std::string& from,
             std::shared_ptr<request> req, responder_ptr res,
             forward_options options, std::function<void(int)> done);

} // namespace spindle::http
