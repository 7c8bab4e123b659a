// spindle_fake_upstream: an OpenAI-compatible chat completions server on
// Asio and Beast, for the provider's tests and for load tests (docs/llm.md,
// "The fake upstream"). Event-driven: each connection is a few handlers and
// a timer on one of a few loops, so 10,000 concurrent streams need no more
// threads than 1,000.
//
//   POST /v1/chat/completions  "echo: {the last user message}", streamed as
//                              OpenAI's SSE (or plain JSON, or an error)
//   GET  /healthz              "ok"
//   GET  /stats                counters as JSON (requests, open streams, ...)
//
// It keeps counters only, nothing per request.

#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <iostream>
#include <optional>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "net/io_pool.hpp"
#include "net/tcp_or_tls.hpp"

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using error_code = boost::system::error_code;
using clock_type = std::chrono::steady_clock;

struct settings {
  std::string bind = "127.0.0.1";
  uint16_t port = 0;
  size_t threads = 2;
  double stream_seconds = 0;
  size_t chunks = 8;
  int64_t first_byte_ms = 0;
  int fail_status = 0;
  bool plain = false;
  bool stamp = false;
  size_t reply_bytes = 0;
  bool use_max_tokens = false;
  std::string tls_cert;
  std::string tls_key;
  bool exit_with_parent = false;
};

struct counters {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> open{0};
  std::atomic<uint64_t> max_open{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> aborted{0};

  void opened() {
    auto now = ++open;
    auto peak = max_open.load();
    while (now > peak && !max_open.compare_exchange_weak(peak, now)) {
    }
  }

  json to_json() const {
    return {{"connections", connections.load()}, {"requests", requests.load()},
            {"open", open.load()},               {"max_open", max_open.load()},
            {"completed", completed.load()},     {"aborted", aborted.load()}};
  }
};

struct server_state {
  settings config;
  counters stats;
  std::unique_ptr<ssl::context> tls;
};

// The reply to a request: "echo: " and the last user message, padded with
// a fixed filler to --reply-bytes.
std::string reply_for(const json& request, size_t min_bytes) {
  std::string last_user;
  auto messages = request.find("messages");
  if (messages != request.end() && messages->is_array())
    for (auto& m : *messages)
      if (m.is_object() && m.value("role", "") == "user"
          && m.contains("content") && m["content"].is_string())
        last_user = m["content"].get<std::string>();
  std::string reply = "echo: " + last_user;
  static const std::string filler = " lorem ipsum dolor sit amet";
  for (size_t i = 0; reply.size() < min_bytes; ++i)
    reply += filler[i % filler.size()];
  return reply;
}

// With --use-max-tokens: a reply of " the" said k times, k tokens in
// every tokenizer spindle has (cl100k, o200k), for k from half of the
// request's max_tokens to all of it, in turn; a request without
// max_tokens gets 16.
std::string tokens_reply(const json& request, uint64_t n) {
  uint64_t max = 0;
  auto m = request.find("max_tokens");
  if (m != request.end() && m->is_number_unsigned())
    max = m->get<uint64_t>();
  uint64_t k = 16;
  if (max > 0) {
    auto low = std::max<uint64_t>(1, max / 2);
    k = low + n % (max - low + 1);
  }
  std::string reply;
  reply.reserve(4 * k);
  for (uint64_t i = 0; i < k; ++i)
    reply += i == 0 ? "the" : " the";
  return reply;
}

// At most `parts` pieces, cut on UTF-8 boundaries, that add up to `text`.
std::vector<std::string> split(const std::string& text, size_t parts) {
  std::vector<std::string> out;
  parts = std::max<size_t>(1, std::min(parts, text.size()));
  size_t begin = 0;
  for (size_t i = 1; i <= parts && begin < text.size(); ++i) {
    size_t end = text.size() * i / parts;
    while (end < text.size()
           && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
      ++end;
    if (end > begin)
      out.push_back(text.substr(begin, end - begin));
    begin = std::max(begin, end);
  }
  return out;
}

std::string sse_event(const json& delta, const char* finish_reason) {
  json event{{"id", "chatcmpl-fake"},
             {"object", "chat.completion.chunk"},
             {"model", "fake"},
             {"choices",
              {{{"index", 0},
                {"delta", delta},
                {"finish_reason",
                 finish_reason ? json(finish_reason) : json(nullptr)}}}}};
  return "data: " + event.dump() + "\n\n";
}

std::string chunk(const std::string& data) {
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

class session : public std::enable_shared_from_this<session> {
public:
  session(tcp::socket socket, server_state& server)
    : server_(server), connection_(std::move(socket)),
      timer_(connection_.socket().get_executor()) {
    ++server_.stats.connections;
  }

  ~session() {
    --server_.stats.connections;
  }

  session(const session&) = delete;
  session& operator=(const session&) = delete;

  tcp::socket::executor_type executor() {
    return connection_.socket().get_executor();
  }

  void begin() {
    error_code ignored;
    connection_.socket().set_option(tcp::no_delay{true}, ignored);
    if (!server_.tls) {
      read_request();
      return;
    }
    connection_.start_tls(*server_.tls)
      .async_handshake(ssl::stream_base::server,
                       [self = shared_from_this()](const error_code& ec) {
                         if (ec)
                           self->close();
                         else
                           self->read_request();
                       });
  }

private:
  // While a stream is being written, the next request is read already:
  // its read failing is how a client that went away shows.
  void read_request() {
    parser_.emplace();
    parser_->body_limit(1u << 20);
    connection_.visit([this](auto& stream) {
      http::async_read(stream, buffer_, *parser_,
                       [self = shared_from_this()](const error_code& ec,
                                                   size_t) {
                         self->on_request(ec);
                       });
    });
  }

  void on_request(const error_code& ec) {
    if (closed_)
      return;
    if (ec) {
      close();
      return;
    }
    if (streaming_) {
      pipelined_ = parser_->release(); // answered when the stream ends
      return;
    }
    handle(parser_->release());
  }

  void handle(http::request<http::string_body> req) {
    keep_alive_ = req.keep_alive();
    auto target = req.target();
    if (req.method() == http::verb::get && target == "/healthz")
      return answer(200, "text/plain", "ok\n");
    if (req.method() == http::verb::get && target == "/stats")
      return answer(200, "application/json", server_.stats.to_json().dump());
    if (req.method() != http::verb::post
        || target != "/v1/chat/completions")
      return answer(404, "application/json",
                    R"({"error":{"message":"no such route"}})");
    ++server_.stats.requests;
    auto request = json::parse(req.body(), nullptr, false);
    if (!request.is_object())
      return answer(400, "application/json",
                    R"({"error":{"message":"the body is not a JSON object"}})");
    auto reply = server_.config.use_max_tokens
                   ? tokens_reply(request, server_.stats.requests.load())
                   : reply_for(request, server_.config.reply_bytes);
    auto delay = std::chrono::milliseconds(server_.config.first_byte_ms);
    if (delay.count() == 0)
      return respond(std::move(reply));
    timer_.expires_after(delay);
    timer_.async_wait([self = shared_from_this(), reply = std::move(reply)](
                        const error_code& ec) mutable {
      if (!ec && !self->closed_)
        self->respond(std::move(reply));
    });
  }

  void respond(std::string reply) {
    auto& config = server_.config;
    if (config.fail_status != 0) {
      json error{{"error",
                  {{"message", "the fake upstream fails with "
                                 + std::to_string(config.fail_status)},
                   {"type", "fake_failure"}}}};
      return answer(config.fail_status, "application/json", error.dump());
    }
    if (config.plain) {
      json completion{
        {"id", "chatcmpl-fake"},
        {"object", "chat.completion"},
        {"model", "fake"},
        {"choices",
         {{{"index", 0},
           {"message", {{"role", "assistant"}, {"content", reply}}},
           {"finish_reason", "stop"}}}}};
      return answer(200, "application/json", completion.dump());
    }
    stream(std::move(reply));
  }

  void answer(int status, const char* type, const std::string& body) {
    out_ = "HTTP/1.1 " + std::to_string(status) + " "
           + std::string{http::obsolete_reason(http::int_to_status(status))}
           + "\r\nContent-Type: " + type
           + "\r\nContent-Length: " + std::to_string(body.size())
           + (keep_alive_ ? "\r\n\r\n" : "\r\nConnection: close\r\n\r\n")
           + body;
    write([this] {
      if (keep_alive_)
        read_request();
      else
        close();
    });
  }

  // -- a stream: pieces spread evenly over --stream-seconds ------------------

  void stream(std::string reply) {
    pieces_ = split(reply, server_.config.chunks);
    next_ = 0;
    streaming_ = true;
    server_.stats.opened();
    auto seconds = std::chrono::duration<double>(server_.config.stream_seconds);
    interval_ = std::chrono::duration_cast<clock_type::duration>(
      seconds / std::max<size_t>(pieces_.size(), 1));
    started_ = clock_type::now();
    out_ = std::string{"HTTP/1.1 200 OK\r\n"
                       "Content-Type: text/event-stream\r\n"
                       "Cache-Control: no-cache\r\n"
                       "Transfer-Encoding: chunked\r\n"}
           + (keep_alive_ ? "\r\n" : "Connection: close\r\n\r\n")
           + chunk(sse_event({{"role", "assistant"}, {"content", ""}},
                             nullptr));
    read_request();
    write_due();
  }

  // The first piece's stamp: nanoseconds of CLOCK_MONOTONIC (steady_clock),
  // the clock every process on the machine shares, so a client can tell
  // how long after the upstream's first byte its first delta came.
  static int64_t stamp_ns(clock_type::time_point at) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
             at.time_since_epoch())
      .count();
  }

  clock_type::time_point due(size_t piece) const {
    return started_ + interval_ * static_cast<long>(piece);
  }

  // Writes every piece that is due (and the end, once all are out), then
  // waits for the next.
  void write_due() {
    auto now = clock_type::now();
    while (next_ < pieces_.size() && due(next_) <= now) {
      auto piece = pieces_[next_];
      if (next_ == 0 && server_.config.stamp)
        piece = "@@t=" + std::to_string(stamp_ns(now)) + "@@" + piece;
      out_ += chunk(sse_event({{"content", piece}}, nullptr));
      ++next_;
    }
    bool last = next_ == pieces_.size() && due(pieces_.size()) <= now;
    if (last)
      out_ += chunk(sse_event(json::object(), "stop"))
              + chunk("data: [DONE]\n\n") + "0\r\n\r\n";
    if (out_.empty())
      return wait_for(next_);
    write([this, last] {
      if (last)
        end_stream();
      else
        wait_for(next_);
    });
  }

  void wait_for(size_t piece) {
    timer_.expires_at(due(piece));
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec && !self->closed_)
        self->write_due();
    });
  }

  void end_stream() {
    streaming_ = false;
    --server_.stats.open;
    ++server_.stats.completed;
    pieces_.clear();
    if (!keep_alive_)
      return close();
    if (pipelined_) {
      auto req = std::move(*pipelined_);
      pipelined_.reset();
      handle(std::move(req));
    }
    // Otherwise the next request's read is pending already.
  }

  // -- plumbing ---------------------------------------------------------------

  template <class Then>
  void write(Then then) {
    connection_.visit([this, then](auto& stream) {
      asio::async_write(stream, asio::buffer(out_),
                        [self = shared_from_this(), then](const error_code& ec,
                                                          size_t) {
                          if (self->closed_)
                            return;
                          self->out_.clear();
                          if (ec) {
                            self->close();
                            return;
                          }
                          then();
                        });
    });
  }

  // A stream that is still being written when the connection ends was
  // abandoned by its client.
  void close() {
    if (streaming_) {
      streaming_ = false;
      --server_.stats.open;
      ++server_.stats.aborted;
    }
    closed_ = true;
    timer_.cancel();
    connection_.close();
  }

  server_state& server_;
  spindle::net::tcp_or_tls connection_;
  asio::steady_timer timer_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::request<http::string_body>> pipelined_;
  std::string out_;
  std::vector<std::string> pieces_;
  size_t next_ = 0;
  clock_type::time_point started_;
  clock_type::duration interval_{};
  bool keep_alive_ = true;
  bool streaming_ = false;
  bool closed_ = false;
};

class listener {
public:
  listener(spindle::net::io_pool& loops, server_state& server)
    : loops_(loops), server_(server), acceptor_(loops.at(0)),
      retry_(loops.at(0)) {
    tcp::endpoint at{asio::ip::make_address(server.config.bind),
                     server.config.port};
    acceptor_.open(at.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address{true});
    acceptor_.bind(at);
    acceptor_.listen(asio::socket_base::max_listen_connections);
  }

  uint16_t port() const {
    return acceptor_.local_endpoint().port();
  }

  void accept() {
    acceptor_.async_accept(loops_.next(), [this](const error_code& ec,
                                                 tcp::socket socket) {
      if (ec == asio::error::operation_aborted)
        return;
      if (ec) {
        // Out of descriptors, most likely: let some connections end.
        std::cerr << "spindle_fake_upstream: accept: " << ec.message() << "\n";
        retry_.expires_after(std::chrono::milliseconds(50));
        retry_.async_wait([this](const error_code& e) {
          if (!e)
            accept();
        });
        return;
      }
      auto s = std::make_shared<session>(std::move(socket), server_);
      asio::post(s->executor(), [s] { s->begin(); });
      accept();
    });
  }

private:
  spindle::net::io_pool& loops_;
  server_state& server_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
};

void raise_descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0
      && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

} // namespace

int main(int argc, char** argv) {
  server_state server;
  auto& config = server.config;
  CLI::App app{"An OpenAI-compatible fake upstream: streams \"echo: {the "
               "last user message}\" as SSE"};
  app.add_option("--bind", config.bind, "address to listen on")
    ->capture_default_str();
  app.add_option("--port", config.port,
                 "port; 0 picks a free one (printed as the first line)")
    ->capture_default_str();
  app.add_option("--threads", config.threads, "event loop threads")
    ->capture_default_str()
    ->check(CLI::Range(1, 256));
  app.add_option("--stream-seconds", config.stream_seconds,
                 "spread each reply's chunks evenly over this many seconds")
    ->capture_default_str()
    ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--chunks", config.chunks,
                 "pieces per reply (fewer when the reply is shorter)")
    ->capture_default_str()
    ->check(CLI::Range(1, 1000000));
  app.add_option("--first-byte-ms", config.first_byte_ms,
                 "wait this long before answering a completion")
    ->capture_default_str()
    ->check(CLI::Range(0, 3600000));
  app.add_option("--fail-status", config.fail_status,
                 "answer every completion with this status and an OpenAI "
                 "error body")
    ->check(CLI::Range(400, 599));
  app.add_flag("--stamp", config.stamp,
               "begin each stream's first piece with @@t=NS@@, the "
               "steady clock's nanoseconds when it was written");
  app.add_flag("--plain", config.plain,
               "answer with a plain JSON completion instead of a stream");
  app.add_option("--reply-bytes", config.reply_bytes,
                 "pad each reply with a filler to at least this many bytes");
  app.add_flag("--use-max-tokens", config.use_max_tokens,
               "reply with \"the\" said from half of the request's "
               "max_tokens to all of it, in turn (token accounting)");
  app.add_option("--tls-cert", config.tls_cert,
                 "serve https with this PEM certificate chain");
  app.add_option("--tls-key", config.tls_key, "the certificate's PEM key");
  app.add_flag("--exit-with-parent", config.exit_with_parent,
               "end when the process that started it ends (tests)");
  CLI11_PARSE(app, argc, argv);
  if (config.tls_cert.empty() != config.tls_key.empty()) {
    std::cerr << "spindle_fake_upstream: --tls-cert and --tls-key go "
                 "together\n";
    return 2;
  }

  if (config.exit_with_parent) {
    auto parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      return 0;
  }
  raise_descriptor_limit();
  std::signal(SIGPIPE, SIG_IGN);
  // The loops inherit this mask: the signals reach sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    if (!config.tls_cert.empty()) {
      server.tls = std::make_unique<ssl::context>(ssl::context::tls_server);
      server.tls->use_certificate_chain_file(config.tls_cert);
      server.tls->use_private_key_file(config.tls_key, ssl::context::pem);
    }
    spindle::net::io_pool loops{config.threads};
    listener accepting{loops, server};
    std::cout << accepting.port() << std::endl;
    asio::post(loops.at(0), [&accepting] { accepting.accept(); });
    int sig = 0;
    sigwait(&stop_signals, &sig);
    loops.stop();
  } catch (const std::exception& e) {
    std::cerr << "spindle_fake_upstream: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
