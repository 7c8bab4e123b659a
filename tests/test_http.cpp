// The event-loop HTTP layer under load and abuse, against the real binary:
// idle and trickling connections, limits, the connection cap, slow readers,
// thousands of concurrent streams, and SIGTERM in the middle of them.

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;
using spindle::test::connect_to;
using spindle::test::fd_guard;
using spindle::test::raise_fd_limit;
using spindle::test::send_all;
using namespace std::chrono;

namespace {

// Reads until the peer closes or `timeout` passes.
std::string read_until_close(int fd, milliseconds timeout) {
  std::string out;
  auto deadline = steady_clock::now() + timeout;
  char buf[16384];
  while (steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) <= 0)
      continue;
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// The server still answers a new client.
void check_healthy(int port) {
  httplib::Client cli{"127.0.0.1", port};
  auto r = cli.Get("/healthz");
  REQUIRE(r);
  CHECK(r->status == 200);
}

// The status of a raw HTTP reply ("HTTP/1.1 431 ..."), or 0.
int status_of(const std::string& reply) {
  if (reply.compare(0, 9, "HTTP/1.1 ") != 0 || reply.size() < 12)
    return 0;
  return std::stoi(reply.substr(9, 3));
}

std::string stream_request(const std::string& thread,
                           const std::string& content) {
  auto body = json{{"content", content}}.dump();
  return "POST /v1/threads/" + thread
         + "/messages/stream HTTP/1.1\r\nHost: x\r\nContent-Type: "
           "application/json\r\nConnection: close\r\nContent-Length: "
         + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Many SSE streams at once on one thread: each connection sends its request
// and reads until the server closes it.
struct stream_set {
  struct one {
    int fd = -1;
    std::string reply;
    bool closed = false;
  };
  std::vector<one> streams;

  ~stream_set() {
    for (auto& s : streams)
      if (s.fd >= 0)
        ::close(s.fd);
  }

  // Opens and sends; false if a connection or send failed.
  bool start(int port, const std::vector<std::string>& requests) {
    streams.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      streams[i].fd = connect_to(port);
      if (streams[i].fd < 0 || !send_all(streams[i].fd, requests[i]))
        return false;
    }
    return true;
  }

  // Reads every stream until all are closed or `timeout`; returns how many
  // are still open.
  size_t finish(milliseconds timeout) {
    read_until([](const one& s) { return s.closed; }, timeout);
    return static_cast<size_t>(
      std::count_if(streams.begin(), streams.end(),
                    [](const one& s) { return !s.closed; }));
  }

  // Reads every stream until each has received `marker` (or closed) or
  // `timeout`; returns how many have not received it.
  size_t until_each_has(const std::string& marker, milliseconds timeout) {
    auto has = [&](const one& s) {
      return s.reply.find(marker) != std::string::npos;
    };
    read_until([&](const one& s) { return s.closed || has(s); }, timeout);
    return static_cast<size_t>(
      std::count_if(streams.begin(), streams.end(),
                    [&](const one& s) { return !has(s); }));
  }

private:
  // Reads the streams not yet `done` until all are or `timeout`.
  template <class Done>
  void read_until(Done done, milliseconds timeout) {
    auto deadline = steady_clock::now() + timeout;
    char buf[16384];
    while (steady_clock::now() < deadline) {
      std::vector<pollfd> polls;
      std::vector<size_t> index;
      for (size_t i = 0; i < streams.size(); ++i)
        if (!streams[i].closed && !done(streams[i])) {
          polls.push_back({streams[i].fd, POLLIN, 0});
          index.push_back(i);
        }
      if (polls.empty())
        return;
      if (poll(polls.data(), polls.size(), 100) <= 0)
        continue;
      for (size_t k = 0; k < polls.size(); ++k) {
        if (!(polls[k].revents & (POLLIN | POLLHUP | POLLERR)))
          continue;
        auto& s = streams[index[k]];
        auto n = ::recv(s.fd, buf, sizeof buf, 0);
        if (n <= 0) {
          s.closed = true;
          continue;
        }
        s.reply.append(buf, static_cast<size_t>(n));
      }
    }
  }
};

// The events of a chunked SSE reply, in order: (event, data).
std::vector<std::pair<std::string, json>> events_of(const std::string& raw) {
  std::vector<std::pair<std::string, json>> out;
  auto body_at = raw.find("\r\n\r\n");
  if (body_at == std::string::npos)
    return out;
  // De-chunk.
  std::string body;
  size_t pos = body_at + 4;
  while (pos < raw.size()) {
    auto eol = raw.find("\r\n", pos);
    if (eol == std::string::npos)
      break;
    auto size = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (size == 0)
      break;
    body += raw.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  size_t at = 0;
  while (true) {
    auto end = body.find("\n\n", at);
    if (end == std::string::npos)
      break;
    auto block = body.substr(at, end - at);
    at = end + 2;
    auto nl = block.find('\n');
    if (block.compare(0, 7, "event: ") != 0 || nl == std::string::npos)
      continue;
    out.emplace_back(block.substr(7, nl - 7),
                     json::parse(block.substr(nl + 7), nullptr, false));
  }
  return out;
}

} // namespace

TEST_CASE("http: 1,000 idle or half-sent connections do not keep a new "
          "client from being answered within 1 s") {
  raise_fd_limit();
  server_process srv;
  fd_guard idle;
  for (int i = 0; i < 1000; ++i) {
    int fd = connect_to(srv.port());
    REQUIRE(fd >= 0);
    idle.fds.push_back(fd);
    // Half of them send half a request line and then nothing.
    if (i % 2 == 1)
      REQUIRE(send_all(fd, "GET /heal"));
  }
  auto start = steady_clock::now();
  httplib::Client cli{"127.0.0.1", srv.port()};
  cli.set_read_timeout(seconds(5));
  auto r = cli.Get("/healthz");
  auto took = steady_clock::now() - start;
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(took < seconds(1));
  // A message round trip too, not only the health check.
  auto m = cli.Post("/v1/threads/busy-server/messages", R"({"content":"hi"})",
                    "application/json");
  REQUIRE(m);
  CHECK(m->status == 200);
  CHECK(steady_clock::now() - start < seconds(1));
}

TEST_CASE("http: a connection that trickles its headers is closed when "
          "--header-timeout passes, and a silent one too") {
  server_process srv{{"--header-timeout", "0.5"}};
  int trickle = connect_to(srv.port());
  int silent = connect_to(srv.port());
  fd_guard guard{{trickle, silent}};
  REQUIRE(trickle >= 0);
  REQUIRE(silent >= 0);
  auto start = steady_clock::now();
  bool closed = false;
  // One byte every 100 ms: each byte alone is on time, the whole is not.
  std::string line = "GET /healthz HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaa";
  for (char c : line) {
    if (!send_all(trickle, std::string(1, c))) {
      closed = true;
      break;
    }
    pollfd p{trickle, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char b;
      if (::recv(trickle, &b, 1, 0) <= 0) {
        closed = true;
        break;
      }
    }
  }
  CHECK(closed);
  CHECK(steady_clock::now() - start < seconds(2));
  CHECK(read_until_close(silent, seconds(2)).empty());
  // The server still serves.
  check_healthy(srv.port());
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto m = cli.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("spindle_http_connections_timed_out 2") != std::string::npos);
}

TEST_CASE("http: oversized headers get 431, too many header fields 431, a "
          "target over 8 KiB 414, a malformed request line 400, all as JSON") {
  server_process srv;
  auto ask = [&](const std::string& raw) {
    int fd = connect_to(srv.port());
    REQUIRE(fd >= 0);
    fd_guard g{{fd}};
    send_all(fd, raw);
    return read_until_close(fd, seconds(5));
  };
  auto big = ask("GET /healthz HTTP/1.1\r\nX-Big: " + std::string(40000, 'a')
                 + "\r\n\r\n");
  CHECK(status_of(big) == 431);
  CHECK(big.find("\"too_large\"") != std::string::npos);
  std::string many = "GET /healthz HTTP/1.1\r\n";
  for (int i = 0; i < 150; ++i)
    many += "X-H" + std::to_string(i) + ": v\r\n";
  auto too_many = ask(many + "\r\n");
  CHECK(status_of(too_many) == 431);
  CHECK(too_many.find("header fields") != std::string::npos);
  auto long_url = ask("GET /v1/threads/" + std::string(9000, 'a')
                      + "/history HTTP/1.1\r\n\r\n");
  CHECK(status_of(long_url) == 414);
  auto garbage = ask("HELLO\x01 WORLD\r\n\r\n");
  CHECK(status_of(garbage) == 400);
  CHECK(garbage.find("\"malformed\"") != std::string::npos);
  // Nothing of that broke the server.
  check_healthy(srv.port());
}

TEST_CASE("http: past --max-connections a new connection gets 503 and is "
          "closed, and once others close it is served again") {
  server_process srv{{"--max-connections", "8"}};
  fd_guard held;
  for (int i = 0; i < 8; ++i) {
    int fd = connect_to(srv.port());
    REQUIRE(fd >= 0);
    held.fds.push_back(fd);
  }
  // Let the server accept all eight before the ninth.
  std::this_thread::sleep_for(milliseconds(200));
  int extra = connect_to(srv.port());
  REQUIRE(extra >= 0);
  fd_guard g{{extra}};
  send_all(extra, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  auto refused = read_until_close(extra, seconds(5));
  CHECK(status_of(refused) == 503);
  CHECK(refused.find("too many open connections") != std::string::npos);
  // The held ones are served.
  REQUIRE(send_all(held.fds[0],
                   "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"));
  CHECK(status_of(read_until_close(held.fds[0], seconds(5))) == 200);
  for (auto& fd : held.fds) {
    ::close(fd);
    fd = -1;
  }
  std::this_thread::sleep_for(milliseconds(200));
  check_healthy(srv.port());
}

namespace {

// spindle_http_loop_connections of each loop, from /metrics.
std::vector<int> per_loop_connections(httplib::Client& scrape, size_t loops) {
  std::vector<int> out(loops, -1);
  auto m = scrape.Get("/metrics");
  REQUIRE(m);
  for (size_t i = 0; i < loops; ++i) {
    auto key = "spindle_http_loop_connections{loop=\"" + std::to_string(i)
               + "\"} ";
    auto at = m->body.find(key);
    if (at != std::string::npos)
      out[i] = std::stoi(m->body.substr(at + key.size()));
  }
  return out;
}

// Waits until the loops hold `total` connections together; their counts.
std::vector<int> settled_per_loop(httplib::Client& scrape, size_t loops,
                                  int total) {
  auto deadline = steady_clock::now() + seconds(5);
  for (;;) {
    auto counts = per_loop_connections(scrape, loops);
    int sum = 0;
    for (int n : counts)
      sum += n;
    if (sum == total || steady_clock::now() > deadline)
      return counts;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

} // namespace

TEST_CASE("http: a few connections share one event loop and many are spread "
          "evenly over all of them") {
  server_process srv{{"--http-threads", "3"}};
  // The scraping client holds one keep-alive connection: the first.
  httplib::Client scrape{"127.0.0.1", srv.port()};
  scrape.set_keep_alive(true);
  fd_guard held;
  auto open_more = [&](int n) {
    for (int i = 0; i < n; ++i) {
      int fd = connect_to(srv.port());
      REQUIRE(fd >= 0);
      held.fds.push_back(fd);
    }
  };
  using counts = std::vector<int>;
  CHECK(settled_per_loop(scrape, 3, 1) == counts{1, 0, 0});
  // Up to 16 a loop takes them all.
  open_more(9);
  CHECK(settled_per_loop(scrape, 3, 10) == counts{10, 0, 0});
  // Then the next loop fills, then the next.
  open_more(30);
  CHECK(settled_per_loop(scrape, 3, 40) == counts{16, 16, 8});
  // Once every loop holds 16, each new one goes to the loop holding the
  // fewest.
  open_more(20);
  CHECK(settled_per_loop(scrape, 3, 60) == counts{20, 20, 20});
  // Closed connections leave their loops' counts.
  for (size_t i = 0; i < 30; ++i) {
    ::close(held.fds[i]); // the first 9 on loop 0, then loops 0 and 1
    held.fds[i] = -1;
  }
  auto after = settled_per_loop(scrape, 3, 30);
  CHECK(after[0] + after[1] + after[2] == 30);
  CHECK(after[2] == 20);
  // New ones fill the first loop with room.
  open_more(4);
  auto refilled = settled_per_loop(scrape, 3, 34);
  CHECK(refilled[0] == after[0] + 4);
  check_healthy(srv.port());
}

TEST_CASE("http: a client that stops reading mid-stream does not delay the "
          "others") {
  raise_fd_limit();
  server_process srv{{"--llm-delta-delay-ms", "50"}};
  // The stalled client: asks for a stream and never reads it.
  fd_guard stalled;
  for (int i = 0; i < 4; ++i) {
    int fd = connect_to(srv.port());
    REQUIRE(fd >= 0);
    int small = 1024;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    stalled.fds.push_back(fd);
    REQUIRE(send_all(fd, stream_request("stalled-" + std::to_string(i),
                                        std::string(400, 'z'))));
  }
  std::vector<std::string> requests;
  for (int i = 0; i < 200; ++i)
    requests.push_back(stream_request("reader-" + std::to_string(i),
                                      "question " + std::to_string(i)));
  stream_set readers;
  auto start = steady_clock::now();
  REQUIRE(readers.start(srv.port(), requests));
  REQUIRE(readers.finish(seconds(20)) == 0);
  // 4 deltas 50 ms apart: well under a second each, all at once.
  CHECK(steady_clock::now() - start < seconds(5));
  for (auto& s : readers.streams) {
    auto events = events_of(s.reply);
    REQUIRE(!events.empty());
    CHECK(events.front().first == "thread");
    CHECK(events.back().first == "done");
  }
}

// A metric's value in a /metrics page (-1 when it is not there).
double metric(const std::string& page, const std::string& name) {
  auto at = page.find("\n" + name + " ");
  if (at == std::string::npos)
    return -1;
  return std::stod(page.substr(at + name.size() + 2));
}

TEST_CASE("http: a client that reads slowly pauses its reply's generation "
          "instead of being cut off and then gets the whole reply stored "
          "complete while others go on") {
  raise_fd_limit();
  // 900 kB of reply at once (a turn holds at most 1 MiB), past a stream
  // buffer of 64 KiB: a client that falls that far behind is cut off
  // unless the generation waits for it (it pauses at 32 KiB unsent). The
  // kernel's send buffer is kept small, as it is over a real network (on
  // loopback it starts at about 4 MB and would take the whole reply).
  constexpr size_t reply_bytes = 900'000;
  spindle::test::fake_upstream up{
    {"--chunks", "300", "--reply-bytes", std::to_string(reply_bytes)}};
  server_process srv{{"--llm", "openai", "--llm-url", up.url(),
                      "--llm-model", "fake", "--stream-buffer", "65536",
                      "--send-buffer", "16384"}};
  fd_guard guard;
  int slow = connect_to(srv.port(), 1024);
  REQUIRE(slow >= 0);
  guard.fds.push_back(slow);
  REQUIRE(send_all(slow, stream_request("slow-reader", "tell me everything")));
  httplib::Client cli{"127.0.0.1", srv.port()};
  // The generation pauses while the client reads nothing.
  std::string page;
  auto deadline = steady_clock::now() + seconds(30);
  while (steady_clock::now() < deadline) {
    auto m = cli.Get("/metrics");
    REQUIRE(m);
    page = m->body;
    if (metric(page, "spindle_http_streams_paused") == 1)
      break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  INFO(page.substr(0, 2000));
  REQUIRE(metric(page, "spindle_http_streams_paused") == 1);
  // It stays paused, and nothing is cut off.
  std::this_thread::sleep_for(milliseconds(500));
  page = cli.Get("/metrics")->body;
  CHECK(metric(page, "spindle_http_streams_paused") == 1);
  CHECK(metric(page, "spindle_http_streams_cut_off") == 0);
  // Others are served meanwhile, streams included.
  stream_set others;
  REQUIRE(others.start(srv.port(), {stream_request("quick-reader", "hi")}));
  REQUIRE(others.finish(seconds(60)) == 0);
  auto events = events_of(others.streams[0].reply);
  REQUIRE(!events.empty());
  CHECK(events.back().first == "done");
  // The slow client reads: all of the reply comes, then `done`.
  auto reply = read_until_close(slow, seconds(120));
  auto slow_events = events_of(reply);
  REQUIRE(!slow_events.empty());
  CHECK(slow_events.back().first == "done");
  size_t text = 0;
  for (auto& [name, data] : slow_events)
    if (name == "delta")
      text += data["content"].get<std::string>().size();
  CHECK(text == reply_bytes);
  page = cli.Get("/metrics")->body;
  CHECK(metric(page, "spindle_http_streams_paused") == 0);
  CHECK(metric(page, "spindle_http_stream_pauses") >= 1);
  CHECK(metric(page, "spindle_http_streams_cut_off") == 0);
  // Stored whole, not interrupted.
  auto h = cli.Get("/v1/threads/slow-reader/history?max_turns=2");
  REQUIRE(h);
  auto turns = json::parse(h->body)["turns"];
  REQUIRE(turns.size() == 2);
  CHECK(turns[1]["content"].get<std::string>().size() == reply_bytes);
  CHECK(!turns[1].value("interrupted", false));
}

TEST_CASE("http: POST /v1/threads/{id}/cancel stops the upstream at once "
          "and stores the partial reply as interrupted and the stream "
          "ends with a cancelled event and the next message proceeds") {
  raise_fd_limit();
  // A piece every 100 ms for 10 s.
  spindle::test::fake_upstream up{
    {"--stream-seconds", "10", "--chunks", "100", "--reply-bytes", "2000"}};
  server_process srv{{"--llm", "openai", "--llm-url", up.url(),
                      "--llm-model", "fake"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  // Nothing runs yet: nothing to cancel.
  auto idle = cli.Post("/v1/threads/stop-me/cancel", "", "application/json");
  REQUIRE(idle);
  CHECK(idle->status == 409);
  CHECK(json::parse(idle->body)["error"]["code"] == "conflict");
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    stream_set streams;
    REQUIRE(streams.start(srv.port(), {stream_request("stop-me",
                                                      "go on and on")}));
    REQUIRE(streams.until_each_has("event: delta", seconds(30)) == 0);
    // From the second message on, a rewrite went upstream first (and was
    // abandoned at its own timeout): count from here.
    auto aborted_before = up.stats()["aborted"].get<int>();
    auto r = cli.Post("/v1/threads/stop-me/cancel", "", "application/json");
    auto asked = steady_clock::now();
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK(json::parse(r->body)
          == json{{"thread_id", "stop-me"}, {"cancelled", true}});
    // The upstream sees its connection closed within 100 ms of the answer.
    json stats;
    do {
      stats = up.stats();
      if (stats["aborted"] == aborted_before + 1)
        break;
      std::this_thread::sleep_for(milliseconds(2));
    } while (steady_clock::now() - asked < seconds(5));
    CHECK(stats["aborted"] == aborted_before + 1);
    CHECK(steady_clock::now() - asked < milliseconds(100));
    REQUIRE(streams.finish(seconds(10)) == 0);
    auto events = events_of(streams.streams[0].reply);
    REQUIRE(events.size() >= 3);
    CHECK(events.front().first == "thread");
    CHECK(events.back().first == "cancelled");
    CHECK(events.back().second["interrupted"] == true);
    CHECK(events.back().second["cancelled"] == true);
    CHECK(events.back().second["turns"] == 2 * (round + 1));
    std::string heard;
    for (auto& [name, data] : events)
      if (name == "delta")
        heard += data["content"].get<std::string>();
    // Stored: what was generated, marked interrupted; the client heard
    // all of it or all but the pieces in flight.
    auto h = cli.Get("/v1/threads/stop-me/history?max_turns=100");
    REQUIRE(h);
    auto turns = json::parse(h->body)["turns"];
    REQUIRE(turns.size() == static_cast<size_t>(2 * (round + 1)));
    auto& reply = turns[2 * round + 1];
    CHECK(reply["role"] == "assistant");
    CHECK(reply["interrupted"] == true);
    auto stored = reply["content"].get<std::string>();
    CHECK(!stored.empty());
    CHECK(stored.size() < 2000);
    CHECK(stored.compare(0, heard.size(), heard) == 0);
  }
  // Cancelled already, nothing runs: 409 again.
  auto again = cli.Post("/v1/threads/stop-me/cancel", "", "application/json");
  REQUIRE(again);
  CHECK(again->status == 409);
  auto bad = cli.Post("/v1/threads/bad%20id/cancel", "", "application/json");
  REQUIRE(bad);
  CHECK(bad->status == 400);
}

TEST_CASE("http: DELETE /v1/threads/{id} during a streamed reply ends the "
          "stream and leaves nothing of the thread also after kill -9 "
          "right after the 204") {
  raise_fd_limit();
  spindle::test::fake_upstream up{
    {"--stream-seconds", "10", "--chunks", "100", "--reply-bytes", "2000"}};
  spindle::test::temp_dir dir;
  std::vector<std::string> flags{"--llm", "openai", "--llm-url", up.url(),
                                 "--llm-model", "fake", "--data", dir.str()};
  {
    server_process srv{flags};
    httplib::Client cli{"127.0.0.1", srv.port()};
    auto item = cli.Post("/v1/threads/del-me/items",
                         R"({"type":"text","content":"a note"})",
                         "application/json");
    REQUIRE(item);
    REQUIRE(item->status == 201);
    auto memory = cli.Post("/v1/memories",
                           R"({"content":"the door is blue","thread_id":"del-me"})",
                           "application/json");
    REQUIRE(memory);
    REQUIRE(memory->status == 201);
    auto kept = cli.Post("/v1/memories",
                         R"({"content":"the door is red","thread_id":"keep-me"})",
                         "application/json");
    REQUIRE(kept);
    REQUIRE(kept->status == 201);
    stream_set streams;
    REQUIRE(streams.start(srv.port(), {stream_request("del-me", "go on")}));
    REQUIRE(streams.until_each_has("event: delta", seconds(30)) == 0);
    auto asked = steady_clock::now();
    auto r = cli.Delete("/v1/threads/del-me");
    REQUIRE(r);
    CHECK(r->status == 204);
    // The reply stopped at once (cancelled), not after its 10 s.
    CHECK(steady_clock::now() - asked < seconds(3));
    CHECK(srv.stop(SIGKILL) == -1);
    REQUIRE(streams.finish(seconds(10)) == 0);
    auto events = events_of(streams.streams[0].reply);
    REQUIRE(!events.empty());
    CHECK(events.front().first == "thread");
    CHECK(events.back().first == "cancelled");
  }
  server_process srv{flags};
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto thread = cli.Get("/v1/threads/del-me");
  REQUIRE(thread);
  CHECK(thread->status == 404);
  auto history = cli.Get("/v1/threads/del-me/history");
  REQUIRE(history);
  CHECK(history->status == 404);
  auto items = cli.Get("/v1/threads/del-me/items");
  REQUIRE(items);
  CHECK((items->status == 404
         || json::parse(items->body)["items"].empty()));
  auto memories = cli.Get("/v1/memories/entries?thread_id=del-me");
  REQUIRE(memories);
  REQUIRE(memories->status == 200);
  CHECK(json::parse(memories->body)["entries"].empty());
  auto others = cli.Get("/v1/memories/entries?thread_id=keep-me");
  REQUIRE(others);
  CHECK(json::parse(others->body)["entries"].size() == 1);
  auto listed = cli.Get("/v1/threads");
  REQUIRE(listed);
  auto page = json::parse(listed->body);
  for (auto& t : page["data"])
    CHECK(t["thread_id"] != "del-me");
}

TEST_CASE("http: 2,000 concurrent streamed exchanges through a fake "
          "upstream on 500 threads: every turn stored exactly once, in "
          "order, never interleaved") {
  raise_fd_limit();
  // Each completion (answers and, from a thread's second message on,
  // rewrites) streams over a second.
  spindle::test::fake_upstream up{{"--stream-seconds", "1", "--chunks", "4"}};
  server_process srv{{"--llm", "openai", "--llm-url", up.url(),
                      "--llm-model", "fake"}};
  // Four messages per thread at once: D9 queues them, so each thread ends
  // with 8 turns alternating user and assistant.
  constexpr int threads = 500, per_thread = 4;
  std::vector<std::string> requests;
  for (int m = 0; m < per_thread; ++m)
    for (int t = 0; t < threads; ++t)
      requests.push_back(stream_request(
        "many-" + std::to_string(t),
        "message " + std::to_string(m) + " of thread " + std::to_string(t)));
  stream_set streams;
  REQUIRE(streams.start(srv.port(), requests));
  REQUIRE(streams.finish(seconds(120)) == 0);
  size_t done = 0;
  for (auto& s : streams.streams) {
    INFO(s.reply.substr(0, 300));
    REQUIRE(status_of(s.reply) == 200);
    auto events = events_of(s.reply);
    REQUIRE(events.size() >= 3);
    CHECK(events.front().first == "thread");
    CHECK(events.back().first == "done");
    done += events.back().first == "done";
  }
  CHECK(done == requests.size());
  // Answers and rewrites all went upstream, well over a hundred at once (a
  // server with a thread per connection held at most its 64 threads'
  // worth; how many of the 500 overlap depends on the machine's speed:
  // about 170 under ASan with another test beside it).
  auto stats = up.stats();
  CHECK(stats["completed"].get<int>() >= threads * per_thread);
  CHECK(stats["max_open"].get<int>() >= 128);
  httplib::Client cli{"127.0.0.1", srv.port()};
  cli.set_keep_alive(true);
  for (int t = 0; t < threads; ++t) {
    auto id = "many-" + std::to_string(t);
    auto r = cli.Get(("/v1/threads/" + id + "/history?max_turns=100").c_str());
    REQUIRE(r);
    auto h = json::parse(r->body);
    REQUIRE(h["total_turns"] == 2 * per_thread);
    std::set<std::string> seen;
    auto& turns = h["turns"];
    for (size_t i = 0; i < turns.size(); ++i) {
      auto role = turns[i]["role"].get<std::string>();
      REQUIRE(role == (i % 2 == 0 ? "user" : "assistant"));
      if (role == "user") {
        auto content = turns[i]["content"].get<std::string>();
        CHECK(content.find("of thread " + std::to_string(t)) != std::string::npos);
        CHECK(seen.insert(content).second); // stored exactly once
        // The reply that follows answers this message, not another one.
        CHECK(turns[i + 1]["content"].get<std::string>().find(content)
              != std::string::npos);
      }
    }
    CHECK(seen.size() == per_thread);
  }
}

TEST_CASE("http: SIGTERM during 500 streams lets every one finish within "
          "the grace period, stored, and the server exits 0") {
  raise_fd_limit();
  server_process srv{{"--llm-delta-delay-ms", "300", "--shutdown-grace", "20"}};
  std::vector<std::string> requests;
  for (int i = 0; i < 500; ++i)
    requests.push_back(stream_request("term-" + std::to_string(i),
                                      "last words " + std::to_string(i)));
  stream_set streams;
  REQUIRE(streams.start(srv.port(), requests));
  // Every stream under way (its first delta came; 4 deltas 300 ms apart
  // take 1.2 s), however slow the machine.
  REQUIRE(streams.until_each_has("event: delta", seconds(60)) == 0);
  auto start = steady_clock::now();
  ::kill(srv.pid(), SIGTERM);
  REQUIRE(streams.finish(seconds(30)) == 0);
  CHECK(steady_clock::now() - start < seconds(20));
  for (auto& s : streams.streams) {
    INFO(s.reply.substr(0, 300));
    auto events = events_of(s.reply);
    REQUIRE(!events.empty());
    CHECK(events.back().first == "done");
    CHECK(events.back().second["turns"] == 2);
    CHECK_FALSE(events.back().second.contains("interrupted"));
  }
  CHECK(srv.stop(SIGTERM) == 0);
}
