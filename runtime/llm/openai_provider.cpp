#include "spindle/runtime/openai_provider.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/messages/error.hpp"

namespace spindle {

using json = nlohmann::json;
using namespace std::chrono;

namespace {

// Splits "http://host:port/prefix" into origin and path prefix; drops a
// trailing "/v1" and trailing slashes from the prefix.
std::pair<std::string, std::string> split_url(std::string url) {
  auto scheme_end = url.find("://");
  auto path_start = url.find('/', scheme_end == std::string::npos
                                    ? 0
                                    : scheme_end + 3);
  std::string origin = url.substr(0, path_start);
  std::string prefix = path_start == std::string::npos ? ""
                                                       : url.substr(path_start);
  while (!prefix.empty() && prefix.back() == '/')
    prefix.pop_back();
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0)
    prefix.erase(prefix.size() - 3);
  return {origin, prefix};
}

std::string upstream_message(int status, const std::string& body) {
  auto parsed = json::parse(body, nullptr, false);
  std::string detail;
  if (parsed.is_object()) {
    auto err = parsed.find("error");
    if (err != parsed.end()) {
      if (err->is_object() && err->contains("message")
          && (*err)["message"].is_string())
        detail = (*err)["message"].get<std::string>();
      else if (err->is_string())
        detail = err->get<std::string>();
    }
  }
  if (detail.empty())
    detail = body.substr(0, 300);
  return "the LLM endpoint answered " + std::to_string(status)
         + (detail.empty() ? std::string{} : ": " + detail);
}

// Incremental SSE parser for OpenAI's stream: "data: {json}\n\n" events,
// ending with "data: [DONE]".
class sse_reader {
public:
  explicit sse_reader(const delta_callback& on_delta) : on_delta_(on_delta) {
  }

  /// Feeds bytes; returns false once the consumer asked to stop.
  bool feed(const char* data, size_t size) {
    buffer_.append(data, size);
    size_t start = 0;
    while (true) {
      auto end = buffer_.find('\n', start);
      if (end == std::string::npos)
        break;
      std::string line = buffer_.substr(start, end - start);
      start = end + 1;
      if (!line.empty() && line.back() == '\r')
        line.pop_back();
      if (!handle(line)) {
        buffer_.erase(0, start);
        return false;
      }
    }
    buffer_.erase(0, start);
    return true;
  }

  std::string text;
  bool done = false;
  bool stopped = false;
  std::string error;

private:
  bool handle(const std::string& line) {
    if (line.compare(0, 5, "data:") != 0)
      return true; // comments, event names, blank separators
    auto payload = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
    if (payload == "[DONE]") {
      done = true;
      return true;
    }
    auto event = json::parse(payload, nullptr, false);
    if (!event.is_object())
      return true;
    if (event.contains("error")) {
      error = upstream_message(200, payload);
      return false;
    }
    auto choices = event.find("choices");
    if (choices == event.end() || !choices->is_array() || choices->empty())
      return true;
    auto& delta = (*choices)[0]["delta"];
    if (!delta.is_object() || !delta.contains("content")
        || !delta["content"].is_string())
      return true;
    auto piece = delta["content"].get<std::string>();
    if (piece.empty())
      return true;
    text += piece;
    if (on_delta_ && !on_delta_(piece)) {
      stopped = true;
      return false;
    }
    return true;
  }

  const delta_callback& on_delta_;
  std::string buffer_;
};

} // namespace

openai_provider::openai_provider(openai_options options)
  : options_(std::move(options)) {
  std::tie(origin_, path_prefix_) = split_url(options_.base_url);
}

std::string openai_provider::name() const {
  return "openai:" + options_.model;
}

caf::expected<completion>
openai_provider::complete(const std::vector<chat_message>& messages,
                          const completion_options& options,
                          const delta_callback& on_delta) {
  json body;
  body["model"] = options.model.empty() ? options_.model : options.model;
  body["stream"] = true;
  body["messages"] = json::array();
  for (auto& m : messages) {
    json msg{{"role", m.role}, {"content", m.content}};
    if (!m.tool_call_id.empty())
      msg["tool_call_id"] = m.tool_call_id;
    body["messages"].push_back(std::move(msg));
  }
  if (options.max_tokens > 0)
    body["max_tokens"] = options.max_tokens;

  httplib::Client cli{origin_};
  cli.set_connection_timeout(options_.connect_timeout);
  cli.set_read_timeout(options_.read_timeout);
  cli.set_write_timeout(options_.read_timeout);
  if (!options_.api_key.empty())
    cli.set_bearer_token_auth(options_.api_key);

  auto deadline = steady_clock::now() + options.timeout;
  bool timed_out = false;
  int status = 0;
  bool streaming = false;
  std::string raw; // a non-SSE body: an error or a plain completion
  sse_reader sse{on_delta};

  httplib::Request req;
  req.method = "POST";
  req.path = path_prefix_ + "/v1/chat/completions";
  req.headers = {{"Accept", "text/event-stream"}};
  req.set_header("Content-Type", "application/json");
  req.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    streaming = status == 200
                && res.get_header_value("Content-Type").find(
                     "text/event-stream")
                     != std::string::npos;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t,
                             uint64_t) {
    if (steady_clock::now() > deadline) {
      timed_out = true;
      return false;
    }
    if (!streaming) {
      raw.append(data, size);
      return raw.size() < (16u << 20);
    }
    return sse.feed(data, size);
  };
  auto res = cli.send(req);

  if (timed_out)
    return make_error(errc::timeout,
                      "the LLM endpoint did not finish within "
                        + std::to_string(options.timeout.count()) + " ms");
  if (sse.stopped)
    return completion{sse.text, true};
  if (!sse.error.empty())
    return make_error(errc::upstream_failure, sse.error);
  if (!res) {
    auto err = res.error();
    if (err == httplib::Error::Read && status == 200)
      return make_error(errc::timeout, "the LLM endpoint stopped sending");
    return make_error(errc::upstream_failure,
                      "cannot reach the LLM endpoint at " + origin_ + ": "
                        + httplib::to_string(err));
  }
  if (status != 200)
    return make_error(errc::upstream_failure, upstream_message(status, raw));
  if (streaming)
    return completion{sse.text, false};
  // A plain (non-streamed) completion.
  auto parsed = json::parse(raw, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("choices")
      || !parsed["choices"].is_array() || parsed["choices"].empty()
      || !parsed["choices"][0]["message"]["content"].is_string())
    return make_error(errc::upstream_failure,
                      "the LLM endpoint answered 200 without a completion: "
                        + raw.substr(0, 200));
  auto text = parsed["choices"][0]["message"]["content"].get<std::string>();
  if (on_delta && !on_delta(text))
    return completion{text, true};
  return completion{text, false};
}

caf::expected<std::shared_ptr<llm_provider>>
make_openai_provider(openai_options options) {
  if (options.base_url.rfind("http://", 0) != 0
      && options.base_url.rfind("https://", 0) != 0)
    return make_error(errc::invalid_argument,
                      "--llm-url must start with http:// or https://, not '"
                        + options.base_url.substr(0, 64) + "'");
  if (options.model.empty())
    return make_error(errc::invalid_argument,
                      "--llm-model is required for the openai provider");
  return std::shared_ptr<llm_provider>{
    std::make_shared<openai_provider>(std::move(options))};
}

} // namespace spindle
