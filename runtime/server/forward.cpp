#include "forward.hpp"

#include <array>
#include <limits>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "router.hpp"
#include "net/url.hpp"

namespace spindle::http {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bh = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// Fields that belong to one hop (RFC 9110, 7.6.1) or that Beast sets for
// the body it sends: never passed on.
bool hop_by_hop(std::string_view name) {
  static constexpr std::array<std::string_view, 10> fields{
    "connection", "keep-alive", "proxy-connection", "transfer-encoding",
    "te", "trailer", "upgrade", "content-length", "host",
    "proxy-authorization"};
  for (auto f : fields)
    if (name.size() == f.size()
        && std::equal(name.begin(), name.end(), f.begin(), [](char a, char b) {
             return std::tolower(static_cast<unsigned char>(a)) == b;
           }))
      return true;
  return false;
}

class forward_call : public std::enable_shared_from_this<forward_call> {
public:
  forward_call(asio::io_context& loop, net::http_origin origin,
               std::string owner, std::shared_ptr<request> req,
               responder_ptr res, forward_options options,
               std::function<void(int)> done)
    : origin_(std::move(origin)), owner_(std::move(owner)),
      req_(std::move(req)), res_(std::move(res)), options_(options),
      done_(std::move(done)), resolver_(loop), socket_(loop), timer_(loop) {
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser_.header_limit(64 * 1024);
  }

  void begin(const std::string& from) {
    out_.method_string(req_->method);
    out_.target(req_->target);
    out_.version(11);
    for (auto& [name, value] : req_->headers)
      if (!hop_by_hop(name) && !beast::iequals(name, forwarded_header))
        out_.insert(name, value);
    out_.set(bh::field::host, origin_.authority);
    out_.set(forwarded_header, from);
    out_.set(bh::field::connection, "close");
    out_.body() = req_->body;
    out_.prepare_payload();
    // The client went away: so does the connection to the owner, which
    // then sees its client gone (an exchange stops its reply).
    res_->on_gone([weak = weak_from_this(), ex = timer_.get_executor()] {
      asio::post(ex, [weak] {
        if (auto self = weak.lock())
          self->close();
      });
    });
    arm(options_.connect_timeout);
    resolver_.async_resolve(
      origin_.host, origin_.port,
      [self = shared_from_this()](const error_code& ec,
                                  const tcp::resolver::results_type& found) {
        if (self->finished_)
          return;
        if (ec) {
          self->unreachable(ec.message());
          return;
        }
        asio::async_connect(self->socket_, found,
                            [self](const error_code& ec2, const tcp::endpoint&) {
                              self->on_connected(ec2);
                            });
      });
  }

private:
  void arm(std::chrono::milliseconds after) {
    timer_.expires_after(after);
    timer_.async_wait([weak = weak_from_this()](const error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->finished_)
        return;
      if (!self->sent_)
        self->unreachable("no connection within "
                          + std::to_string(
                            self->options_.connect_timeout.count())
                          + " ms");
      else
        self->broke_off("it was silent for "
                        + std::to_string(self->options_.idle_timeout.count())
                        + " ms");
    });
  }

  void on_connected(const error_code& ec) {
    if (finished_)
      return;
    if (ec) {
      unreachable(ec.message());
      return;
    }
    error_code ignored;
    socket_.set_option(tcp::no_delay{true}, ignored);
    sent_ = true;
    arm(options_.idle_timeout);
    bh::async_write(socket_, out_,
                    [self = shared_from_this()](const error_code& ec2,
                                                size_t) {
                      if (self->finished_)
                        return;
                      if (ec2) {
                        self->broke_off("sending failed: " + ec2.message());
                        return;
                      }
                      self->read();
                    });
  }

  void read() {
    auto& body = parser_.get().body();
    body.data = chunk_.data();
    body.size = chunk_.size();
    bh::async_read_some(socket_, buffer_, parser_,
                        [self = shared_from_this()](error_code ec, size_t) {
                          self->on_read(ec);
                        });
  }

  void on_read(error_code ec) {
    if (finished_)
      return;
    arm(options_.idle_timeout);
    if (ec == bh::error::need_buffer)
      ec = {};
    if (!header_ && parser_.is_header_done())
      on_header();
    auto got = chunk_.size() - parser_.get().body().size;
    if (got > 0) {
      if (streaming_) {
        if (!res_->write(std::string(chunk_.data(), got))) {
          finish(status_, false); // the client is gone or cut off
          return;
        }
      } else {
        whole_.append(chunk_.data(), got);
      }
    }
    if (ec) {
      broke_off(ec.message());
      return;
    }
    if (parser_.is_done()) {
      if (streaming_)
        res_->end_stream();
      else {
        reply_.body = std::move(whole_);
        res_->send(std::move(reply_));
      }
      finish(status_, false);
      return;
    }
    read();
  }

  // The owner's status and fields: a chunked answer is streamed on at
  // once; any other is gathered whole.
  void on_header() {
    header_ = true;
    auto& head = parser_.get();
    status_ = static_cast<int>(head.result_int());
    std::vector<std::pair<std::string, std::string>> fields;
    std::string content_type;
    for (auto& f : head) {
      auto name = std::string{f.name_string()};
      if (hop_by_hop(name))
        continue;
      if (beast::iequals(name, "content-type"))
        content_type = std::string{f.value()};
      else
        fields.emplace_back(std::move(name), std::string{f.value()});
    }
    if (parser_.chunked()) {
      streaming_ = true;
      res_->begin_stream(status_, std::move(content_type), std::move(fields));
      return;
    }
    reply_.status = status_;
    reply_.content_type = std::move(content_type);
    reply_.headers = std::move(fields);
  }

  void unreachable(const std::string& why) {
    fail(api_error{503, "not_owner",
                   "the thread's owner, node '" + owner_ + "' at "
                     + origin_.authority + ", cannot be reached (" + why
                     + "); nothing was done: send the request again (a node "
                       "that stopped has its threads taken over within its "
                       "lease)"});
  }

  void broke_off(const std::string& why) {
    if (streaming_) {
      res_->end_stream();
      finish(status_, false);
      return;
    }
    fail(api_error{503, "unavailable",
                   "the thread's owner, node '" + owner_ + "', broke off "
                     + "before it answered (" + why
                     + "); whether it did what was asked is unknown"});
  }

  void fail(const api_error& e) {
    if (finished_)
      return;
    res_->send(error_response(e));
    finish(e.status, true);
  }

  void finish(int status, bool) {
    if (finished_)
      return;
    finished_ = true;
    close();
    if (done_)
      done_(status);
  }

  void close() {
    error_code ignored;
    timer_.cancel();
    resolver_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  net::http_origin origin_;
  std::string owner_;
  std::shared_ptr<request> req_;
  responder_ptr res_;
  forward_options options_;
  std::function<void(int)> done_;
  tcp::resolver resolver_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  bh::request<bh::string_body> out_;
  beast::flat_buffer buffer_;
  bh::response_parser<bh::buffer_body> parser_;
  std::array<char, 16 * 1024> chunk_;
  response reply_;
  std::string whole_;
  int status_ = 0;
  bool sent_ = false;
  bool header_ = false;
  bool streaming_ = false;
  bool finished_ = false;
};

} // namespace

void forward(boost::asio::io_context& loop, const std::string& url,
             const std::string& owner, const std::string& from,
             std::shared_ptr<request> req, responder_ptr res,
             forward_options options, std::function<void(int)> done) {
  net::http_origin origin;
  std::string problem;
  if (!net::parse_http_url(url, origin, problem) || origin.tls) {
    res->send(error_response(
      api_error{503, "not_owner",
                "the thread's owner, node '" + owner
                  + "', advertises an address this node cannot use ('" + url
                  + "'); send the request to that node"}));
    if (done)
      done(503);
    return;
  }
  auto call = std::make_shared<forward_call>(loop, std::move(origin), owner,
                                             std::move(req), std::move(res),
                                             options, std::move(done));
  asio::post(loop, [call, from] { call->begin(from); });
}

} // namespace spindle::http
