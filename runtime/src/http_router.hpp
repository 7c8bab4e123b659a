#pragma once

// The HTTP layer's private toolkit: a router over cpp-httplib that turns
// handler exceptions into spindle's JSON errors, strict JSON body parsing,
// and per-request context for the log line and the metrics.

#include <chrono>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/runtime/server.hpp"

namespace spindle {

class runtime;
class http_metrics;

namespace http {

using json = nlohmann::json;

/// An error reply: `{"error":{"code":..., "message":...}}` with `status`.
/// Handlers throw it; the router catches it at the edge.
struct api_error {
  int status;
  std::string code;
  std::string message;
};

/// Maps a spindle error to its reply (invalid_id -> 400, not_found -> 404,
/// conflict -> 409, timeout -> 504, upstream_failure -> 502, ...).
api_error to_api_error(const caf::error& err);

/// Throws `to_api_error(err)`.
[[noreturn]] void fail(const caf::error& err);

/// What a handler tells the request log besides route, status and latency
/// (thread_id, turns_loaded, found_or_created, thread_actor, ...).
struct request_context {
  json log = json::object();
};

using handler
  = std::function<void(const httplib::Request&, httplib::Response&,
                       request_context&)>;

/// Parses a JSON object body. Every key must be in `allowed` (unknown
/// fields are refused, naming them); an empty body counts as {} only if
/// `allow_empty`. Throws api_error 400 `malformed` / `unknown_field`.
json parse_body(const httplib::Request& req,
                std::initializer_list<const char*> allowed,
                bool allow_empty = false);

/// Field accessors: throw 400 `malformed` naming the field and the type it
/// must have. `optional_*` return nullopt for an absent or null field.
std::string required_string(const json& body, const char* field);
std::optional<std::string> optional_string(const json& body,
                                           const char* field);
std::optional<int64_t> optional_int(const json& body, const char* field);

/// Query parameter as an integer; throws 400 `invalid_argument` naming it
/// when present but not an integer.
std::optional<int64_t> query_int(const httplib::Request& req,
                                 const char* name);

/// Sends `body` as JSON with `status`.
void reply(httplib::Response& res, int status, const json& body);

/// Serializes JSON safely (invalid UTF-8 replaced, never throws).
std::string dump(const json& value);

/// Registers routes; each wraps its handler with auth, error handling,
/// logging and metrics.
class router {
public:
  router(httplib::Server& svr, runtime& rt, const server_options& options,
         http_metrics& metrics);

  void get(const std::string& pattern, const std::string& route, handler h);
  void post(const std::string& pattern, const std::string& route, handler h);
  void del(const std::string& pattern, const std::string& route, handler h);

  runtime& rt() noexcept {
    return rt_;
  }
  const server_options& options() const noexcept {
    return options_;
  }
  http_metrics& metrics() noexcept {
    return metrics_;
  }

  /// Wraps `h` with auth (unless `open`), error handling, log, metrics.
  httplib::Server::Handler wrap(const std::string& route, handler h,
                                bool open = false);

private:
  httplib::Server& svr_;
  runtime& rt_;
  const server_options& options_;
  http_metrics& metrics_;
};

// Route groups, one file each (server_<group>.cpp).
void add_id_routes(router& r);
void add_thread_routes(router& r);
void add_item_routes(router& r);
void add_memory_routes(router& r);
void add_task_routes(router& r);

} // namespace http
} // namespace spindle
