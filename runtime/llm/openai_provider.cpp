#include "spindle/runtime/openai_provider.hpp"

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <array>
#include <future>
#include <limits>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/threads.hpp"
#include "net/io_pool.hpp"
#include "llm/delta.hpp"
#include "llm/signal.hpp"
#include "net/tcp_or_tls.hpp"
#include "net/url.hpp"
#include "spindle/version.hpp"

// The OpenAI-compatible provider on the event loops (docs/llm.md, "The
// OpenAI-compatible provider"). A call is one `upstream_call` on one loop:
// resolve, connect, TLS handshake for https, send the request, then read
// the answer as it arrives and turn its SSE events into deltas. Nothing
// waits: the overall timeout and the watchdog (connect timeout, then read
// timeout) are timers of the same loop, and each ends the call by closing
// its socket.

namespace spindle {

namespace detail {

struct openai_endpoint {
  /// "https://host:port" as the URL wrote it, for messages.
  std::string origin;
  /// To resolve, for SNI and to verify the certificate against.
  std::string host;
  std::string port;
  /// The Host header.
  std::string authority;
  /// {prefix}/v1/chat/completions.
  std::string target;
  std::string model;
  std::string api_key;
  std::chrono::milliseconds connect_timeout{};
  std::chrono::milliseconds read_timeout{};
  /// Set for https.
  std::unique_ptr<boost::asio::ssl::context> tls;
  /// Why the options were refused; every call fails with it.
  std::string refused;
};

} // namespace detail

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using error_code = boost::system::error_code;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using endpoint = detail::openai_endpoint;

// A non-streamed answer (an error, a plain completion) larger than this is
// refused rather than held.
constexpr size_t max_answer = 16u << 20;

bool is_address(const std::string& host) {
  error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// Parses and checks the options once per provider; `refused` says why
// they cannot serve.
std::shared_ptr<endpoint> make_endpoint(const openai_options& o) {
  auto ep = std::make_shared<endpoint>();
  auto refuse = [&](std::string why) {
    ep->refused = std::move(why);
    return ep;
  };
  net::http_origin origin;
  std::string why;
  if (!net::parse_http_url(o.base_url, origin, why))
    return refuse("--llm-url " + why);
  if (o.model.empty())
    return refuse("--llm-model is required for the openai provider");
  bool tls = origin.tls;
  // The path is a prefix before /v1/chat/completions, without trailing
  // slashes or a trailing "/v1".
  std::string prefix = origin.path;
  while (!prefix.empty() && prefix.back() == '/')
    prefix.pop_back();
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0)
    prefix.erase(prefix.size() - 3);
  ep->target = prefix + "/v1/chat/completions";
  ep->origin = (tls ? "https://" : "http://") + origin.authority;
  ep->authority = origin.authority;
  ep->host = origin.host;
  ep->port = origin.port;
  ep->model = o.model;
  ep->api_key = o.api_key;
  ep->connect_timeout = o.connect_timeout;
  ep->read_timeout = o.read_timeout;
  if (tls) {
    ep->tls = std::make_unique<ssl::context>(ssl::context::tls_client);
    error_code ec;
    // Without a system store only ca_file is trusted; calls then fail
    // verification, which says so.
    ep->tls->set_default_verify_paths(ec);
    if (!o.ca_file.empty()) {
      ep->tls->load_verify_file(o.ca_file, ec);
      if (ec)
        return refuse("cannot load the CA file '" + o.ca_file
                      + "': " + ec.message());
    }
    ep->tls->set_verify_mode(ssl::verify_peer);
  }
  return ep;
}

http::request<http::string_body>
make_request(const endpoint& ep, const prompt& messages,
             const completion_options& options) {
  json body;
  body["model"] = options.model.empty() ? ep.model : options.model;
  body["stream"] = true;
  body["messages"] = json::array();
  for (auto m : messages) {
    json msg{{"role", std::string{m.role}},
             {"content", std::string{m.content}}};
    if (!m.tool_call_id.empty())
      msg["tool_call_id"] = std::string{m.tool_call_id};
    if (!m.tool_calls.empty()) {
      msg["tool_calls"] = json::parse(tool_calls_to_json(m.tool_calls));
      if (m.content.empty())
        msg["content"] = nullptr; // as OpenAI writes a call-only message
    }
    body["messages"].push_back(std::move(msg));
  }
  if (options.max_tokens > 0)
    body["max_tokens"] = options.max_tokens;
  if (!options.parameters.empty()) {
    auto extra = json::parse(options.parameters, nullptr, false);
    if (extra.is_object())
      for (auto& [key, value] : extra.items())
        if (key != "model" && key != "messages" && key != "stream")
          body[key] = value;
  }
  // The upstream's own usage, in a last chunk (docs/usage.md), unless the
  // caller's parameters said otherwise.
  if (!body.contains("stream_options"))
    body["stream_options"] = json{{"include_usage", true}};
  // Checked by the caller (validate_tools): sent as they came.
  if (!options.tools.empty()) {
    auto tools = json::parse(options.tools, nullptr, false);
    if (tools.is_array() && !tools.empty())
      body["tools"] = std::move(tools);
  }
  if (!options.tool_choice.empty() && body.contains("tools")) {
    auto choice = json::parse(options.tool_choice, nullptr, false);
    if (!choice.is_discarded())
      body["tool_choice"] = std::move(choice);
  }
  http::request<http::string_body> req{http::verb::post, ep.target, 11};
  req.set(http::field::host, ep.authority);
  req.set(http::field::user_agent, std::string{"spindle/"} + version_string);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  if (!ep.api_key.empty())
    req.set(http::field::authorization, "Bearer " + ep.api_key);
  req.body() = body.dump(-1, ' ', false, json::error_handler_t::replace);
  req.prepare_payload();
  return req;
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

// The tool calls of a reply, put together from their pieces: a streamed
// `delta.tool_calls[i]` (`index`, `id` and `function.name` on its first
// piece, then `function.arguments` fragments) or a whole
// `message.tool_calls` entry. Each piece goes on to `on_call`.
class tool_call_assembler {
public:
  explicit tool_call_assembler(const tool_call_callback& on_call)
    : on_call_(on_call) {
  }

  /// Takes one entry; false when it is malformed (`error` says why) or the
  /// consumer asked to stop (`stopped`).
  bool take(const json& entry, size_t position) {
    if (!entry.is_object()) {
      error = "the LLM endpoint sent a tool call that is not an object";
      return false;
    }
    size_t index = position;
    if (auto i = entry.find("index"); i != entry.end()) {
      if (!i->is_number_unsigned()) {
        error = "the LLM endpoint sent a tool call without a valid index";
        return false;
      }
      index = i->get<size_t>();
    }
    if (index >= max_tool_calls) {
      error = "the LLM endpoint sent more than "
              + std::to_string(max_tool_calls) + " tool calls";
      return false;
    }
    if (index >= calls.size())
      calls.resize(index + 1);
    tool_call_delta piece;
    piece.index = index;
    auto& call = calls[index];
    auto text = [](const json& x, const char* key) {
      auto it = x.find(key);
      return it != x.end() && it->is_string() ? it->get<std::string>()
                                              : std::string{};
    };
    piece.id = text(entry, "id");
    if (call.id.empty())
      call.id = piece.id;
    if (auto fn = entry.find("function"); fn != entry.end() && fn->is_object()) {
      piece.name = text(*fn, "name");
      piece.arguments = text(*fn, "arguments");
      call.name += piece.name;
      call.arguments += piece.arguments;
    }
    if (!on_call_)
      return true;
    bool more = false;
    try {
      more = on_call_(piece);
    } catch (...) {
      more = false;
    }
    stopped = !more;
    return more;
  }

  std::vector<tool_call> calls;
  bool stopped = false;
  std::string error;

private:
  const tool_call_callback& on_call_;
};

// OpenAI's `usage` object, when `x` holds one with both counts.
bool read_usage(const json& x, completion& out) {
  auto u = x.find("usage");
  if (u == x.end() || !u->is_object())
    return false;
  auto p = u->find("prompt_tokens");
  auto c = u->find("completion_tokens");
  if (p == u->end() || c == u->end() || !p->is_number_unsigned()
      || !c->is_number_unsigned())
    return false;
  out.usage_reported = true;
  out.prompt_tokens = p->get<uint64_t>();
  out.completion_tokens = c->get<uint64_t>();
  return true;
}

// Incremental SSE parser for OpenAI's stream: "data: {json}\n\n" events,
// ending with "data: [DONE]".
class sse_reader {
public:
  sse_reader(const delta_callback& on_delta, const tool_call_callback& on_call)
    : tools(on_call), on_delta_(on_delta) {
  }

  /// Feeds bytes; returns false once the consumer asked to stop or the
  /// stream carried an error.
  bool feed(const char* data, size_t size) {
    buffer_.append(data, size);
    size_t start = 0;
    while (true) {
      auto end = buffer_.find('\n', start);
      if (end == std::string::npos)
        break;
      std::string_view line{buffer_.data() + start, end - start};
      start = end + 1;
      if (!line.empty() && line.back() == '\r')
        line.remove_suffix(1);
      if (!handle(line)) {
        buffer_.erase(0, start);
        return false;
      }
    }
    buffer_.erase(0, start);
    if (buffer_.size() > max_answer) {
      error = "the LLM endpoint sent a line of more than 16 MiB";
      return false;
    }
    return true;
  }

  std::string text;
  tool_call_assembler tools;
  /// The usage chunk's figures (`usage_reported` once one came).
  completion usage;
  bool stopped = false;
  std::string error;

private:
  bool handle(std::string_view line) {
    if (line.substr(0, 5) != "data:")
      return true; // comments, event names, blank separators
    auto payload = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
    if (payload == "[DONE]")
      return true;
    auto event = json::parse(payload, nullptr, false);
    if (!event.is_object())
      return true;
    if (event.contains("error")) {
      error = upstream_message(200, std::string{payload});
      return false;
    }
    read_usage(event, usage);
    auto choices = event.find("choices");
    if (choices == event.end() || !choices->is_array() || choices->empty())
      return true;
    auto& delta = (*choices)[0]["delta"];
    if (!delta.is_object())
      return true;
    if (auto calls = delta.find("tool_calls");
        calls != delta.end() && calls->is_array())
      for (size_t i = 0; i < calls->size(); ++i)
        if (!tools.take((*calls)[i], i)) {
          stopped = tools.stopped;
          error = tools.error;
          return false;
        }
    if (!delta.contains("content") || !delta["content"].is_string())
      return true;
    auto& piece = delta["content"].get_ref<const std::string&>();
    if (piece.empty())
      return true;
    text += piece;
    if (!offer_delta(on_delta_, piece)) {
      stopped = true;
      return false;
    }
    return true;
  }

  const delta_callback& on_delta_;
  std::string buffer_;
};

// One call on one loop, with a connection of its own. Every pending
// handler holds the call; when the loop's io_context is destroyed with
// handlers pending (the pool went away first), the last one takes the call
// with it and the destructor ends the call with `unavailable`.
class upstream_call : public std::enable_shared_from_this<upstream_call> {
public:
  upstream_call(asio::io_context& loop, std::shared_ptr<const endpoint> ep,
                http::request<http::string_body> request, milliseconds timeout,
                delta_callback on_delta, tool_call_callback on_call,
                completion_done done, std::shared_ptr<flow_control> flow,
                upstream_signal_callback on_signal)
    : ep_(std::move(ep)),
      request_(std::move(request)),
      timeout_(timeout),
      on_delta_(std::move(on_delta)),
      on_call_(std::move(on_call)),
      done_(std::move(done)),
      sse_(on_delta_, on_call_),
      resolver_(loop),
      connection_(loop),
      deadline_(loop),
      watchdog_(loop),
      flow_(std::move(flow)),
      on_signal_(std::move(on_signal)) {
    // Streams are bounded by the timeouts, not by their size.
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  ~upstream_call() {
    if (!finished_)
      deliver(make_error(errc::unavailable,
                         "the LLM provider's event loops stopped before the "
                         "call to "
                           + ep_->origin + " ended"));
  }

  upstream_call(const upstream_call&) = delete;
  upstream_call& operator=(const upstream_call&) = delete;

  /// Runs on the call's loop.
  void begin() {
    if (flow_)
      // A cancelled reply ends at once, with what came so far; the abort
      // does not own the call (the flow control outlives it).
      flow_->on_cancel([weak = weak_from_this(),
                        ex = deadline_.get_executor()] {
        asio::post(ex, [weak] {
          if (auto self = weak.lock())
            self->cancel_now();
        });
      });
    deadline_.expires_after(timeout_);
    deadline_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec)
        self->fail(errc::timeout,
                   "the LLM endpoint did not finish within "
                     + std::to_string(self->timeout_.count()) + " ms");
    });
    enter(phase::connecting);
    error_code not_an_address;
    auto address = asio::ip::make_address(ep_->host, not_an_address);
    if (!not_an_address) {
      tcp::endpoint to{address,
                       static_cast<unsigned short>(std::stoi(ep_->port))};
      connection_.socket().async_connect(
        to, [self = shared_from_this()](const error_code& ec) {
          self->on_connected(ec);
        });
      return;
    }
    resolver_.async_resolve(
      ep_->host, ep_->port,
      [self = shared_from_this()](const error_code& ec,
                                  const tcp::resolver::results_type& found) {
        if (self->finished_)
          return;
        if (ec) {
          self->fail(errc::upstream_failure, self->unreachable(ec.message()));
          return;
        }
        asio::async_connect(
          self->connection_.socket(), found,
          [self](const error_code& ec2, const tcp::endpoint&) {
            self->on_connected(ec2);
          });
      });
  }

private:
  enum class phase { connecting, exchanging };

  // -- the steps, in order ---------------------------------------------------

  void on_connected(const error_code& ec) {
    if (finished_)
      return;
    if (ec) {
      fail(errc::upstream_failure, unreachable(ec.message()));
      return;
    }
    error_code ignored;
    connection_.socket().set_option(tcp::no_delay{true}, ignored);
    if (!ep_->tls) {
      send();
      return;
    }
    auto& tls = connection_.start_tls(*ep_->tls);
    auto* handle = tls.native_handle();
    if (is_address(ep_->host)) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(handle),
                                    ep_->host.c_str());
    } else {
      // SNI carries names only (RFC 6066).
      SSL_ctrl(handle, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(ep_->host.c_str()));
      SSL_set1_host(handle, ep_->host.c_str());
    }
    tls.async_handshake(ssl::stream_base::client,
                        [self = shared_from_this()](const error_code& ec2) {
                          self->on_handshake(ec2);
                        });
  }

  void on_handshake(const error_code& ec) {
    if (finished_)
      return;
    if (ec) {
      std::string why = ec.message();
      auto verdict = SSL_get_verify_result(connection_.tls()->native_handle());
      if (verdict != X509_V_OK)
        why = std::string{"the certificate is not trusted: "}
              + X509_verify_cert_error_string(verdict);
      fail(errc::upstream_failure, unreachable("TLS handshake failed: " + why));
      return;
    }
    send();
  }

  void send() {
    enter(phase::exchanging);
    connection_.visit([this](auto& stream) {
      http::async_write(stream, request_,
                        [self = shared_from_this()](const error_code& ec,
                                                    size_t) {
                          self->on_sent(ec);
                        });
    });
  }

  void on_sent(const error_code& ec) {
    if (finished_)
      return;
    if (ec) {
      fail(errc::upstream_failure,
           "sending the request to the LLM endpoint at " + ep_->origin
             + " failed: " + ec.message());
      return;
    }
    touch();
    read();
  }

  void read() {
    auto& body = parser_.get().body();
    body.data = chunk_.data();
    body.size = chunk_.size();
    connection_.visit([this](auto& stream) {
      http::async_read_some(stream, buffer_, parser_,
                            [self = shared_from_this()](const error_code& ec,
                                                        size_t) {
                              self->on_read(ec);
                            });
    });
  }

  void on_read(error_code ec) {
    if (finished_)
      return;
    touch();
    if (ec == http::error::need_buffer)
      ec = {}; // the chunk is full: take it and read on
    // An answer that ends with the connection, over TLS, from a server that
    // closes without a close_notify.
    if (ec == ssl::error::stream_truncated && parser_.is_header_done()
        && parser_.need_eof()) {
      ec = {};
      parser_.put_eof(ec);
    }
    if (!header_read_ && parser_.is_header_done())
      on_header();
    auto got = chunk_.size() - parser_.get().body().size;
    if (got > 0 && !take(chunk_.data(), got))
      return;
    if (ec) {
      fail(errc::upstream_failure,
           header_read_ ? "the LLM endpoint at " + ep_->origin
                            + " broke off its answer: " + ec.message()
                        : "the LLM endpoint at " + ep_->origin
                            + " did not answer: " + ec.message());
      return;
    }
    if (parser_.is_done()) {
      on_end();
      return;
    }
    // The client reads slowly: read on once it caught up (the upstream's
    // TCP window holds the rest meanwhile).
    if (flow_ && flow_->hold([self = shared_from_this()] {
          asio::post(self->deadline_.get_executor(),
                     [self] { self->read_on(); });
        })) {
      held_ = true;
      return;
    }
    read();
  }

  void cancel_now() {
    if (finished_)
      return;
    if (streaming_)
      finish(streamed(true));
    else
      finish(completion{std::string{}, true, {}});
  }

  void read_on() {
    held_ = false;
    if (finished_)
      return;
    touch();
    read();
  }

  void on_header() {
    header_read_ = true;
    auto& head = parser_.get();
    status_ = head.result_int();
    streaming_ = status_ == 200
                 && head[http::field::content_type].find("text/event-stream")
                      != beast::string_view::npos;
    signal_ = read_signal(head);
    if (on_signal_) {
      try {
        on_signal_(signal_);
      } catch (...) {
        spdlog::warn("openai provider: a signal callback threw");
      }
    }
  }

  // What the upstream says of its capacity (docs/limits.md, "When the
  // upstream refuses").
  upstream_signal read_signal(const http::response_header<>& head) const {
    upstream_signal s;
    s.status = status_;
    auto field = [&head](const char* name) {
      auto v = head[name];
      return std::string_view{v.data(), v.size()};
    };
    auto ms = parse_count(field("retry-after-ms"));
    s.retry_after_ms
      = ms >= 0 ? ms : parse_retry_after(field("retry-after"), std::time(nullptr));
    s.remaining_requests = parse_count(field("x-ratelimit-remaining-requests"));
    s.remaining_tokens = parse_count(field("x-ratelimit-remaining-tokens"));
    s.reset_requests_ms = parse_duration_ms(field("x-ratelimit-reset-requests"));
    s.reset_tokens_ms = parse_duration_ms(field("x-ratelimit-reset-tokens"));
    return s;
  }

  // False when the call ended.
  bool take(const char* data, size_t size) {
    if (!streaming_) {
      if (answer_.size() + size > max_answer) {
        fail(errc::upstream_failure, "the LLM endpoint at " + ep_->origin
                                       + " answered more than 16 MiB");
        return false;
      }
      answer_.append(data, size);
      return true;
    }
    if (sse_.feed(data, size))
      return true;
    if (sse_.stopped)
      finish(streamed(true));
    else
      fail(errc::upstream_failure, sse_.error);
    return false;
  }

  void on_end() {
    if (signal_.refused()) {
      // Refused for its load: the caller may send it again later.
      auto text = upstream_message(status_, answer_);
      if (signal_.retry_after_ms >= 0)
        text += " (retry after " + std::to_string(signal_.retry_after_ms)
                + " ms)";
      fail(errc::upstream_busy, std::move(text));
      return;
    }
    if (status_ != 200) {
      fail(errc::upstream_failure, upstream_message(status_, answer_));
      return;
    }
    if (streaming_) {
      finish(streamed(false));
      return;
    }
    // A plain (non-streamed) completion: text, tool calls or both.
    auto parsed = json::parse(answer_, nullptr, false);
    const json* message = nullptr;
    if (parsed.is_object() && parsed.contains("choices")
        && parsed["choices"].is_array() && !parsed["choices"].empty()
        && parsed["choices"][0].is_object()
        && parsed["choices"][0].contains("message")
        && parsed["choices"][0]["message"].is_object())
      message = &parsed["choices"][0]["message"];
    auto field = [message](const char* key) -> const json* {
      if (!message)
        return nullptr;
      auto it = message->find(key);
      return it == message->end() ? nullptr : &*it;
    };
    auto* content = field("content");
    auto* calls = field("tool_calls");
    bool has_text = content && content->is_string();
    bool has_calls = calls && calls->is_array() && !calls->empty();
    if (!has_text && !has_calls) {
      fail(errc::upstream_failure,
           "the LLM endpoint answered 200 without a completion: "
             + answer_.substr(0, 200));
      return;
    }
    completion out;
    if (has_text)
      out.text = content->get_ref<const std::string&>();
    bool more = out.text.empty() || offer_delta(on_delta_, out.text);
    tool_call_assembler whole{on_call_};
    if (has_calls)
      for (size_t i = 0; more && i < calls->size(); ++i)
        if (!whole.take((*calls)[i], i)) {
          if (!whole.stopped)
            return fail(errc::upstream_failure, whole.error);
          more = false;
        }
    out.interrupted = !more;
    out.tool_calls = std::move(whole.calls);
    read_usage(parsed, out);
    finish(std::move(out));
  }

  // What the stream brought so far.
  completion streamed(bool interrupted) {
    completion out;
    out.text = std::move(sse_.text);
    out.interrupted = interrupted;
    out.tool_calls = std::move(sse_.tools.calls);
    out.usage_reported = sse_.usage.usage_reported;
    out.prompt_tokens = sse_.usage.prompt_tokens;
    out.completion_tokens = sse_.usage.completion_tokens;
    return out;
  }

  // -- time -------------------------------------------------------------------

  // The watchdog wakes when the current phase's patience has passed since
  // the last progress, and rearms itself while bytes keep moving: one timer
  // wait per read timeout, not one per read.
  void enter(phase p) {
    phase_ = p;
    touch();
    arm_watchdog();
  }

  void touch() {
    last_progress_ = steady_clock::now();
  }

  milliseconds patience() const {
    return phase_ == phase::connecting ? ep_->connect_timeout
                                       : ep_->read_timeout;
  }

  void arm_watchdog() {
    watchdog_.expires_at(last_progress_ + patience());
    watchdog_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec)
        self->on_watchdog();
    });
  }

  void on_watchdog() {
    if (finished_)
      return;
    if (held_) // not reading: the upstream is not the one keeping still
      touch();
    if (steady_clock::now() - last_progress_ < patience()) {
      arm_watchdog();
      return;
    }
    auto waited = std::to_string(patience().count()) + " ms";
    if (phase_ == phase::connecting)
      fail(errc::upstream_failure, unreachable("no connection within "
                                               + waited));
    else
      fail(errc::timeout, "the LLM endpoint at " + ep_->origin
                            + " sent nothing for " + waited);
  }

  // -- the end ----------------------------------------------------------------

  std::string unreachable(const std::string& why) const {
    return "cannot reach the LLM endpoint at " + ep_->origin + ": " + why;
  }

  void fail(errc code, std::string why) {
    finish(make_error(code, std::move(why)));
  }

  // Ends the call once: the socket closes (aborting what is pending, whose
  // handlers then see `finished_`), the timers stop, `done` runs.
  void finish(caf::expected<completion> result) {
    if (finished_)
      return;
    finished_ = true;
    deadline_.cancel();
    watchdog_.cancel();
    resolver_.cancel();
    connection_.close();
    if (flow_)
      flow_->drop();
    deliver(std::move(result));
  }

  void deliver(caf::expected<completion> result) {
    finished_ = true;
    auto done = std::move(done_);
    done_ = nullptr;
    on_delta_ = nullptr;
    on_call_ = nullptr;
    if (!done)
      return;
    try {
      done(std::move(result));
    } catch (const std::exception& e) {
      spdlog::warn("openai provider: a completion callback threw: {}",
                   e.what());
    } catch (...) {
      spdlog::warn("openai provider: a completion callback threw");
    }
  }

  std::shared_ptr<const endpoint> ep_;
  http::request<http::string_body> request_;
  milliseconds timeout_;
  delta_callback on_delta_;
  tool_call_callback on_call_;
  completion_done done_;
  sse_reader sse_;
  tcp::resolver resolver_;
  net::tcp_or_tls connection_;
  asio::steady_timer deadline_;
  asio::steady_timer watchdog_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
  std::array<char, 4096> chunk_;
  std::string answer_; // a non-SSE body: an error or a plain completion
  phase phase_ = phase::connecting;
  steady_clock::time_point last_progress_;
  int status_ = 0;
  bool header_read_ = false;
  bool streaming_ = false;
  bool finished_ = false;
  std::shared_ptr<flow_control> flow_;
  bool held_ = false; // paused by the consumer's flow control
  upstream_signal_callback on_signal_;
  upstream_signal signal_;
};

} // namespace

openai_provider::openai_provider(openai_options options)
  : openai_provider(options, make_endpoint(options)) {
}

openai_provider::openai_provider(
  openai_options options, std::shared_ptr<const detail::openai_endpoint> ep)
  : options_(std::move(options)), endpoint_(std::move(ep)) {
  if (!options_.loops)
    options_.loops = net::make_io_pool(1);
}

openai_provider::~openai_provider() {
  // Releasing the last reference to the pool stops it and joins its
  // threads, which a thread of the pool cannot do (a callback that held
  // the provider): another thread lets it go.
  if (options_.loops->on_loop_thread())
    std::thread{[loops = std::move(options_.loops)]() mutable {
      loops.reset();
    }}.detach();
}

std::string openai_provider::name() const {
  return "openai:" + options_.model;
}

void openai_provider::launch(const prompt& messages,
                             const completion_options& options,
                             delta_callback on_delta, completion_done done) {
  if (!endpoint_->refused.empty()) {
    done(make_error(errc::invalid_argument, endpoint_->refused));
    return;
  }
  auto& loop = options_.loops->next();
  auto call = std::make_shared<upstream_call>(
    loop, endpoint_, make_request(*endpoint_, messages, options),
    options.timeout, std::move(on_delta), options.on_tool_call, std::move(done),
    options.flow, options.on_signal);
  asio::post(loop, [call] { call->begin(); });
}

bool openai_provider::start(prompt messages,
                            completion_options options,
                            delta_callback on_delta, completion_done done) {
  launch(messages, options, std::move(on_delta), std::move(done));
  return true;
}

caf::expected<completion>
openai_provider::complete(const prompt& messages,
                          const completion_options& options,
                          const delta_callback& on_delta) {
  if (options_.loops->on_loop_thread())
    return make_error(errc::unavailable,
                      "openai_provider::complete would wait for its own "
                      "event loop; call start there");
  std::promise<caf::expected<completion>> ended;
  auto result = ended.get_future();
  delta_callback forward;
  if (on_delta)
    forward = [&on_delta](std::string_view piece) { return on_delta(piece); };
  launch(messages, options, std::move(forward),
         [&ended](caf::expected<completion> r) {
           ended.set_value(std::move(r));
         });
  return result.get();
}

caf::expected<std::shared_ptr<llm_provider>>
make_openai_provider(openai_options options) {
  auto ep = make_endpoint(options);
  if (!ep->refused.empty())
    return make_error(errc::invalid_argument, ep->refused);
  return std::shared_ptr<llm_provider>{
    new openai_provider(std::move(options), std::move(ep))};
}

} // namespace spindle
