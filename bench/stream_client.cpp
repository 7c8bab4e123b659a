// spindle_stream_client: the clients of bench/bench_streams.py, on one Asio
// loop. Opens --count streams at once and prints one JSON record per
// stream (as the script's Python workers do): the seconds from sending the
// request to the first `thread` event, the first `delta` event and `done`
// (spindle), or to the first piece of content and `[DONE]` (the upstream
// alone), the seconds from the upstream's first byte to the first piece's
// arrival (the stamp spindle_fake_upstream --stamp writes), and any error.
//
//   spindle_stream_client --mode spindle|upstream --port P --first I
//                         --count N [--tag T]
//
// The events are found by scanning the bytes as they arrive (a marker split
// between two reads is found all the same); chunk framing never contains
// them. A client written in C++ leaves the cores to the servers it measures:
// asyncio clients took as much CPU as spindle itself during a burst.

#include <sys/resource.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using clk = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

struct record {
  bool ok = false;
  int status = 0;
  std::optional<double> thread, delta, done;
  // Seconds from the upstream's first byte (the @@t=NS@@ stamp
  // spindle_fake_upstream --stamp puts in its first piece) to its arrival.
  std::optional<double> after_first_byte;
  std::string error;
};

class stream : public std::enable_shared_from_this<stream> {
public:
  stream(asio::io_context& ctx, tcp::endpoint to, std::string request,
         bool spindle, record& out)
    : socket_(ctx), timer_(ctx), to_(to), request_(std::move(request)), spindle_(spindle),
      out_(out) {
  }

  // Connects after `delay` (the client's ramp).
  void start_after(std::chrono::steady_clock::duration delay) {
    if (delay <= std::chrono::steady_clock::duration::zero())
      return start();
    timer_.expires_after(delay);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec)
        self->start();
    });
  }

  void start() {
    socket_.async_connect(to_, [self = shared_from_this()](error_code ec) {
      if (ec)
        return self->fail("connect: " + ec.message());
      self->t0_ = clk::now();
      asio::async_write(self->socket_, asio::buffer(self->request_),
                        [self](error_code ec2, size_t) {
                          if (ec2)
                            return self->fail("send: " + ec2.message());
                          self->read();
                        });
    });
  }

private:
  void read() {
    socket_.async_read_some(
      asio::buffer(buf_), [self = shared_from_this()](error_code ec, size_t n) {
        if (n > 0)
          self->scan(n);
        if (ec) {
          if (ec != asio::error::eof && self->out_.error.empty()
              && !self->out_.done)
            self->out_.error = ec.message();
          self->out_.ok = self->out_.done && self->out_.error.empty()
                          && self->out_.status == 200;
          error_code ignored;
          self->socket_.close(ignored);
          return;
        }
        self->read();
      });
  }

  double now() const {
    return std::chrono::duration<double>(clk::now() - t0_).count();
  }

  // Looks for the markers in what arrived, with the tail of the bytes
  // before it in front.
  void scan(size_t n) {
    text_.append(buf_.data(), n);
    if (!headers_done_) {
      auto end = text_.find("\r\n\r\n");
      if (end == std::string::npos)
        return;
      headers_done_ = true;
      if (text_.size() > 12)
        out_.status = std::atoi(text_.c_str() + 9);
      text_.erase(0, end + 4);
    }
    auto t = now();
    if (!out_.after_first_byte)
      if (auto at = text_.find("@@t="); at != std::string::npos) {
        auto end = text_.find("@@", at + 4);
        if (end != std::string::npos) {
          auto stamp = std::strtoll(text_.c_str() + at + 4, nullptr, 10);
          auto here = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        clk::now().time_since_epoch())
                        .count();
          out_.after_first_byte = static_cast<double>(here - stamp) / 1e9;
        }
      }
    if (spindle_) {
      if (!out_.thread && text_.find("event: thread") != std::string::npos)
        out_.thread = t;
      if (!out_.delta && text_.find("event: delta") != std::string::npos)
        out_.delta = t;
      if (!out_.done && text_.find("event: done") != std::string::npos)
        out_.done = t;
      if (out_.error.empty())
        if (auto at = text_.find("event: error"); at != std::string::npos)
          out_.error = text_.substr(at, 200);
    } else {
      if (!out_.delta) {
        for (size_t at = text_.find("\"content\":\""); at != std::string::npos;
             at = text_.find("\"content\":\"", at + 1))
          if (at + 11 < text_.size() && text_[at + 11] != '"') {
            out_.delta = t;
            break;
          }
      }
      if (!out_.done && text_.find("[DONE]") != std::string::npos)
        out_.done = t;
    }
    // Keep a tail long enough for a marker split between two reads.
    if (text_.size() > 32)
      text_.erase(0, text_.size() - 32);
  }

  void fail(std::string why) {
    out_.error = std::move(why);
    error_code ignored;
    socket_.close(ignored);
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  tcp::endpoint to_;
  std::string request_;
  bool spindle_;
  record& out_;
  clk::time_point t0_;
  std::array<char, 8192> buf_{};
  std::string text_;
  bool headers_done_ = false;
};

std::string post(const std::string& target, const std::string& body) {
  return "POST " + target
         + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Accept: text/event-stream\r\nConnection: close\r\n"
           "Content-Length: "
         + std::to_string(body.size()) + "\r\n\r\n" + body;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"The clients of bench/bench_streams.py."};
  std::string mode = "spindle", tag = "x";
  int port = 0;
  size_t first = 0, count = 0;
  app.add_option("--mode", mode, "spindle or upstream")
    ->check(CLI::IsMember({"spindle", "upstream"}));
  app.add_option("--port", port, "server port on 127.0.0.1")->required();
  app.add_option("--first", first, "index of the first stream");
  app.add_option("--count", count, "streams")->required();
  app.add_option("--tag", tag, "thread ID tag");
  double ramp = 0;
  app.add_option("--ramp", ramp,
                 "seconds over which the streams start, evenly spaced "
                 "(0: all at once)");
  CLI11_PARSE(app, argc, argv);
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  asio::io_context ctx{1};
  tcp::endpoint to{asio::ip::make_address("127.0.0.1"),
                   static_cast<unsigned short>(port)};
  std::vector<record> records(count);
  for (size_t k = 0; k < count; ++k) {
    auto i = first + k;
    auto content = "stream " + std::to_string(i) + ": tell me about the number "
                   + std::to_string(i * 7919 % 1000);
    std::string request;
    if (mode == "spindle")
      request = post("/v1/threads/stream-" + tag + "-" + std::to_string(i)
                       + "/messages/stream",
                     json{{"content", content}}.dump());
    else
      request = post("/v1/chat/completions",
                     json{{"model", "fake"},
                          {"stream", true},
                          {"messages",
                           {{{"role", "user"}, {"content", content}}}}}
                       .dump());
    std::make_shared<stream>(ctx, to, std::move(request), mode == "spindle",
                             records[k])
      ->start_after(std::chrono::duration_cast<clk::duration>(
        std::chrono::duration<double>(ramp * static_cast<double>(k)
                                      / static_cast<double>(count))));
  }
  ctx.run();
  json out = json::array();
  for (auto& r : records) {
    json j{{"ok", r.ok}};
    if (r.status != 0)
      j["status"] = r.status;
    if (r.thread)
      j["thread"] = *r.thread;
    if (r.delta)
      j["delta"] = *r.delta;
    if (r.done)
      j["done"] = *r.done;
    if (r.after_first_byte)
      j["after_first_byte"] = *r.after_first_byte;
    if (!r.error.empty())
      j["error"] = r.error;
    out.push_back(std::move(j));
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
