#pragma once

// The HTTP layer's private toolkit: a router over http_server that turns
// handler exceptions into spindle's JSON errors, strict JSON body parsing,
// and per-request context for the log line and the metrics.
//
// Two kinds of handler. A blocking handler (`get`, `post`, `del`) may wait
// on the runtime; it runs on the router's worker threads, never on an event
// loop. An asynchronous handler (`get_async`, `post_async`) runs on the
// connection's loop, must not block, and answers through its `async_call`,
// now or later from any thread.

#include <atomic>
#include <chrono>
#include <memory>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <mutex>
#include <vector>

#include <caf/error.hpp>
#include <nlohmann/json.hpp>

#include "http.hpp"
#include "spindle/runtime/limits.hpp"
#include "tenancy/scopes.hpp"
#include "spindle/messages/threads.hpp"
#include "server/server.hpp"

namespace boost::asio {
class thread_pool;
} // namespace boost::asio

namespace spindle::net {
class io_pool;
} // namespace spindle::net

namespace spindle {

namespace tenancy {
struct principal;
class tenant_store;
} // namespace tenancy

class runtime;
class http_metrics;

namespace http {

class idempotency_store;

using json = nlohmann::json;

/// An error reply with `status`: `{"error":{"code":..., "message":...,
/// "type":..., "param":...}}`, a superset of OpenAI's error object (`type`
/// follows from the status, `param` names the offending field or is null).
/// Handlers throw it; the router catches it at the edge.
struct api_error {
  int status;
  std::string code;
  std::string message;
  std::string param = {};
};

/// OpenAI's error type for an HTTP status: invalid_request_error (400,
/// 413, 422, 431), authentication_error (401), permission_error (403),
/// not_found_error (404), conflict_error (409), rate_limit_error (429),
/// timeout_error (504), api_error (other 5xx).
const char* error_type(int status) noexcept;

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

/// Who may use a route while tenancy is on.
enum class access : uint8_t {
  /// Everyone, authenticated or not (health, the console's files, the
  /// API's description).
  open,
  /// Any principal: the admin token or a key.
  any,
  /// A principal acting in a tenant, with the route's scope.
  tenant,
  /// The admin token only.
  admin,
  /// The admin token, or a key with `keys:admin` for its own tenant.
  tenant_admin,
};

struct route_rule {
  access who = access::tenant;
  tenancy::scope scope = tenancy::scope::threads_read;
};

/// What authenticating a request came to.
struct auth_outcome {
  std::shared_ptr<const tenancy::principal> who;
  /// The refusal (401, 403, 404), when refused.
  std::optional<api_error> refusal;
  /// The answer needs the store (a key not cached, a tenant named by the
  /// admin token): ask again where blocking is allowed.
  bool needs_store = false;
};

using handler
  = std::function<void(const request&, response&, request_context&)>;

class router;

/// One request of an asynchronous handler: answers exactly once (logged and
/// counted then). Thread-safe: `send`, `reply`, `fail` and the stream calls
/// may come from any thread, one at a time.
class async_call {
public:
  async_call(router& r, std::string route, std::shared_ptr<request> req,
             responder_ptr res);
  ~async_call();

  /// Fields for the request's log line; touch from one thread at a time.
  request_context ctx;

  const request& req() const noexcept {
    return *req_;
  }

  /// Sends `res` (a status of -1 becomes 200).
  void send(response res);
  /// Sends `body` as JSON with `status`.
  void reply(int status, const json& body);
  /// Sends the error reply of `e`.
  void fail(const api_error& e);
  void fail(const caf::error& err);

  /// Headers the answer carries whatever it is (a reply, an error or a
  /// stream): OpenAI's `x-ratelimit-*` (docs/limits.md). Takes effect for
  /// an answer not yet sent.
  void add_headers(std::vector<std::pair<std::string, std::string>> h);

  /// Starts a streamed reply; the request is logged when it ends.
  void begin_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers);
  /// A chunk of the stream; false once the client is gone or cut off.
  bool write(std::string chunk);
  /// Ends the stream.
  void end_stream();
  /// True once the client went away.
  bool gone() const noexcept;
  /// The stream's backpressure (http.hpp, responder::flow).
  std::shared_ptr<flow_control> flow();
  /// Runs `f` on the connection's loop when the client goes away.
  void on_gone(std::function<void()> f);

private:
  void finish(int status);

  router& router_;
  std::string route_;
  std::shared_ptr<request> req_;
  responder_ptr res_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<bool> done_{false};
  int stream_status_ = 0;
  std::mutex headers_mx_;
  std::vector<std::pair<std::string, std::string>> headers_;
};

using async_handler
  = std::function<void(std::shared_ptr<async_call>)>;

/// An exchange's `on_limits` that puts the tenant's `x-ratelimit-*`
/// headers (and a refusal's `Retry-After`) on `call`'s answer.
std::function<void(const rate_state&)>
limits_to(const std::shared_ptr<async_call>& call);

/// Parses a JSON object body. Every key must be in `allowed` (unknown
/// fields are refused, naming them); an empty body counts as {} only if
/// `allow_empty`. Throws api_error 400 `malformed` / `unknown_field`.
json parse_body(const request& req,
                std::initializer_list<const char*> allowed,
                bool allow_empty = false);

/// Field accessors: throw 400 `malformed` naming the field and the type it
/// must have. `optional_*` return nullopt for an absent or null field.
std::string required_string(const json& body, const char* field);
std::optional<std::string> optional_string(const json& body,
                                           const char* field);
std::optional<int64_t> optional_int(const json& body, const char* field);

/// The text of a chat message's content (`param` names it in errors, e.g.
/// `messages[2].content`): a string, or an array of parts of type `text`,
/// concatenated. Throws 400 `invalid_argument` for anything else.
std::string chat_content_text(const json& content, const std::string& param);

/// The body's `tools` and `tool_choice` in OpenAI's form (docs/api.md,
/// "Tools"), checked, as JSON texts for `completion_options`; absent,
/// null or an empty `tools` leaves both empty. Throws 400
/// `invalid_argument` or 413 `too_large` naming the field.
void parse_tools(const json& body, std::string& tools,
                 std::string& tool_choice);

/// The thread ID of the path's first `{}` segment, validated (D10); "new"
/// only where allowed (400 `invalid_id` otherwise).
std::string path_thread(const request& req, bool allow_new);

/// Refuses (400 `unknown_field`) query parameters not in `allowed`.
void only_params(const request& req,
                 std::initializer_list<const char*> allowed);

/// Refuses (400 `invalid_argument`) any of `names` given with an empty
/// value: `?user_id=` names no user, it does not leave the parameter out.
void no_empty_params(const request& req,
                     std::initializer_list<const char*> names);

/// Query parameter as an integer; throws 400 `invalid_argument` naming it
/// when present but not an integer.
/// `text` as a decimal integer: an optional '-' and digits, nothing else
/// (no sign '+', no spaces), within int64; nullopt otherwise.
std::optional<int64_t> parse_int(std::string_view text);

std::optional<int64_t> query_int(const request& req, const char* name);

/// Sends `body` as JSON with `status`.
void reply(response& res, int status, const json& body);

/// The JSON error reply of `e`.
response error_response(const api_error& e);

/// Serializes JSON safely (invalid UTF-8 replaced, never throws).
std::string dump(const json& value);

/// Routes requests by method and path; each route's handler is wrapped
/// with auth, error handling, logging and metrics. Patterns are paths whose
/// `([^/]+)` segments capture one segment each (`req.matches[i]`).
/// Register every route before serving.
class router {
public:
  router(runtime& rt, const server_options& options, http_metrics& metrics,
         boost::asio::thread_pool& workers);

  void get(const std::string& pattern, const std::string& route, handler h,
           bool open = false);
  void post(const std::string& pattern, const std::string& route, handler h);
  void del(const std::string& pattern, const std::string& route, handler h);
  void patch(const std::string& pattern, const std::string& route,
             handler h);
  void put(const std::string& pattern, const std::string& route, handler h);
  void get_async(const std::string& pattern, const std::string& route,
                 async_handler h, bool open = false);
  void post_async(const std::string& pattern, const std::string& route,
                  async_handler h);

  /// Routes one request (on its connection's loop).
  void dispatch(std::shared_ptr<request> req, responder_ptr res);

  /// Where the answers to requests with an Idempotency-Key are kept;
  /// without one the header is ignored.
  void set_idempotency(std::shared_ptr<idempotency_store> store);
  /// The store set by `set_idempotency`, or null.
  std::shared_ptr<idempotency_store> idempotency() const {
    return idempotency_;
  }
  /// Turns tenancy on (docs/tenants.md): requests are authenticated with
  /// the admin token or a tenant's key from `store`.
  void set_tenants(std::shared_ptr<tenancy::tenant_store> store) {
    tenants_ = std::move(store);
  }
  /// The tenants, or null while tenancy is off.
  std::shared_ptr<tenancy::tenant_store> tenants() const {
    return tenants_;
  }
  /// Marks a registered route (by its name) as honouring Idempotency-Key.
  void idempotent(const std::string& route);

  /// Every route's name ("GET /v1/threads/{id}"), in the order added: the
  /// table docs/openapi.yaml must describe (test_openapi).
  std::vector<std::string> route_names() const;

  /// The reply to a request refused before routing (and its log line).
  response refusal(const request& req, int status, const std::string& message);

  /// True once the server is stopping (`/healthz` then answers 503).
  bool stopping() const noexcept;
  void set_stopping() noexcept;

  runtime& rt() noexcept {
    return rt_;
  }
  const server_options& options() const noexcept {
    return options_;
  }
  http_metrics& metrics() noexcept {
    return metrics_;
  }
  /// The threads of blocking handlers (and of providers without an
  /// asynchronous form).
  boost::asio::thread_pool& workers() noexcept {
    return workers_;
  }

  /// Logs and counts one finished request.
  void record(const std::string& route, const request& req, int status,
              double seconds, const json& fields);

  /// The event loops requests are forwarded on, in a cluster (the
  /// server's own).
  void set_loops(std::shared_ptr<net::io_pool> loops) {
    loops_ = std::move(loops);
  }

private:
  struct route_entry {
    std::string method;
    // "\x01" captures a segment; the root "/" is one empty segment.
    std::vector<std::string> segments;
    std::string route;
    handler blocking;
    async_handler async;
    bool open = false;
    bool idempotent = false;
    /// Where the request names its thread: not at all, the path's first
    /// capture (/v1/threads/{id}/...), a chat completion's `thread_id`
    /// field or header, or the query's `thread` (GET /v1/events). In a cluster such a request is served by the
    /// thread's owner (docs/cluster.md, "Forwarding").
    enum class thread_in : uint8_t { none, path, completion, query } thread
      = thread_in::none;
    /// An orchestration route: in a cluster it is served by the node
    /// holding the scheduler seat (docs/cluster.md, "One scheduler").
    bool scheduled = false;
    /// Who may use it while tenancy is on (auth.cpp).
    route_rule rule;
  };

  /// The thread a request names (empty: none, or "new").
  static std::string thread_of(const route_entry& e, const request& req);
  /// Whether the node holding the scheduler seat serves the request: an
  /// orchestration route, or a subscription to task events only.
  static bool for_scheduler(const route_entry& e, const request& req);
  /// The authenticated request goes on (or its refusal is sent).
  void admit(const route_entry* e, std::shared_ptr<request> req,
             responder_ptr res, auth_outcome outcome);
  /// To the node that serves it, or `proceed` here.
  void route_request(const route_entry* e, std::shared_ptr<request> req,
                     responder_ptr res);
  /// Idempotency, then the handler.
  void proceed(const route_entry* e, std::shared_ptr<request> req,
               responder_ptr res);
  /// Hands the request to the node serving its thread.
  void forward_to(const route_entry* e, const thread_location& where,
                  std::shared_ptr<request> req, responder_ptr res);

  void run(const route_entry* e, std::shared_ptr<request> req,
           responder_ptr res);
  void dispatch_keyed(const route_entry* e, std::shared_ptr<request> req,
                      responder_ptr res, std::string key);

  void add(const std::string& method, const std::string& pattern,
           const std::string& route, handler h, async_handler a, bool open);
  const route_entry* match(const request& req,
                           std::vector<std::string>& captures) const;

  runtime& rt_;
  const server_options& options_;
  http_metrics& metrics_;
  boost::asio::thread_pool& workers_;
  std::vector<route_entry> routes_;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<idempotency_store> idempotency_;
  std::shared_ptr<net::io_pool> loops_;
  std::shared_ptr<tenancy::tenant_store> tenants_;
};

/// True when `req` carries the configured bearer token (or none is set).
bool authorized(const request& req, const std::string& token);

// Route groups, one file each (routes_<group>.cpp).
void add_id_routes(router& r);
void add_thread_routes(router& r);
void add_thread_resource_routes(router& r);
void add_item_routes(router& r);
void add_memory_routes(router& r);
void add_task_routes(router& r);
void add_event_routes(router& r);
void add_openai_routes(router& r);
void add_token_routes(router& r);
void add_console_routes(router& r);
void add_openapi_routes(router& r);
void add_tenant_routes(router& r);
void add_usage_routes(router& r);

} // namespace http
} // namespace spindle
