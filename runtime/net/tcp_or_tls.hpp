#pragma once

#include <optional>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>

// A TCP connection that carries TLS or not, as decided at run time (an
// http:// or https:// upstream, a server with or without a certificate),
// so that one chain of handlers serves both.

namespace spindle::net {

/// A TCP socket and, once `start_tls` ran, a TLS stream over it. Reads and
/// writes go through `visit`, which hands over whichever carries the
/// bytes. Not thread-safe: it belongs to one loop's thread.
class tcp_or_tls {
public:
  using socket_type = boost::asio::ip::tcp::socket;
  using tls_type = boost::asio::ssl::stream<socket_type&>;

  /// An unconnected socket on `loop`.
  explicit tcp_or_tls(boost::asio::io_context& loop) : socket_(loop) {
  }

  /// An accepted socket.
  explicit tcp_or_tls(socket_type socket) : socket_(std::move(socket)) {
  }

  tcp_or_tls(const tcp_or_tls&) = delete;
  tcp_or_tls& operator=(const tcp_or_tls&) = delete;

  socket_type& socket() noexcept {
    return socket_;
  }

  /// Puts TLS over the connected socket, before the handshake; `context`
  /// must outlive the connection.
  tls_type& start_tls(boost::asio::ssl::context& context) {
    return tls_.emplace(socket_, context);
  }

  /// The TLS stream, or null before `start_tls`.
  tls_type* tls() noexcept {
    return tls_ ? &*tls_ : nullptr;
  }

  /// Calls `f` with the TLS stream when there is one, else the socket.
  template <class F>
  void visit(F&& f) {
    if (tls_)
      f(*tls_);
    else
      f(socket_);
  }

  /// Closes the socket; pending operations end with operation_aborted.
  void close() noexcept {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

private:
  socket_type socket_;
  std::optional<tls_type> tls_; // after socket_: destroyed first
};

} // namespace spindle::net
