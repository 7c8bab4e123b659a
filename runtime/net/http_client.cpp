#include "net/http_client.hpp"

#include <poll.h>

#include <optional>
#include <stdexcept>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "net/tcp_or_tls.hpp"
#include "net/url.hpp"
#include "spindle/version.hpp"

// Every operation is asynchronous on the client's own io_context, run until
// it ends or the request's deadline passes (then the socket is closed and
// the operation ends with operation_aborted): Asio's blocking calls have no
// timeouts.

namespace spindle::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

struct blocking_http_client::impl {
  std::string host;
  std::string port;
  std::string authority;
  std::chrono::milliseconds timeout;
  asio::io_context ctx{1};
  std::unique_ptr<ssl::context> tls;
  std::optional<tcp_or_tls> conn;
  beast::flat_buffer buffer;
  bool timed_out = false;

  // Set by an operation's last handler.
  bool has_pending = false;

  // Runs the context until the started operation ends or `deadline`
  // passes; past it the connection is closed, which ends the operation
  // with operation_aborted.
  void run_until(std::chrono::steady_clock::time_point deadline) {
    ctx.restart();
    asio::steady_timer timer{ctx, deadline};
    timer.async_wait([this](const error_code& ec) {
      if (!ec) {
        timed_out = true;
        if (conn)
          conn->close();
      }
    });
    while (has_pending && ctx.run_one() > 0) {
    }
    timer.cancel();
    ctx.poll(); // the timer's cancelled handler
  }

  // Whether the open connection can take a request: not closed by the
  // server (readable with nothing buffered means it sent FIN or an
  // unasked answer; either way the connection is done).
  bool reusable() {
    if (!conn || !conn->socket().is_open())
      return false;
    pollfd p{conn->socket().native_handle(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 0;
  }

  std::string connect(std::chrono::steady_clock::time_point deadline) {
    conn.reset();
    buffer.clear();
    tcp::resolver resolver{ctx};
    error_code ec;
    auto endpoints = resolver.resolve(host, port, ec);
    if (ec)
      return "resolve " + host + ": " + ec.message();
    conn.emplace(ctx);
    has_pending = true;
    asio::async_connect(conn->socket(), endpoints,
                        [&](const error_code& e, const tcp::endpoint&) {
                          ec = e;
                          has_pending = false;
                        });
    run_until(deadline);
    if (timed_out)
      return "connect to " + authority + ": timed out";
    if (ec)
      return "connect to " + authority + ": " + ec.message();
    conn->socket().set_option(tcp::no_delay{true}, ec);
    if (!tls)
      return {};
    auto& stream = conn->start_tls(*tls);
    auto* handle = stream.native_handle();
    asio::ip::make_address(host, ec);
    if (!ec) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(handle), host.c_str());
    } else {
      SSL_ctrl(handle, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(host.c_str()));
      SSL_set1_host(handle, host.c_str());
    }
    has_pending = true;
    stream.async_handshake(ssl::stream_base::client, [&](const error_code& e) {
      ec = e;
      has_pending = false;
    });
    run_until(deadline);
    if (timed_out)
      return "TLS handshake with " + authority + ": timed out";
    if (ec)
      return "TLS handshake with " + authority + ": " + ec.message();
    return {};
  }
};

blocking_http_client::blocking_http_client(const std::string& url,
                                           std::chrono::milliseconds timeout)
  : impl_(std::make_unique<impl>()) {
  http_origin origin;
  std::string why;
  if (!parse_http_url(url, origin, why))
    throw std::invalid_argument("the URL " + why);
  impl_->host = origin.host;
  impl_->port = origin.port;
  impl_->authority = origin.authority;
  impl_->timeout = timeout;
  if (origin.tls) {
    impl_->tls = std::make_unique<ssl::context>(ssl::context::tls_client);
    error_code ignored;
    impl_->tls->set_default_verify_paths(ignored);
    impl_->tls->set_verify_mode(ssl::verify_peer);
  }
}

blocking_http_client::~blocking_http_client() = default;

blocking_http_client::response blocking_http_client::request(
  const std::string& method, const std::string& target,
  const std::string& body,
  const std::vector<std::pair<std::string, std::string>>& headers) {
  auto& d = *impl_;
  response out;
  d.timed_out = false;
  auto deadline = std::chrono::steady_clock::now() + d.timeout;
  if (!d.reusable()) {
    if (auto why = d.connect(deadline); !why.empty()) {
      d.conn.reset();
      out.error = why;
      return out;
    }
  }
  http::request<http::string_body> req{http::string_to_verb(method), target,
                                       11};
  req.set(http::field::host, d.authority);
  req.set(http::field::user_agent, std::string{"spindle/"} + version_string);
  for (auto& [name, value] : headers)
    req.set(name, value);
  if (!body.empty() || method == "POST" || method == "PUT") {
    if (req.find(http::field::content_type) == req.end())
      req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  error_code ec;
  d.has_pending = true;
  d.conn->visit([&](auto& stream) {
    http::async_write(stream, req, [&](const error_code& e, size_t) {
      if (e) {
        ec = e;
        d.has_pending = false;
        return;
      }
      http::async_read(stream, d.buffer, parser,
                       [&](const error_code& e2, size_t) {
                         ec = e2;
                         d.has_pending = false;
                       });
    });
  });
  d.run_until(deadline);
  if (d.timed_out || ec) {
    out.error = d.timed_out ? "no answer from " + d.authority + " within "
                                + std::to_string(d.timeout.count()) + " ms"
                            : d.authority + ": " + ec.message();
    d.conn.reset();
    return out;
  }
  auto& res = parser.get();
  out.status = static_cast<int>(res.result_int());
  out.body = std::move(res.body());
  if (!res.keep_alive())
    d.conn.reset();
  return out;
}

} // namespace spindle::net
