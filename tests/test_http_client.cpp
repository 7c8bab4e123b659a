// net::blocking_http_client (spindle stress's client): answers over one
// keep-alive connection, a connection the server closed is replaced before
// the next request (never a request sent twice), a server that does not
// answer is given up at the deadline, and bad URLs are refused.

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <httplib.h>

#include "net/http_client.hpp"

using spindle::net::blocking_http_client;
using namespace std::chrono_literals;

namespace {

class echo_server {
public:
  echo_server() {
    svr_.Post("/echo", [this](const httplib::Request& req,
                              httplib::Response& res) {
      ++posts_;
      peers_mx_.lock();
      peers_.insert(req.remote_port);
      peers_mx_.unlock();
      res.set_content(req.method + " " + req.body + " "
                        + req.get_header_value("Authorization"),
                      "text/plain");
    });
    svr_.Get("/close", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Connection", "close");
      res.set_content("bye", "text/plain");
    });
    svr_.Get("/slow", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(1500ms);
      res.set_content("late", "text/plain");
    });
    svr_.Get("/missing", [](const httplib::Request&, httplib::Response& res) {
      res.status = 404;
      res.set_content("{\"error\":\"no\"}", "application/json");
    });
    svr_.set_keep_alive_timeout(1); // seconds: closes idle connections
    svr_.set_keep_alive_max_count(1000);
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread{[this] { svr_.listen_after_bind(); }};
    while (!svr_.is_running())
      std::this_thread::sleep_for(1ms);
  }
  ~echo_server() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }
  int posts() const {
    return posts_;
  }
  size_t connections() {
    std::lock_guard<std::mutex> guard{peers_mx_};
    return peers_.size();
  }

private:
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> posts_{0};
  std::mutex peers_mx_;
  std::set<int> peers_;
};

} // namespace

TEST_CASE("http client: requests share one keep-alive connection and carry "
          "their headers and bodies") {
  echo_server srv;
  blocking_http_client cli{srv.url(), 5000ms};
  for (int i = 0; i < 20; ++i) {
    auto r = cli.request("POST", "/echo", "body-" + std::to_string(i),
                         {{"Authorization", "Bearer t"}});
    REQUIRE(r.error.empty());
    CHECK(r.status == 200);
    CHECK(r.body == "POST body-" + std::to_string(i) + " Bearer t");
  }
  CHECK(srv.posts() == 20);
  CHECK(srv.connections() == 1);
  auto missing = cli.request("GET", "/missing");
  CHECK(missing.status == 404);
  CHECK(missing.body == "{\"error\":\"no\"}");
}

TEST_CASE("http client: a connection the server closed is replaced before "
          "the next request, which is sent once") {
  echo_server srv;
  blocking_http_client cli{srv.url(), 5000ms};
  // Told to close: the next request opens a new connection.
  CHECK(cli.request("GET", "/close").body == "bye");
  auto a = cli.request("POST", "/echo", "a");
  REQUIRE(a.error.empty());
  CHECK(a.body == "POST a ");
  // Closed by the server's keep-alive timeout while idle.
  std::this_thread::sleep_for(2500ms);
  auto b = cli.request("POST", "/echo", "b");
  REQUIRE(b.error.empty());
  CHECK(b.body == "POST b ");
  CHECK(srv.posts() == 2);
  CHECK(srv.connections() == 2);
}

TEST_CASE("http client: no answer within the deadline is an error, and the "
          "client goes on") {
  echo_server srv;
  blocking_http_client cli{srv.url(), 300ms};
  auto t0 = std::chrono::steady_clock::now();
  auto r = cli.request("GET", "/slow");
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(r.status == 0);
  CHECK(r.error.find("no answer") != std::string::npos);
  CHECK(took < 1400ms);
  auto next = cli.request("POST", "/echo", "after");
  REQUIRE(next.error.empty());
  CHECK(next.body == "POST after ");
}

TEST_CASE("http client: nothing listening is an error naming the address") {
  // A port just bound and released: nothing listens on it.
  int port = 0;
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  blocking_http_client cli{"http://127.0.0.1:" + std::to_string(port), 2000ms};
  auto r = cli.request("GET", "/");
  INFO(r.error);
  CHECK(r.status == 0);
  CHECK(r.error.find("connect to 127.0.0.1:" + std::to_string(port))
        != std::string::npos);
}

TEST_CASE("http client: bad URLs are refused with the reason") {
  auto why = [](const std::string& url) {
    try {
      blocking_http_client cli{url, 1000ms};
    } catch (const std::invalid_argument& e) {
      return std::string{e.what()};
    }
    return std::string{};
  };
  CHECK(why("ftp://x").find("http:// or https://") != std::string::npos);
  CHECK(why("http://").find("no host") != std::string::npos);
  CHECK(why("http://h:0").find("bad port") != std::string::npos);
  CHECK(why("http://h:70000").find("bad port") != std::string::npos);
  CHECK(why("http://[::1").find("malformed") != std::string::npos);
  CHECK(why("http://127.0.0.1:8080/v1").empty());
  CHECK(why("https://[::1]:8443").empty());
}
