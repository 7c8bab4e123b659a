#include "http_server.hpp"

#include <algorithm>
#include <array>
#include <future>
#include <optional>
#include <deque>
#include <unordered_set>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/parser.hpp>

#include "spindle/messages/error.hpp"
#include "net/io_pool.hpp"

namespace spindle::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

// -- request helpers -------------------------------------------------------

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i] >= 'A' && a[i] <= 'Z' ? a[i] + 32 : a[i];
    auto y = b[i] >= 'A' && b[i] <= 'Z' ? b[i] + 32 : b[i];
    if (x != y)
      return false;
  }
  return true;
}

} // namespace

std::string request::get_param_value(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? std::string{} : it->second;
}

std::string request::get_header_value(std::string_view name) const {
  for (auto& [key, value] : headers)
    if (iequals(key, name))
      return value;
  return {};
}

std::string_view request::header_view(std::string_view name) const {
  for (auto& [key, value] : headers)
    if (iequals(key, name))
      return value;
  return {};
}

std::string_view request::indexed_header(int at, std::string_view name) const {
  if (!indexed)
    return header_view(name);
  return at < 0 ? std::string_view{}
                : std::string_view{headers[static_cast<size_t>(at)].second};
}

std::string_view request::authorization() const {
  return indexed_header(authorization_at, "Authorization");
}

std::string_view request::tenant_header() const {
  return indexed_header(tenant_at, "Spindle-Tenant");
}

bool request::has_header(std::string_view name) const {
  for (auto& h : headers)
    if (iequals(h.first, name))
      return true;
  return false;
}

std::string percent_decode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    auto c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      auto hi = hex_value(text[i + 1]);
      auto lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += plus_is_space && c == '+' ? ' ' : c;
  }
  return out;
}

std::multimap<std::string, std::string> parse_query(std::string_view query) {
  std::multimap<std::string, std::string> out;
  while (!query.empty()) {
    auto amp = query.find('&');
    auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{}
                                          : query.substr(amp + 1);
    if (pair.empty())
      continue;
    auto eq = pair.find('=');
    auto key = pair.substr(0, eq);
    auto value = eq == std::string_view::npos ? std::string_view{}
                                              : pair.substr(eq + 1);
    out.emplace(percent_decode(key, true), percent_decode(value, true));
  }
  return out;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 507: return "Insufficient Storage";
    default: return "Unknown";
  }
}

responder::~responder() = default;

// -- the server ------------------------------------------------------------

namespace {

class connection;

std::string serialize_head(int status, const std::string& content_type,
                           const std::vector<std::pair<std::string,
                                                       std::string>>& headers,
                           bool keep_alive) {
  std::string out;
  out.reserve(160);
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  out += reason_phrase(status);
  out += "\r\n";
  if (!content_type.empty()) {
    out += "Content-Type: ";
    out += content_type;
    out += "\r\n";
  }
  for (auto& [name, value] : headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  if (!keep_alive)
    out += "Connection: close\r\n";
  return out;
}

std::string serialize(const response& res, bool keep_alive) {
  auto out = serialize_head(res.status, res.content_type, res.headers,
                            keep_alive);
  // A 204 or 304 has no body and no Content-Length (RFC 9110, 8.6).
  if (res.status == 204 || res.status == 304) {
    out += "\r\n";
    return out;
  }
  out += "Content-Length: ";
  out += std::to_string(res.body.size());
  out += "\r\n\r\n";
  out += res.body;
  return out;
}

std::string chunk_frame(const std::string& data) {
  static const char digits[] = "0123456789abcdef";
  std::string size;
  auto n = data.size();
  do {
    size.insert(size.begin(), digits[n & 0xf]);
    n >>= 4;
  } while (n > 0);
  std::string out;
  out.reserve(size.size() + data.size() + 4);
  out += size;
  out += "\r\n";
  out += data;
  out += "\r\n";
  return out;
}

} // namespace

struct http_server::impl : std::enable_shared_from_this<http_server::impl> {
  impl(net::io_pool& l, limits lim, dispatch_fn d, refusal_fn r)
    : loops(l), lims(lim), dispatch(std::move(d)), refuse(std::move(r)),
      registries(l.size()) {
  }

  net::io_pool& loops;
  limits lims;
  dispatch_fn dispatch;
  refusal_fn refuse;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> open{0};
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> timed_out{0};
  std::atomic<uint64_t> cut_off{0};
  std::atomic<uint64_t> paused{0}; // streams whose producer is paused now
  std::atomic<uint64_t> pauses{0}; // times a stream's producer was paused
  std::mutex drain_mx;
  std::condition_variable drained;
  /// Connections of each loop, for stop(). A connection's last reference
  /// may be dropped on another thread (a handler's), hence the locks.
  struct registry {
    std::mutex mx;
    std::unordered_set<connection*> conns;
  };
  std::vector<registry> registries;

  void enlist(size_t loop, connection* c) {
    std::lock_guard<std::mutex> guard{registries[loop].mx};
    registries[loop].conns.insert(c);
  }
  void delist(size_t loop, connection* c) {
    std::lock_guard<std::mutex> guard{registries[loop].mx};
    registries[loop].conns.erase(c);
  }

  /// Open connections of each loop (accepted, not yet closed).
  std::unique_ptr<std::atomic<uint32_t>[]> held{
    new std::atomic<uint32_t>[registries.size()]()};
  /// A loop takes up to this many connections before the next loop gets
  /// one; past that, a new connection goes to the loop holding the
  /// fewest. A few busy connections are served by one thread that stays
  /// awake instead of several that each sleep and wake per request (on
  /// two cores shared with the clients, 8 connections on one loop answered
  /// /healthz 8 % faster than on two); many are spread over every loop.
  static constexpr uint32_t packed_per_loop = 16;
  size_t pick_loop() const noexcept;

  void accept();
  void sweep(size_t loop);
  /// Deadline sweeps, one timer per loop.
  std::vector<std::unique_ptr<asio::steady_timer>> sweepers;
  static constexpr std::chrono::milliseconds sweep_every{100};

  void closed_one(size_t loop) {
    held[loop].fetch_sub(1, std::memory_order_relaxed);
    if (open.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> guard{drain_mx};
      drained.notify_all();
    }
  }
};

namespace {

using impl_ptr = std::shared_ptr<http_server::impl>;

class stream_responder;

/// One client connection, on one loop. Reads a request, dispatches it,
/// writes its reply (whole or streamed), then reads the next one.
class connection : public std::enable_shared_from_this<connection> {
public:
  connection(impl_ptr srv, tcp::socket sock, size_t loop)
    : srv_(std::move(srv)), socket_(std::move(sock)),
      loop_(loop) {
  }

  ~connection() {
    close();
  }

  void start() {
    srv_->enlist(loop_, this);
    registered_ = true;
    error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    if (srv_->lims.send_buffer > 0)
      socket_.set_option(asio::socket_base::send_buffer_size(static_cast<int>(
                           std::min<size_t>(srv_->lims.send_buffer, 1u << 30))),
                         ec);
    socket_.non_blocking(true, ec);
    auto ep = socket_.remote_endpoint(ec);
    if (!ec)
      remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    if (srv_->stopping) {
      close();
      return;
    }
    wait_for_request(srv_->lims.header_timeout);
  }

  /// Refuses a connection over the cap with a 503 and closes it.
  void refuse_over_cap() {
    response res = srv_->refuse(request{}, 503,
                                "the server has too many open connections; "
                                "try again later");
    srv_->enlist(loop_, this); // swept like the others
    registered_ = true;
    keep_alive_ = false;
    state_ = state::writing;
    queue(serialize(res, false));
    arm(srv_->lims.header_timeout, false);
  }

  /// The server is stopping: close when idle, else after this request.
  void on_stop() {
    keep_alive_ = false;
    if (state_ == state::idle)
      close();
  }

  auto executor() {
    return socket_.get_executor();
  }

  /// True on this connection's loop thread.
  bool on_loop() const {
    return srv_->loops.at(loop_).get_executor().running_in_this_thread();
  }

  // -- called on the loop by stream_responder ------------------------------

  void send(response res) {
    if (closed_)
      return;
    auto keep = keep_alive_ && !srv_->stopping;
    keep_alive_ = keep;
    state_ = state::writing;
    queue(serialize(res, keep));
  }

  void begin_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers) {
    if (closed_)
      return;
    auto keep = keep_alive_ && !srv_->stopping;
    keep_alive_ = keep;
    state_ = state::streaming;
    auto head = serialize_head(status, content_type, headers, keep);
    head += "Transfer-Encoding: chunked\r\n\r\n";
    queue_soon(std::move(head));
  }

  void stream_chunk(std::string data, size_t accounted) {
    if (closed_)
      return;
    queue_soon(chunk_frame(data), accounted);
  }

  void end_stream() {
    if (closed_)
      return;
    state_ = state::writing;
    queue_soon("0\r\n\r\n");
  }

  void cut_off() {
    if (closed_)
      return;
    ++srv_->cut_off;
    close();
  }

  /// The server's counters, for the responder on any thread.
  http_server::impl& server() const noexcept {
    return *srv_;
  }

  void close() {
    if (closed_)
      return;
    closed_ = true;
    error_code ec;
    deadline_at_ = clock::time_point::max();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    mark_gone();
    if (registered_) {
      srv_->delist(loop_, this);
      registered_ = false;
    }
    srv_->closed_one(loop_);
  }

  std::weak_ptr<stream_responder> current_;

private:
  enum class state { idle, reading, handling, streaming, writing };

  void mark_gone();

public:
  using clock = std::chrono::steady_clock;

  // A deadline for what the connection waits for now; when it passes, the
  // loop's sweep closes the connection (which ends every pending
  // operation). Setting one costs a clock read, not a timer.
  void arm(std::chrono::milliseconds after, bool count_timeout = true) {
    deadline_at_ = clock::now() + after;
    count_timeout_ = count_timeout;
  }

  void disarm() {
    deadline_at_ = clock::time_point::max();
  }

  /// On the loop: closes the connection if its deadline passed.
  bool sweep(clock::time_point now) {
    if (closed_ || deadline_at_ > now)
      return false;
    if (count_timeout_)
      ++srv_->timed_out;
    close();
    return true;
  }

private:

  // Waits until the next request's first byte arrives (or is buffered).
  void wait_for_request(std::chrono::milliseconds idle) {
    state_ = state::idle;
    if (srv_->stopping && !first_) {
      close();
      return;
    }
    if (buffer_.size() > 0) {
      read_header();
      return;
    }
    arm(idle);
    // One read for the whole of a small request: it is parsed from the
    // buffer without another trip through the reactor.
    socket_.async_read_some(
      buffer_.prepare(16 * 1024),
      [self = shared_from_this()](const error_code& ec, size_t n) {
        if (self->closed_ || self->state_ != state::idle)
          return;
        if (ec) {
          self->close();
          return;
        }
        self->buffer_.commit(n);
        self->read_header();
      });
  }

  void read_header() {
    state_ = state::reading;
    first_ = false;
    parser_.emplace();
    parser_->header_limit(
      static_cast<std::uint32_t>(srv_->lims.header_bytes));
    parser_->body_limit(srv_->lims.body_bytes);
    if (buffer_.size() > 0) {
      error_code ec;
      while (buffer_.size() > 0 && !parser_->is_header_done()) {
        auto used = parser_->put(buffer_.data(), ec);
        buffer_.consume(used);
        if (ec || used == 0)
          break;
      }
      if (ec == beast::http::error::need_more)
        ec = {};
      if (ec || parser_->is_header_done()) {
        disarm();
        on_header(ec);
        return;
      }
    }
    arm(srv_->lims.header_timeout);
    beast::http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](const error_code& ec, size_t) {
        self->on_header(ec);
      });
  }

  void on_header(const error_code& ec) {
    if (closed_)
      return;
    if (ec) {
      if (ec == beast::http::error::body_limit)
        return refuse(413, "the request body exceeds the server's limit");
      if (ec == beast::http::error::header_limit)
        return refuse(431, "the request's headers are larger than "
                             + std::to_string(srv_->lims.header_bytes)
                             + " bytes");
      if (ec == beast::http::error::end_of_stream
          || ec == asio::error::eof || ec == asio::error::operation_aborted
          || ec == asio::error::connection_reset)
        return close();
      return refuse(400, "the request could not be parsed: " + ec.message());
    }
    auto& msg = parser_->get();
    req_ = std::make_shared<request>();
    req_->method = std::string{msg.method_string()};
    req_->target = std::string{msg.target()};
    req_->remote = remote_;
    size_t count = 0;
    for (auto i = msg.begin(); i != msg.end(); ++i)
      ++count;
    req_->headers.reserve(std::min(count, srv_->lims.header_count + 1));
    req_->indexed = true;
    for (auto& field : msg) {
      if (req_->headers.size() > srv_->lims.header_count)
        break; // refused below
      auto at = static_cast<int>(req_->headers.size());
      if (field.name() == beast::http::field::authorization) {
        if (req_->authorization_at < 0)
          req_->authorization_at = at;
      } else if (field.name() == beast::http::field::unknown
                 && req_->tenant_at < 0
                 && iequals(std::string_view{field.name_string().data(),
                                             field.name_string().size()},
                            "Spindle-Tenant")) {
        req_->tenant_at = at;
      }
      req_->headers.emplace_back(std::string{field.name_string()},
                                 std::string{field.value()});
    }
    auto q = req_->target.find('?');
    req_->path = percent_decode(std::string_view{req_->target}.substr(0, q),
                                false);
    if (q != std::string::npos)
      req_->params = parse_query(std::string_view{req_->target}.substr(q + 1));
    keep_alive_ = msg.keep_alive();
    if (req_->target.size() > srv_->lims.url_bytes)
      return refuse(414, "the request line is too long (a path segment such "
                         "as a thread ID may have at most 128 characters)");
    if (count > srv_->lims.header_count)
      return refuse(431, "the request has more than "
                           + std::to_string(srv_->lims.header_count)
                           + " header fields");
    if (auto length = parser_->content_length();
        length && *length > srv_->lims.body_bytes)
      return refuse(413, "the request body exceeds the server's limit");
    if (parser_->is_done())
      return dispatch();
    // A client that asked may send its body now.
    if (iequals(req_->get_header_value("Expect"), "100-continue"))
      queue("HTTP/1.1 100 Continue\r\n\r\n");
    arm(srv_->lims.body_timeout);
    beast::http::async_read(socket_, buffer_, *parser_,
                            [self = shared_from_this()](const error_code& e,
                                                        size_t) {
                              self->on_body(e);
                            });
  }

  void on_body(const error_code& ec) {
    if (closed_)
      return;
    if (ec) {
      if (ec == beast::http::error::body_limit)
        return refuse(413, "the request body exceeds the server's limit");
      if (ec == asio::error::operation_aborted || ec == asio::error::eof
          || ec == beast::http::error::end_of_stream
          || ec == beast::http::error::partial_message
          || ec == asio::error::connection_reset)
        return close();
      return refuse(400, "the request body could not be read: "
                           + ec.message());
    }
    dispatch();
  }

  void dispatch();

  // Answers a request refused before dispatch, and closes after it: what
  // is left of it on the connection is never read as a request.
  void refuse(int status, const std::string& message) {
    disarm();
    if (!req_) {
      req_ = std::make_shared<request>();
      req_->remote = remote_;
    }
    keep_alive_ = false;
    send(srv_->refuse(*req_, status, message));
  }

  // While a request is handled nothing is read, but a client that closes
  // its connection is noticed at once (an SSE client going away).
  void watch() {
    socket_.async_wait(
      tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
        if (self->closed_)
          return;
        if (self->state_ != state::handling && self->state_ != state::streaming
            && self->state_ != state::writing)
          return;
        if (ec)
          return self->close();
        char probe;
        error_code peek_ec;
        auto n = self->socket_.receive(asio::buffer(&probe, 1),
                                       tcp::socket::message_peek, peek_ec);
        if (peek_ec == asio::error::would_block)
          return self->watch();
        if (peek_ec || n == 0)
          return self->close(); // the client went away
        // A pipelined request: read it after this reply.
      });
  }

  void queue(std::string bytes, size_t accounted = 0) {
    out_.push_back(std::move(bytes));
    out_accounted_.push_back(accounted);
    if (!writing_)
      flush();
  }

  // A stream's pieces are written once the handlers already queued on the
  // loop have run: a stream's head and its first event, or deltas that
  // came together, go out in one send instead of one each.
  void queue_soon(std::string bytes, size_t accounted = 0) {
    out_.push_back(std::move(bytes));
    out_accounted_.push_back(accounted);
    if (writing_ || flush_posted_)
      return;
    flush_posted_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      self->flush_posted_ = false;
      if (!self->writing_)
        self->flush(); // else on_written sends what is queued
    });
  }

  void flush();
  void on_written(const error_code& ec);

  void drain() {
    auto scratch = std::make_shared<std::array<char, 16384>>();
    socket_.async_read_some(
      asio::buffer(*scratch),
      [self = shared_from_this(), scratch](const error_code& ec, size_t) {
        if (self->closed_)
          return;
        if (ec)
          return self->close();
        self->drain();
      });
  }

  impl_ptr srv_;
  tcp::socket socket_;
  clock::time_point deadline_at_ = clock::time_point::max();
  bool count_timeout_ = true;
  size_t loop_;
  bool registered_ = false;
  bool closed_ = false;
  bool first_ = true;
  bool keep_alive_ = true;
  bool writing_ = false;
  bool flush_posted_ = false;
  state state_ = state::idle;
  std::string remote_;
  beast::flat_buffer buffer_{64 * 1024};
  std::optional<beast::http::request_parser<beast::http::string_body>>
    parser_;
  std::shared_ptr<request> req_;
  std::deque<std::string> out_;
  std::deque<size_t> out_accounted_;
  std::string wbuf_;
  size_t wbuf_accounted_ = 0;
};

/// The responder of one request: hops onto the connection's loop.
class stream_responder : public responder,
                         public std::enable_shared_from_this<stream_responder> {
public:
  stream_responder(std::shared_ptr<connection> conn, size_t buffer_limit)
    : conn_(std::move(conn)),
      limit_(buffer_limit),
      high_(std::min(buffer_limit / 2, high_water)),
      low_(high_ / 4) {
  }

  /// Backpressure's marks: the producer is paused past the high one (64 KiB,
  /// or half the stream buffer when that is smaller) and resumed at the low
  /// one, a quarter of it.
  static constexpr size_t high_water = 64 * 1024;

  ~stream_responder() override {
    if (pausing_)
      --conn_->server().paused;
    if (!answered_.exchange(true)) {
      response res;
      res.status = 500;
      res.set_content(R"({"error":{"code":"internal","message":"the route )"
                      R"(gave no answer"}})",
                      "application/json");
      auto c = conn_;
      asio::post(c->executor(), [c, res = std::move(res)]() mutable {
        c->send(std::move(res));
      });
    } else if (streaming_ && !ended_) {
      // A stream dropped without its end: the reply is incomplete, so the
      // connection cannot be reused.
      auto c = conn_;
      asio::post(c->executor(), [c] { c->close(); });
    }
  }

  void send(response res) override {
    if (answered_.exchange(true))
      return;
    auto c = conn_;
    if (c->on_loop()) {
      c->send(std::move(res)); // answered on the connection's own loop
      return;
    }
    asio::post(c->executor(), [c, res = std::move(res)]() mutable {
      c->send(std::move(res));
    });
  }

  void begin_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers)
    override {
    if (answered_.exchange(true))
      return;
    streaming_ = true;
    stream_op op;
    op.what = stream_op::begin;
    op.status = status;
    op.data = std::move(content_type);
    op.headers = std::move(headers);
    push(std::move(op));
  }

  bool write(std::string chunk) override {
    if (gone_ || !streaming_ || ended_)
      return false;
    if (chunk.empty())
      return true;
    auto size = chunk.size();
    auto pending = buffered_.fetch_add(size) + size;
    stream_op op;
    if (pending > limit_) {
      // A producer that does not honour the flow control.
      gone_ = true;
      op.what = stream_op::cut;
      push(std::move(op));
      return false;
    }
    if (pending > high_)
      maybe_pause();
    op.what = stream_op::chunk;
    op.data = std::move(chunk);
    op.size = size;
    push(std::move(op));
    return true;
  }

  std::shared_ptr<flow_control> flow() override {
    return flow_;
  }

  void end_stream() override {
    if (!streaming_ || ended_.exchange(true))
      return;
    stream_op op;
    op.what = stream_op::end;
    push(std::move(op));
  }

  bool gone() const noexcept override {
    return gone_;
  }

  void on_gone(std::function<void()> f) override {
    auto self = shared_from_this();
    auto c = conn_;
    asio::post(c->executor(), [self, f = std::move(f)]() mutable {
      if (self->gone_) {
        f();
        return;
      }
      self->gone_handlers_.push_back(std::move(f));
    });
  }

  // On the loop.
  void written(size_t bytes) {
    auto left = buffered_.fetch_sub(bytes) - bytes;
    if (left <= low_ && pausing_.load(std::memory_order_acquire))
      maybe_resume(false);
  }

  // On the loop.
  void mark_gone() {
    gone_ = true;
    // A paused producer reads on, is told nobody listens, and stops.
    maybe_resume(true);
    auto handlers = std::move(gone_handlers_);
    gone_handlers_.clear();
    for (auto& f : handlers)
      f();
  }

  bool finished() const noexcept {
    return answered_ && (!streaming_ || ended_);
  }

private:
  /// One step of a streamed reply, applied on the connection's loop.
  struct stream_op {
    enum kind { begin, chunk, end, cut } what = chunk;
    int status = 0;
    std::string data; // the chunk, or begin's content type
    size_t size = 0;
    std::vector<std::pair<std::string, std::string>> headers;
  };

  // A stream's steps reach the loop in the order they were called, from
  // whichever threads: they queue here and one posted handler applies what
  // has queued. Posting each step alone would not keep that order: Asio
  // runs a handler posted from another thread before the handlers the loop
  // thread posted in the handler it is still running (they wait in its
  // private queue until that handler returns), so a producer that answered
  // at once could end a stream before the loop had begun it.
  void push(stream_op op) {
    bool post = false;
    {
      std::lock_guard<std::mutex> guard{ops_mx_};
      ops_.push_back(std::move(op));
      post = !apply_posted_;
      apply_posted_ = true;
    }
    if (post)
      asio::post(conn_->executor(),
                 [self = shared_from_this()] { self->apply(); });
  }

  // On the loop.
  void apply() {
    std::vector<stream_op> ops;
    {
      std::lock_guard<std::mutex> guard{ops_mx_};
      ops.swap(ops_);
      apply_posted_ = false;
    }
    for (auto& op : ops)
      switch (op.what) {
        case stream_op::begin:
          conn_->begin_stream(op.status, std::move(op.data),
                              std::move(op.headers));
          break;
        case stream_op::chunk:
          conn_->stream_chunk(std::move(op.data), op.size);
          break;
        case stream_op::end:
          conn_->end_stream();
          break;
        case stream_op::cut:
          conn_->cut_off();
          break;
      }
  }

  // The decisions read the unsent count under one lock: a pause decided on
  // the producer's thread and a resume on the loop cannot cross (a resume
  // before the pause it answers would leave the producer paused).
  void maybe_pause() {
    std::lock_guard<std::mutex> guard{flow_mx_};
    if (pausing_ || gone_ || buffered_.load() <= high_)
      return;
    pausing_ = true;
    flow_->pause();
    auto& srv = conn_->server();
    ++srv.paused;
    ++srv.pauses;
  }

  void maybe_resume(bool always) {
    std::lock_guard<std::mutex> guard{flow_mx_};
    if (!pausing_) {
      if (always)
        flow_->resume();
      return;
    }
    if (!always && buffered_.load() > low_)
      return;
    pausing_ = false;
    --conn_->server().paused;
    flow_->resume();
  }

  std::shared_ptr<connection> conn_;
  size_t limit_;
  size_t high_;
  size_t low_;
  std::shared_ptr<flow_control> flow_ = std::make_shared<flow_control>();
  std::mutex flow_mx_;
  std::atomic<bool> pausing_{false};
  std::atomic<bool> answered_{false};
  std::atomic<bool> streaming_{false};
  std::atomic<bool> ended_{false};
  std::atomic<bool> gone_{false};
  std::atomic<size_t> buffered_{0};
  std::vector<std::function<void()>> gone_handlers_;
  std::mutex ops_mx_;
  std::vector<stream_op> ops_;
  bool apply_posted_ = false;
};

void connection::mark_gone() {
  if (auto r = current_.lock())
    if (!r->finished() || state_ == state::streaming)
      r->mark_gone();
}

void connection::dispatch() {
  disarm();
  state_ = state::handling;
  auto r = std::make_shared<stream_responder>(shared_from_this(),
                                              srv_->lims.stream_buffer);
  current_ = r;
  if (parser_)
    req_->body = std::move(parser_->get().body());
  auto req = std::move(req_);
  req_.reset();
  parser_.reset();
  srv_->dispatch(std::move(req), std::move(r));
  // Not answered at once: watch for the client going away meanwhile.
  if (!closed_ && state_ == state::handling)
    watch();
}

void connection::flush() {
  if (out_.empty() || closed_)
    return;
  wbuf_.clear();
  wbuf_accounted_ = 0;
  while (!out_.empty()) {
    wbuf_ += out_.front();
    wbuf_accounted_ += out_accounted_.front();
    out_.pop_front();
    out_accounted_.pop_front();
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(wbuf_),
                    [self = shared_from_this()](const error_code& ec, size_t) {
                      self->on_written(ec);
                    });
}

void connection::on_written(const error_code& ec) {
  writing_ = false;
  if (closed_)
    return;
  if (ec)
    return close();
  if (wbuf_accounted_ > 0)
    if (auto r = current_.lock())
      r->written(wbuf_accounted_);
  if (!out_.empty())
    return flush();
  if (state_ != state::writing)
    return; // more of a stream, or an interim 100 Continue
  if (!keep_alive_) {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    // Read and drop what the client still sends (an unread body) until it
    // closes: closing with unread data would reset the connection and
    // could destroy the reply before the client read it. Bounded in time.
    arm(std::chrono::milliseconds{2000}, false);
    state_ = state::idle;
    drain();
    return;
  }
  current_.reset();
  wait_for_request(srv_->lims.keepalive_timeout);
}

} // namespace

// Every 100 ms each loop closes its connections whose deadline passed: a
// timeout costs a clock read per phase instead of a timer per phase, and is
// at most 100 ms late. Sweeping ends once the server stopped and drained.
void http_server::impl::sweep(size_t loop) {
  if (!sweepers[loop])
    return;
  auto now = connection::clock::now();
  std::vector<std::shared_ptr<connection>> conns;
  {
    std::lock_guard<std::mutex> guard{registries[loop].mx};
    conns.reserve(registries[loop].conns.size());
    for (auto* c : registries[loop].conns)
      if (auto p = c->weak_from_this().lock())
        conns.push_back(std::move(p));
  }
  for (auto& c : conns)
    c->sweep(now);
  conns.clear();
  if (stopping && open == 0)
    return;
  auto& timer = *sweepers[loop];
  timer.expires_after(sweep_every);
  timer.async_wait([self = shared_from_this(), loop](const error_code& ec) {
    if (!ec)
      self->sweep(loop);
  });
}

size_t http_server::impl::pick_loop() const noexcept {
  size_t fewest = 0;
  for (size_t i = 0; i < registries.size(); ++i) {
    auto n = held[i].load(std::memory_order_relaxed);
    if (n < packed_per_loop)
      return i;
    if (n < held[fewest].load(std::memory_order_relaxed))
      fewest = i;
  }
  return fewest;
}

void http_server::impl::accept() {
  if (!acceptor)
    return;
  auto loop = pick_loop();
  auto& ctx = loops.at(loop);
  acceptor->async_accept(
    ctx, [self = shared_from_this(), loop](const error_code& ec,
                                           tcp::socket sock) {
      if (self->stopping || !self->acceptor || !self->acceptor->is_open())
        return;
      if (ec) {
        // Out of descriptors or a connection reset before it was accepted:
        // keep accepting (after a pause when descriptors ran out).
        if (ec == asio::error::no_descriptors) {
          auto timer = std::make_shared<asio::steady_timer>(
            self->acceptor->get_executor(), std::chrono::milliseconds{50});
          timer->async_wait([self, timer](const error_code&) {
            if (!self->stopping)
              self->accept();
          });
          return;
        }
        self->accept();
        return;
      }
      auto n = self->open.fetch_add(1) + 1;
      self->held[loop].fetch_add(1, std::memory_order_relaxed);
      ++self->accepted;
      auto conn = std::make_shared<connection>(self, std::move(sock), loop);
      bool over = n > self->lims.max_connections;
      if (over)
        ++self->refused;
      asio::post(conn->executor(), [conn, over] {
        if (over) {
          conn->refuse_over_cap();
          return;
        }
        conn->start();
      });
      self->accept();
    });
}

http_server::http_server(net::io_pool& loops, limits lim, dispatch_fn dispatch,
                         refusal_fn refuse)
  : impl_(std::make_shared<impl>(loops, lim, std::move(dispatch),
                                 std::move(refuse))) {
}

http_server::~http_server() {
  stop();
  // The acceptor and the sweep timers belong to the loops: they go now, on
  // their loops (or here, when a loop no longer runs), never later from a
  // handler released while a loop's context is being destroyed.
  for (size_t i = 0; i < impl_->loops.size(); ++i) {
    auto& ctx = impl_->loops.at(i);
    auto drop = [self = impl_, i] {
      if (i == 0)
        self->acceptor.reset();
      if (i < self->sweepers.size())
        self->sweepers[i].reset();
    };
    if (ctx.stopped()) {
      drop();
      continue;
    }
    auto done = std::make_shared<std::promise<void>>();
    auto dropped = done->get_future();
    asio::post(ctx, [drop, done] {
      drop();
      done->set_value();
    });
    dropped.wait_for(std::chrono::seconds{5});
  }
}

caf::expected<int> http_server::listen(const std::string& address, int port) {
  error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  auto fail = [&](const std::string& why) {
    return make_error(errc::io_failure, "cannot listen on " + address + ":"
                                          + std::to_string(port) + " (" + why
                                          + ")");
  };
  if (ec)
    return fail("not an IP address");
  auto acc = std::make_unique<tcp::acceptor>(impl_->loops.at(0));
  tcp::endpoint ep{addr, static_cast<unsigned short>(port)};
  acc->open(ep.protocol(), ec);
  if (!ec)
    acc->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec)
    acc->bind(ep, ec);
  if (ec)
    return fail(ec == asio::error::address_in_use
                  ? "address in use"
                  : "address not available: " + ec.message());
  acc->listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return fail(ec.message());
  auto bound = acc->local_endpoint(ec).port();
  impl_->acceptor = std::move(acc);
  // Every timer exists before any loop sweeps: a loop reads the vector,
  // which must not grow under it.
  for (size_t i = 0; i < impl_->loops.size(); ++i)
    impl_->sweepers.push_back(
      std::make_unique<asio::steady_timer>(impl_->loops.at(i)));
  for (size_t i = 0; i < impl_->loops.size(); ++i)
    asio::post(impl_->loops.at(i), [self = impl_, i] { self->sweep(i); });
  asio::post(impl_->loops.at(0), [self = impl_] { self->accept(); });
  return static_cast<int>(bound);
}

void http_server::stop() {
  if (impl_->stopping.exchange(true))
    return;
  for (size_t i = 0; i < impl_->loops.size(); ++i)
    asio::post(impl_->loops.at(i), [self = impl_, i] {
      if (i == 0 && self->acceptor) {
        error_code ec;
        self->acceptor->close(ec);
      }
      // Connections still open hold a reference that keeps them alive
      // while this runs on their loop; on_stop may close (and delist) one.
      std::vector<std::shared_ptr<connection>> conns;
      {
        std::lock_guard<std::mutex> guard{self->registries[i].mx};
        for (auto* c : self->registries[i].conns)
          if (auto p = c->weak_from_this().lock())
            conns.push_back(std::move(p));
      }
      for (auto& c : conns)
        c->on_stop();
      std::lock_guard<std::mutex> guard{self->drain_mx};
      self->drained.notify_all();
    });
}

bool http_server::stopping() const noexcept {
  return impl_->stopping;
}

bool http_server::wait_drained(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock{impl_->drain_mx};
  return impl_->drained.wait_until(lock, deadline, [this] {
    return impl_->stopping && impl_->open == 0;
  });
}

connection_stats http_server::stats() const {
  connection_stats s{impl_->open,      impl_->accepted, impl_->refused,
                     impl_->timed_out, impl_->cut_off,  impl_->paused,
                     impl_->pauses,    {}};
  s.open_per_loop.reserve(impl_->registries.size());
  for (size_t i = 0; i < impl_->registries.size(); ++i)
    s.open_per_loop.push_back(impl_->held[i].load(std::memory_order_relaxed));
  return s;
}

} // namespace spindle::http
