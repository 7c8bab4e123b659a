#include "http_router.hpp"

#include <spdlog/spdlog.h>

#include "http_metrics.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/logging.hpp"
#include "spindle/runtime/runtime.hpp"

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
      return 409;
    case errc::too_large:
      return 413;
    case errc::capacity_exceeded:
      return 422;
    case errc::upstream_failure:
      return 502;
    case errc::unavailable:
      return 503;
    case errc::timeout:
      return 504;
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

bool authorized(const httplib::Request& req, const std::string& token) {
  if (token.empty())
    return true;
  auto header = req.get_header_value("Authorization");
  static const std::string bearer = "Bearer ";
  if (header.compare(0, bearer.size(), bearer) != 0)
    return false;
  auto given = header.substr(bearer.size());
  // Constant-time comparison: the time taken does not reveal the prefix.
  unsigned diff = given.size() == token.size() ? 0u : 1u;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i])
            ^ static_cast<unsigned char>(token[i % token.size()]);
  return diff == 0;
}

const char* type_name(const json& v) {
  return v.type_name();
}

} // namespace

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

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

json parse_body(const httplib::Request& req,
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
                        + (list.empty() ? "no fields" : list)};
    }
  }
  return body;
}

std::string required_string(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field + "' is required"};
  if (!it->is_string())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field + "' must be a string, not "
                      + type_name(*it)};
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
                      + type_name(*it)};
  return it->get<std::string>();
}

std::optional<int64_t> optional_int(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null())
    return std::nullopt;
  if (!it->is_number_integer())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field
                      + "' must be an integer, not " + type_name(*it)};
  return it->get<int64_t>();
}

std::optional<int64_t> query_int(const httplib::Request& req,
                                 const char* name) {
  if (!req.has_param(name))
    return std::nullopt;
  auto text = req.get_param_value(name);
  try {
    size_t used = 0;
    auto value = std::stoll(text, &used);
    if (used == text.size() && !text.empty())
      return value;
  } catch (...) {
  }
  throw api_error{400, "invalid_argument",
                  std::string{"query parameter '"} + name
                    + "' must be an integer, not '" + text.substr(0, 32)
                    + "'"};
}

router::router(httplib::Server& svr, runtime& rt,
               const server_options& options, http_metrics& metrics)
  : svr_(svr), rt_(rt), options_(options), metrics_(metrics) {
}

httplib::Server::Handler router::wrap(const std::string& route, handler h,
                                      bool open) {
  return [this, route, h = std::move(h),
          open](const httplib::Request& req, httplib::Response& res) {
    auto start = std::chrono::steady_clock::now();
    request_context ctx;
    try {
      if (!open && !authorized(req, options_.token))
        throw api_error{401, "unauthorized",
                        "this route requires 'Authorization: Bearer <token>'"};
      h(req, res, ctx);
      if (res.status == -1)
        res.status = 200;
    } catch (const api_error& e) {
      reply(res, e.status,
            {{"error", {{"code", e.code}, {"message", e.message}}}});
    } catch (const std::exception& e) {
      reply(res, 500,
            {{"error", {{"code", "internal"}, {"message", e.what()}}}});
    }
    auto seconds = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
    metrics_.observe(route, req.method, res.status, seconds);
    auto fields = ctx.log;
    fields["method"] = req.method;
    fields["route"] = route;
    fields["status"] = res.status;
    fields["latency_ms"] = seconds * 1000.0;
    spdlog::info(log_fields("request", fields));
  };
}

void router::get(const std::string& pattern, const std::string& route,
                 handler h) {
  svr_.Get(pattern, wrap(route, std::move(h)));
}

void router::post(const std::string& pattern, const std::string& route,
                  handler h) {
  svr_.Post(pattern, wrap(route, std::move(h)));
}

void router::del(const std::string& pattern, const std::string& route,
                 handler h) {
  svr_.Delete(pattern, wrap(route, std::move(h)));
}

} // namespace spindle::http
