#include "router.hpp"

#include <algorithm>
#include <charconv>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <caf/logger.hpp>
#include <spdlog/spdlog.h>

#include "auth.hpp"
#include "forward.hpp"
#include "idempotency.hpp"
#include "net/io_pool.hpp"
#include "metrics.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/tools.hpp"
#include "core/logging.hpp"
#include "spindle/runtime/runtime.hpp"
#include "admission/limiter.hpp"
#include "admission/upstream.hpp"
#include "tenancy/tenant_store.hpp"

namespace spindle::http {

namespace {

int status_of(errc code) {
  switch (code) {
    case errc::invalid_argument:
    case errc::invalid_id:
    case errc::malformed:
      return 400;
    case errc::not_found:
      return 404;
    case errc::exhausted:
    case errc::already_exists:
    case errc::conflict:
    case errc::lease_lost:
      return 409;
    case errc::too_large:
      return 413;
    case errc::capacity_exceeded:
      return 422;
    case errc::rate_limited:
    case errc::upstream_busy:
      return 429;
    case errc::upstream_failure:
      return 502;
    case errc::unavailable:
    case errc::storage_unavailable:
    case errc::not_owner:
      return 503;
    case errc::timeout:
      return 504;
    case errc::storage_full:
      return 507;
    case errc::storage_failure:
    case errc::io_failure:
    default:
      return 500;
  }
}

// The message without the "code: " prefix describe() adds.
std::string message_of(const caf::error& err) {
  auto text = describe(err);
  auto name = to_string(classify(err));
  if (text.compare(0, name.size() + 2, name + ": ") == 0)
    return text.substr(name.size() + 2);
  return text;
}

const char* type_name(const json& v) {
  return v.type_name();
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 1;
  if (path.empty() || path[0] != '/')
    return out;
  while (start <= path.size()) {
    auto slash = path.find('/', start);
    if (slash == std::string::npos) {
      out.push_back(path.substr(start));
      break;
    }
    out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

} // namespace

bool authorized(const request& req, const std::string& token) {
  if (token.empty())
    return true;
  auto header = req.header_view("Authorization");
  static constexpr std::string_view bearer = "Bearer ";
  if (header.substr(0, bearer.size()) != bearer)
    return false;
  return same_secret(header.substr(bearer.size()), token);
}

api_error to_api_error(const caf::error& err) {
  auto code = classify(err);
  return {status_of(code), to_string(code), message_of(err)};
}

void fail(const caf::error& err) {
  throw to_api_error(err);
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

void reply(response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

const char* error_type(int status) noexcept {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 409:
      return "conflict_error";
    case 429:
      return "rate_limit_error";
    case 504:
      return "timeout_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

response error_response(const api_error& e) {
  response res;
  reply(res, e.status,
        {{"error",
          {{"code", e.code},
           {"message", e.message},
           {"type", error_type(e.status)},
           {"param", e.param.empty() ? json(nullptr) : json(e.param)}}}});
  return res;
}

json parse_body(const request& req,
                std::initializer_list<const char*> allowed,
                bool allow_empty) {
  if (req.body.empty()) {
    if (allow_empty)
      return json::object();
    throw api_error{400, "malformed", "the request body must be a JSON "
                                      "object; it is empty"};
  }
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw api_error{400, "malformed",
                    "the body is not valid JSON: " + std::string{e.what()}};
  }
  if (!body.is_object())
    throw api_error{400, "malformed",
                    std::string{"the body must be a JSON object, not "}
                      + type_name(body)};
  for (auto& [key, value] : body.items()) {
    bool known = false;
    for (auto* name : allowed)
      known = known || key == name;
    if (!known) {
      std::string list;
      for (auto* name : allowed)
        list += (list.empty() ? "" : ", ") + std::string{name};
      throw api_error{400, "unknown_field",
                      "unknown field '" + key.substr(0, 64)
                        + "'; this route accepts: "
                        + (list.empty() ? "no fields" : list),
                      key.substr(0, 64)};
    }
  }
  return body;
}

std::string required_string(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field + "' is required", field};
  if (!it->is_string())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field + "' must be a string, not "
                      + type_name(*it),
                    field};
  return it->get<std::string>();
}

std::optional<std::string> optional_string(const json& body,
                                           const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null())
    return std::nullopt;
  if (!it->is_string())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field + "' must be a string, not "
                      + type_name(*it),
                    field};
  return it->get<std::string>();
}

std::string chat_content_text(const json& content, const std::string& param) {
  if (content.is_string())
    return content.get<std::string>();
  if (!content.is_array())
    throw api_error{400, "invalid_argument",
                    param + " must be a string or an array of text parts",
                    param};
  std::string text;
  for (auto& part : content) {
    auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || *type != "text"
        || !part.contains("text") || !part["text"].is_string())
      throw api_error{400, "invalid_argument",
                      param + " may hold only parts of type 'text' with a "
                              "string 'text' (images, audio and files are "
                              "not supported)",
                      param};
    text += part["text"].get<std::string>();
  }
  return text;
}

void parse_tools(const json& body, std::string& tools,
                 std::string& tool_choice) {
  auto list = body.find("tools");
  if (list != body.end() && !list->is_null()
      && !(list->is_array() && list->empty()))
    tools = dump(*list);
  auto choice = body.find("tool_choice");
  if (choice != body.end() && !choice->is_null())
    tool_choice = dump(*choice);
  if (auto err = validate_tools(tools, tool_choice)) {
    auto e = to_api_error(err);
    e.param = e.message.rfind("tool_choice", 0) == 0 ? "tool_choice" : "tools";
    throw e;
  }
}

std::optional<int64_t> optional_int(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null())
    return std::nullopt;
  if (!it->is_number_integer())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field
                      + "' must be an integer, not " + type_name(*it),
                    field};
  return it->get<int64_t>();
}

void only_params(const request& req,
                 std::initializer_list<const char*> allowed) {
  for (auto& [key, value] : req.params) {
    bool known = false;
    for (auto* name : allowed)
      known = known || key == name;
    if (known)
      continue;
    std::string list;
    for (auto* name : allowed)
      list += (list.empty() ? "" : ", ") + std::string{name};
    throw api_error{400, "unknown_field",
                    "unknown query parameter '" + key.substr(0, 64)
                      + "'; this route accepts: " + list,
                    key.substr(0, 64)};
  }
}

std::string path_thread(const request& req, bool allow_new) {
  auto& id = req.matches[1];
  if (id == "new" && !allow_new)
    throw api_error{400, "invalid_id",
                    "thread_id 'new' names no thread; it is only accepted "
                    "when sending a message"};
  return scoped_thread(req, id, nullptr);
}

void no_empty_params(const request& req,
                     std::initializer_list<const char*> names) {
  for (auto* name : names)
    if (req.has_param(name) && req.get_param_value(name).empty())
      throw api_error{400, "invalid_argument",
                      std::string{"query parameter '"} + name
                        + "' is empty: give a value or leave it out",
                      name};
}

std::optional<int64_t> parse_int(std::string_view text) {
  int64_t value = 0;
  auto end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || at != end)
    return std::nullopt;
  return value;
}

std::optional<int64_t> query_int(const request& req, const char* name) {
  if (!req.has_param(name))
    return std::nullopt;
  auto text = req.get_param_value(name);
  if (auto value = parse_int(text))
    return value;
  throw api_error{400, "invalid_argument",
                  std::string{"query parameter '"} + name
                    + "' must be an integer, not '" + text.substr(0, 32)
                    + "'",
                  name};
}

// -- async_call ----------------------------------------------------------------

async_call::async_call(router& r, std::string route,
                       std::shared_ptr<request> req, responder_ptr res)
  : router_(r), route_(std::move(route)), req_(std::move(req)),
    res_(std::move(res)), start_(std::chrono::steady_clock::now()) {
}

async_call::~async_call() {
  if (!done_)
    fail(api_error{500, "internal", "the route gave no answer"});
  else if (stream_status_ != 0)
    end_stream();
}

void async_call::finish(int status) {
  auto seconds = std::chrono::duration<double>(
                   std::chrono::steady_clock::now() - start_)
                   .count();
  router_.record(route_, *req_, status, seconds, ctx.log);
}

std::function<void(const rate_state&)>
limits_to(const std::shared_ptr<async_call>& call) {
  return [call](const rate_state& s) {
    call->add_headers(admission::rate_headers(s));
  };
}

void async_call::add_headers(
  std::vector<std::pair<std::string, std::string>> h) {
  std::lock_guard<std::mutex> guard{headers_mx_};
  for (auto& kv : h)
    headers_.push_back(std::move(kv));
}

void async_call::send(response res) {
  if (done_.exchange(true))
    return;
  if (res.status == -1)
    res.status = 200;
  {
    std::lock_guard<std::mutex> guard{headers_mx_};
    for (auto& [k, v] : headers_)
      res.set_header(k, v);
  }
  finish(res.status);
  res_->send(std::move(res));
}

void async_call::reply(int status, const json& body) {
  response res;
  http::reply(res, status, body);
  send(std::move(res));
}

void async_call::fail(const api_error& e) {
  send(error_response(scrubbed(e, *req_)));
}

void async_call::fail(const caf::error& err) {
  // Refused for the upstream's load: back once its gate has reopened.
  if (classify(err) == errc::upstream_busy)
    add_headers({{"Retry-After",
                  std::to_string(router_.rt().upstream()->retry_after_s())}});
  fail(to_api_error(err));
}

void async_call::begin_stream(
  int status, std::string content_type,
  std::vector<std::pair<std::string, std::string>> headers) {
  if (done_.exchange(true))
    return;
  stream_status_ = status;
  {
    std::lock_guard<std::mutex> guard{headers_mx_};
    for (auto& kv : headers_)
      headers.push_back(kv);
  }
  // The request line is logged as the stream starts; a handler may log
  // the rest of the exchange itself when it ends.
  finish(status);
  res_->begin_stream(status, std::move(content_type), std::move(headers));
}

bool async_call::write(std::string chunk) {
  return res_->write(std::move(chunk));
}

void async_call::end_stream() {
  if (stream_status_ == 0)
    return;
  stream_status_ = 0;
  res_->end_stream();
}

bool async_call::gone() const noexcept {
  return res_->gone();
}

std::shared_ptr<flow_control> async_call::flow() {
  return res_->flow();
}

void async_call::on_gone(std::function<void()> f) {
  res_->on_gone(std::move(f));
}

// -- router ----------------------------------------------------------------------

router::router(runtime& rt, const server_options& options,
               http_metrics& metrics, boost::asio::thread_pool& workers)
  : rt_(rt), options_(options), metrics_(metrics), workers_(workers) {
}

void router::add(const std::string& method, const std::string& pattern,
                 const std::string& route, handler h, async_handler a,
                 bool open) {
  route_entry e;
  e.method = method;
  // A capture's "[^/]" holds a slash: mark captures before splitting.
  static const std::string capture = "([^/]+)";
  auto marked = pattern;
  for (auto at = marked.find(capture); at != std::string::npos;
       at = marked.find(capture, at))
    marked.replace(at, capture.size(), "\x01");
  e.segments = split_path(marked);
  e.route = route;
  e.blocking = std::move(h);
  e.async = std::move(a);
  e.open = open;
  e.rule = rule_of(route);
  if (route.find(" /v1/threads/{id}") != std::string::npos)
    e.thread = route_entry::thread_in::path;
  else if (route == "POST /v1/chat/completions")
    e.thread = route_entry::thread_in::completion;
  else if (route == "GET /v1/events")
    e.thread = route_entry::thread_in::query;
  e.scheduled = route.find(" /v1/orchestrations") != std::string::npos
                || route.find(" /v1/tasks") != std::string::npos;
  routes_.push_back(std::move(e));
}

void router::get(const std::string& pattern, const std::string& route,
                 handler h, bool open) {
  add("GET", pattern, route, std::move(h), {}, open);
}

void router::post(const std::string& pattern, const std::string& route,
                  handler h) {
  add("POST", pattern, route, std::move(h), {}, false);
}

void router::del(const std::string& pattern, const std::string& route,
                 handler h) {
  add("DELETE", pattern, route, std::move(h), {}, false);
}

void router::patch(const std::string& pattern, const std::string& route,
                   handler h) {
  add("PATCH", pattern, route, std::move(h), {}, false);
}

void router::put(const std::string& pattern, const std::string& route,
                 handler h) {
  add("PUT", pattern, route, std::move(h), {}, false);
}

void router::get_async(const std::string& pattern, const std::string& route,
                       async_handler h, bool open) {
  add("GET", pattern, route, {}, std::move(h), open);
}

void router::post_async(const std::string& pattern, const std::string& route,
                        async_handler h) {
  add("POST", pattern, route, {}, std::move(h), false);
}

bool router::stopping() const noexcept {
  return stopping_;
}

void router::set_stopping() noexcept {
  stopping_ = true;
}

const router::route_entry*
router::match(const request& req, std::vector<std::string>& captures) const {
  auto segments = split_path(req.path);
  for (auto& e : routes_) {
    if (e.method != req.method || e.segments.size() != segments.size())
      continue;
    bool ok = true;
    captures.clear();
    captures.push_back(req.path);
    for (size_t i = 0; i < segments.size() && ok; ++i) {
      if (e.segments[i] == "\x01") {
        ok = !segments[i].empty();
        captures.push_back(segments[i]);
      } else {
        ok = e.segments[i] == segments[i];
      }
    }
    if (ok)
      return &e;
  }
  return nullptr;
}

void router::record(const std::string& route, const request& req, int status,
                    double seconds, const json& fields) {
  metrics_.observe(route, req.method, status, seconds);
  if (!spdlog::should_log(spdlog::level::info))
    return;
  auto line = fields;
  line["method"] = req.method;
  line["route"] = route;
  line["status"] = status;
  line["latency_ms"] = seconds * 1000.0;
  spdlog::info(log_fields("request", line));
}

response router::refusal(const request& req, int status,
                         const std::string& message) {
  std::string code;
  switch (status) {
    case 404: code = "not_found"; break;
    case 408: code = "timeout"; break;
    case 413:
    case 414:
    case 431: code = "too_large"; break;
    case 503: code = "unavailable"; break;
    default: code = "malformed";
  }
  json fields;
  if (!req.path.empty())
    fields["path"] = req.path.substr(0, 200);
  record("unmatched", req, status, 0, fields);
  return error_response(api_error{status, code, message});
}

namespace {

// Passes a keyed request's reply on to the client and hands it, whole, to
// the idempotency store: a whole reply before it is sent, a stream's
// chunks as they are written and the stream once it ended (before its
// end reaches the client). Recording and the client's side may run on
// different threads, one call at a time (the responder's contract).
class recording_responder
  : public responder,
    public std::enable_shared_from_this<recording_responder> {
public:
  recording_responder(responder_ptr inner,
                      std::shared_ptr<idempotency_store> store,
                      std::string key, boost::asio::thread_pool& workers)
    : inner_(std::move(inner)), store_(std::move(store)),
      key_(std::move(key)), workers_(workers) {
  }

  ~recording_responder() override {
    // Dropped without an answer: the inner responder sends a 500, and the
    // key is let go (the waiting retries get the same 500).
    if (!ended_.exchange(true)) {
      stored_reply r;
      r.status = 500;
      r.content_type = "application/json";
      r.body = error_response(api_error{500, "internal",
                                        "the request was not answered"})
                 .body;
      (void) store_->finish(key_, r);
    }
  }

  void send(response res) override {
    if (ended_.exchange(true))
      return;
    reply_.status = res.status == -1 ? 200 : res.status;
    reply_.content_type = res.content_type;
    reply_.headers = res.headers;
    reply_.body = res.body;
    // Recorded (a database write) off the loop, then sent.
    boost::asio::post(workers_, [self = keep(), res = std::move(res)]() mutable {
      self->record();
      self->inner_->send(std::move(res));
    });
  }

  void begin_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers)
    override {
    reply_.status = status;
    reply_.content_type = content_type;
    reply_.headers = headers;
    inner_->begin_stream(status, std::move(content_type), std::move(headers));
  }

  bool write(std::string chunk) override {
    reply_.body += chunk;
    return inner_->write(std::move(chunk));
  }

  std::shared_ptr<flow_control> flow() override {
    return inner_->flow();
  }

  void end_stream() override {
    if (ended_.exchange(true))
      return;
    boost::asio::post(workers_, [self = keep()] {
      self->record();
      self->inner_->end_stream();
    });
  }

  bool gone() const noexcept override {
    return inner_->gone();
  }

  void on_gone(std::function<void()> f) override {
    inner_->on_gone(std::move(f));
  }

private:
  std::shared_ptr<recording_responder> keep() {
    return shared_from_this();
  }

  void record() {
    if (auto err = store_->finish(key_, reply_))
      spdlog::warn("idempotency: the answer for a key could not be stored; "
                   "a retry will run again: {}",
                   describe(err));
  }

  responder_ptr inner_;
  std::shared_ptr<idempotency_store> store_;
  std::string key_;
  boost::asio::thread_pool& workers_;
  stored_reply reply_;
  std::atomic<bool> ended_{false};
};

response replayed(const stored_reply& r) {
  response res;
  res.status = r.status;
  res.set_content(r.body, r.content_type);
  for (auto& h : r.headers)
    res.set_header(h.first, h.second);
  res.set_header("Idempotent-Replayed", "true");
  return res;
}

} // namespace

void router::set_idempotency(std::shared_ptr<idempotency_store> store) {
  idempotency_ = std::move(store);
}

std::vector<std::string> router::route_names() const {
  std::vector<std::string> out;
  out.reserve(routes_.size());
  for (auto& e : routes_)
    out.push_back(e.route);
  return out;
}

void router::idempotent(const std::string& route) {
  bool found = false;
  for (auto& e : routes_)
    if (e.route == route)
      found = e.idempotent = true;
  if (!found)
    throw std::logic_error{"no route named " + route};
}

void router::dispatch_keyed(const route_entry* e, std::shared_ptr<request> req,
                            responder_ptr res, std::string key) {
  if (auto problem = idempotency_store::check_key(key); !problem.empty()) {
    record(e->route, *req, 400, 0, json::object());
    res->send(error_response(
      api_error{400, "invalid_argument", problem, "Idempotency-Key"}));
    return;
  }
  // Claiming may read the database: off the loop.
  boost::asio::post(workers_, [this, e, req = std::move(req),
                               res = std::move(res),
                               key = std::move(key)]() mutable {
    auto fp = idempotency_store::fingerprint(req->method, req->path,
                                             req->body);
    stored_reply reply;
    auto route = e->route;
    auto answer = [this, route, req, res](const stored_reply& r) {
      record(route, *req, r.status, 0, {{"idempotent_replay", true}});
      res->send(replayed(r));
    };
    // Keys are per tenant: stored under the tenant's prefix.
    // Per tenant, and per end user.
    auto stored_key = http::who(*req).thread_prefix + key;
    switch (idempotency_->claim(stored_key, fp, reply, answer)) {
      case idempotency_store::claim_result::mismatch:
        record(route, *req, 422, 0, json::object());
        res->send(error_response(api_error{
          422, "idempotency_mismatch",
          "the Idempotency-Key '" + key.substr(0, 64)
            + "' was used for another request (method, path or body); "
              "use a new key for a new request",
          "Idempotency-Key"}));
        return;
      case idempotency_store::claim_result::replay:
        answer(reply);
        return;
      case idempotency_store::claim_result::waiting:
        return; // `answer` runs once the running request ends
      case idempotency_store::claim_result::run:
        break;
    }
    auto recorder = std::make_shared<recording_responder>(
      std::move(res), idempotency_, std::move(stored_key), workers_);
    run(e, std::move(req), std::move(recorder));
  });
}

void router::dispatch(std::shared_ptr<request> req, responder_ptr res) {
  std::vector<std::string> captures;
  auto* e = match(*req, captures);
  if (!e) {
    res->send(refusal(*req, 404,
                      "no route for " + req->method + " "
                        + req->path.substr(0, 200)));
    return;
  }
  req->matches = std::move(captures);
  if (!tenants_) {
    if (!e->open && !authorized(*req, options_.token)) {
      record(e->route, *req, 401, 0, json::object());
      res->send(error_response(
        api_error{401, "unauthorized",
                  "this route requires 'Authorization: Bearer <token>'"}));
      return;
    }
    req->who = open_principal();
    route_request(e, std::move(req), std::move(res));
    return;
  }
  if (e->open || e->rule.who == access::open) {
    route_request(e, std::move(req), std::move(res));
    return;
  }
  auto outcome = authenticate(*req, e->rule, options_.admin_token, *tenants_,
                              false);
  if (outcome.needs_store) {
    // A key not cached or a tenant to look up: off the loop.
    boost::asio::post(workers_, [this, e, req = std::move(req),
                                 res = std::move(res)]() mutable {
      // Before `req` is moved into the call: arguments have no order.
      auto checked = authenticate(*req, e->rule, options_.admin_token,
                                  *tenants_, true);
      admit(e, std::move(req), std::move(res), std::move(checked));
    });
    return;
  }
  admit(e, std::move(req), std::move(res), std::move(outcome));
}

void router::admit(const route_entry* e, std::shared_ptr<request> req,
                   responder_ptr res, auth_outcome outcome) {
  if (outcome.refusal) {
    record(e->route, *req, outcome.refusal->status, 0, json::object());
    res->send(error_response(*outcome.refusal));
    return;
  }
  req->who = std::move(outcome.who);
  if (req->who->who == tenancy::principal::kind::admin
      && req->who->in_tenant())
    spdlog::info("admin access: {} {} in tenant '{}' from {}", req->method,
                 e->route, req->who->tenant, req->remote);
  route_request(e, std::move(req), std::move(res));
}

void router::route_request(const route_entry* e, std::shared_ptr<request> req,
                           responder_ptr res) {
  if (loops_ && rt_.cluster() && !req->has_header(forwarded_header)
      && for_scheduler(*e, *req)) {
    auto where = rt_.locate_scheduler();
    if (where.local)
      proceed(e, std::move(req), std::move(res));
    else if (!where.url.empty())
      forward_to(e, where, std::move(req), std::move(res));
    else {
      // Between two seats (a holder died, its lease not out yet): nothing
      // happened, send it again.
      record(e->route, *req, 503, 0, json::object());
      auto refused = error_response(to_api_error(rt_.no_scheduler_here()));
      refused.set_header("Retry-After", "1");
      res->send(std::move(refused));
    }
    return;
  }
  if (loops_ && rt_.cluster() && !req->has_header(forwarded_header)) {
    auto thread = thread_of(*e, *req);
    if (!thread.empty()) {
      rt_.locate_thread(thread, [this, e, req, res](thread_location where) {
        // On an actor's thread: back to an event loop.
        boost::asio::post(loops_->next(), [this, e, req, res,
                                           where = std::move(where)] {
          if (where.local)
            proceed(e, req, res);
          else
            forward_to(e, where, req, res);
        });
      });
      // Spawning the call's actor pinned the actor system's logger in a
      // thread-local of this loop thread, and ~actor_system waits for
      // every pin: drop it, as the blocking handlers' threads do.
      caf::logger::set_current_actor_system(nullptr);
      return;
    }
  }
  proceed(e, std::move(req), std::move(res));
}

std::string router::thread_of(const route_entry& e, const request& req) {
  std::string id;
  switch (e.thread) {
    case route_entry::thread_in::none:
      return {};
    case route_entry::thread_in::path:
      id = req.matches.size() > 1 ? req.matches[1] : std::string{};
      break;
    case route_entry::thread_in::query:
      id = req.get_param_value("thread");
      break;
    case route_entry::thread_in::completion: {
      id = req.get_header_value("Spindle-Thread-Id");
      if (!id.empty())
        break;
      auto body = json::parse(req.body, nullptr, false);
      if (body.is_object()) {
        auto field = body.find("thread_id");
        if (field != body.end() && field->is_string())
          id = field->get<std::string>();
      }
      break;
    }
  }
  if (id.empty() || id == "new")
    return {};
  // The thread as stored: its owner is found by that ID.
  return http::try_scoped_thread(req, id).value_or(std::string{});
}

bool router::for_scheduler(const route_entry& e, const request& req) {
  if (e.scheduled)
    return true;
  if (e.thread != route_entry::thread_in::query || req.has_param("thread"))
    return false;
  // Task events happen where the scheduler runs.
  if (req.has_param("orchestration"))
    return true;
  auto types = req.get_param_value("types");
  if (types.empty())
    return false;
  size_t start = 0;
  while (start <= types.size()) {
    auto end = std::min(types.find(',', start), types.size());
    auto name = types.substr(start, end - start);
    if (name != "task" && name.rfind("task.", 0) != 0)
      return false;
    start = end + 1;
  }
  return true;
}

void router::proceed(const route_entry* e, std::shared_ptr<request> req,
                     responder_ptr res) {
  if (e->idempotent && idempotency_) {
    auto key = req->get_header_value("Idempotency-Key");
    if (!key.empty() || req->has_header("Idempotency-Key")) {
      dispatch_keyed(e, std::move(req), std::move(res), std::move(key));
      return;
    }
  }
  run(e, std::move(req), std::move(res));
}

void router::forward_to(const route_entry* e, const thread_location& where,
                        std::shared_ptr<request> req, responder_ptr res) {
  auto start = std::chrono::steady_clock::now();
  auto route = e->route;
  auto* cluster = rt_.cluster();
  auto from = cluster != nullptr ? cluster->options().node_name
                                 : std::string{};
  forward(loops_->next(), where.url, where.node, from, req, std::move(res),
          forward_options{},
          [this, route, req, start, node = where.node](int status) {
            auto seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
            record(route, *req, status, seconds, {{"forwarded_to", node}});
          });
}

void router::run(const route_entry* e, std::shared_ptr<request> req,
                 responder_ptr res) {
  if (e->async) {
    auto call = std::make_shared<async_call>(*this, e->route, std::move(req),
                                             std::move(res));
    try {
      e->async(call);
    } catch (const api_error& err) {
      call->fail(err);
    } catch (const std::exception& ex) {
      call->fail(api_error{500, "internal", ex.what()});
    }
    return;
  }
  boost::asio::post(workers_, [this, e, req = std::move(req),
                               res = std::move(res)] {
    auto start = std::chrono::steady_clock::now();
    request_context ctx;
    response out;
    try {
      e->blocking(*req, out, ctx);
      if (out.status == -1)
        out.status = 200;
    } catch (const api_error& err) {
      out = error_response(scrubbed(err, *req));
    } catch (const std::exception& ex) {
      out = error_response(api_error{500, "internal", ex.what()});
    }
    // A blocking call pins the actor system's logger in a thread-local of
    // this thread, and ~actor_system waits for every such pin: drop it, so
    // a worker never keeps the runtime from stopping.
    caf::logger::set_current_actor_system(nullptr);
    auto seconds = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
    record(e->route, *req, out.status, seconds, ctx.log);
    res->send(std::move(out));
  });
}

} // namespace spindle::http
