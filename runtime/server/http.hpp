#pragma once

// The HTTP layer's request, response and responder: what a route handler
// sees. The connections behind them live in http_server.cpp.

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/runtime/flow.hpp"

namespace spindle::tenancy {
struct principal;
} // namespace spindle::tenancy

namespace spindle::http {

/// One request, read whole (header and body) before a handler sees it.
struct request {
  std::string method;
  /// The request target as sent ("/v1/threads/a%2Fb/messages?x=1").
  std::string target;
  /// The path of the target, percent-decoded.
  std::string path;
  /// Query parameters, percent-decoded ('+' is a space).
  std::multimap<std::string, std::string> params;
  /// Header fields in arrival order, names as sent.
  std::vector<std::pair<std::string, std::string>> headers;
  /// Where in `headers` the server found `Authorization` and
  /// `Spindle-Tenant` as it read them (-1: none), so that authenticating
  /// a request does not search its headers; `indexed` is false for a
  /// request made some other way, whose lookups search.
  int authorization_at = -1;
  int tenant_at = -1;
  bool indexed = false;
  std::string body;
  /// matches[0] is the path; matches[i] the i-th `{}` segment of the route.
  std::vector<std::string> matches;
  /// The peer, "address:port", for logs.
  std::string remote;
  /// Who it acts for, once the router authenticated it (null before, and
  /// on routes open to all).
  std::shared_ptr<const tenancy::principal> who;

  bool has_param(const std::string& name) const {
    return params.count(name) > 0;
  }
  /// The first value of `name`, or "".
  std::string get_param_value(const std::string& name) const;
  /// The first header named `name` (case-insensitive), or "".
  std::string get_header_value(std::string_view name) const;
  /// The same without a copy: empty when there is none.
  std::string_view header_view(std::string_view name) const;
  /// True if a header named `name` is present (case-insensitive).
  bool has_header(std::string_view name) const;
  /// The `Authorization` header ("" without one).
  std::string_view authorization() const;
  /// The `Spindle-Tenant` header ("" without one).
  std::string_view tenant_header() const;

private:
  /// The header at `at` of `headers` when indexed, else searched by name.
  std::string_view indexed_header(int at, std::string_view name) const;
};

/// A complete reply.
struct response {
  int status = -1;
  std::string body;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;

  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
};

/// The reason phrase of a status ("OK", "Not Found", ...).
const char* reason_phrase(int status);

/// Percent-decodes `text`; with `plus_is_space`, '+' becomes ' '.
std::string percent_decode(std::string_view text, bool plus_is_space);

/// Splits a query string into decoded parameters.
std::multimap<std::string, std::string> parse_query(std::string_view query);

/// The connection's side of one request, for a handler that answers later
/// or streams. Every member function is thread-safe; the first `send` or
/// `begin_stream` wins, later ones are ignored. A handler that drops its
/// last reference without answering gets a 500 sent for it.
class responder {
public:
  virtual ~responder();

  /// Sends a complete reply.
  virtual void send(response res) = 0;

  /// Starts a streamed reply (chunked transfer encoding) with `status`,
  /// `content_type` and `headers`.
  virtual void begin_stream(int status, std::string content_type,
                            std::vector<std::pair<std::string, std::string>>
                              headers)
    = 0;

  /// Queues `chunk` of a streamed reply. Returns false once the client is
  /// gone, or has fallen so far behind that its unsent reply passed the
  /// server's stream buffer limit (the connection is then closed): the
  /// producer should stop.
  virtual bool write(std::string chunk) = 0;

  /// The stream's backpressure: paused while the client's unsent reply is
  /// past the high-water mark, resumed once it is down to the low one. A
  /// producer that honours it never reaches the stream buffer limit.
  virtual std::shared_ptr<flow_control> flow() = 0;

  /// Ends a streamed reply.
  virtual void end_stream() = 0;

  /// True once the client closed its connection or was cut off.
  virtual bool gone() const noexcept = 0;

  /// Runs `f` once when the client goes away before the reply ended (at
  /// once if it already has). Runs on the connection's loop thread.
  virtual void on_gone(std::function<void()> f) = 0;
};

using responder_ptr = std::shared_ptr<responder>;

} // namespace spindle::http
