// spindle stress: a short pass against the real server and an in-process
// runtime finds no violation; a server that breaks the invariants is
// caught, with evidence and exit code 1.

#include <atomic>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::run;
using spindle::test::server_process;
using spindle::test::spindle_binary;

namespace {

json run_stress(const std::vector<std::string>& extra, int expected_exit) {
  std::vector<std::string> argv{spindle_binary(), "stress", "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto r = run(argv);
  INFO(r.err);
  INFO(r.out.substr(0, 2000));
  REQUIRE(r.exit_code == expected_exit);
  auto report = json::parse(r.out, nullptr, false);
  REQUIRE(report.is_object());
  return report;
}

// A server whose ID route hands out the same ID twice in a row and whose
// history shows a turn count going down.
class broken_server {
public:
  broken_server() {
    svr_.Post("/v1/ids", [this](const httplib::Request&, httplib::Response& res) {
      auto n = 1 + counter_++ / 2; // 1, 1, 2, 2, ...
      res.set_content(json{{"id", "ctx-" + std::to_string(n)}}.dump(),
                      "application/json");
    });
    svr_.Get(R"(/v1/threads/([^/]+)/history)",
             [this](const httplib::Request&, httplib::Response& res) {
               uint64_t total = (reads_++ % 2 == 0) ? 4 : 2; // 4, 2, 4, 2
               res.set_content(json{{"turns", json::array()},
                                    {"total_turns", total}}
                                 .dump(),
                               "application/json");
             });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread{[this] { svr_.listen_after_bind(); }};
    while (!svr_.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~broken_server() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }

private:
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<uint64_t> counter_{0}, reads_{0};
};

} // namespace

TEST_CASE("stress: a short pass against the real server finds no violation") {
  server_process srv;
  auto url = "http://127.0.0.1:" + std::to_string(srv.port());
  for (auto clients : {"1", "8", "32"}) {
    DYNAMIC_SECTION(clients << " clients") {
      auto report = run_stress({"--url", url, "--clients", clients,
                                "--requests", "600"},
                               0);
      CHECK(report["violations"].empty());
      CHECK(report["errors"] == 0);
      CHECK(report["operations"] == 600);
      for (auto op : {"message", "history", "context", "item", "id", "task"})
        CHECK(report["operations_by_kind"].contains(op));
      CHECK(report["operations_by_kind"]["message"]["p99_ms"] >= 0);
    }
  }
}

TEST_CASE("stress: --thread-turns ends conversations: writers move on to "
          "new threads of about that many turns") {
  server_process srv;
  auto url = "http://127.0.0.1:" + std::to_string(srv.port());
  // 4 clients, messages only, 1 shared slot: 200 messages, 400 turns.
  auto report = run_stress({"--url", url, "--clients", "4", "--requests",
                            "200", "--mix", "message=1", "--shared-threads",
                            "1", "--thread-turns", "10"},
                           0);
  CHECK(report["violations"].empty());
  CHECK(report["errors"] == 0);
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto listed = cli.Get("/v1/threads?limit=1000");
  REQUIRE(listed);
  REQUIRE(listed->status == 200);
  auto page = json::parse(listed->body);
  uint64_t turns = 0, threads = 0, shared = 0;
  for (auto& t : page["data"]) {
    auto id = t["thread_id"].get<std::string>();
    if (id.rfind("stress-", 0) != 0)
      continue;
    ++threads;
    shared += id.find("-shared-0-") != std::string::npos;
    auto n = t["turns"].get<uint64_t>();
    turns += n;
    // 10 turns a thread; a writer that picked the shared thread's name
    // just before it moved on adds one message more (4 writers: 3 more).
    INFO(id << ": " << n << " turns");
    CHECK(n <= 10 + 2 * 3);
  }
  CHECK(turns == 400);
  // 400 turns in threads of at most 16: at least 25 threads, several of
  // them the shared slot's.
  CHECK(threads >= 25);
  CHECK(shared >= 3);
}

TEST_CASE("stress: an in-process runtime passes the same checks") {
  auto report = run_stress({"--in-process", "--clients", "16", "--duration",
                            "2"},
                           0);
  CHECK(report["violations"].empty());
  CHECK(report["errors"] == 0);
  CHECK(report["operations"] > 100);
}

TEST_CASE("stress: duplicate IDs and a shrinking thread are reported with "
          "evidence and exit code 1") {
  broken_server bad;
  auto ids = run_stress({"--url", bad.url(), "--clients", "1", "--requests",
                         "6", "--mix", "id=1"},
                        1);
  REQUIRE_FALSE(ids["violations"].empty());
  bool duplicate = false;
  for (auto& v : ids["violations"])
    duplicate = duplicate || v["invariant"] == "ids never repeat";
  CHECK(duplicate);

  auto turns = run_stress({"--url", bad.url(), "--clients", "1",
                           "--requests", "6", "--mix", "history=1",
                           "--shared-threads", "0"},
                          1);
  REQUIRE_FALSE(turns["violations"].empty());
  CHECK(turns["violations"][0]["invariant"]
        == "a thread's turn count never decreases");
  CHECK(turns["violations"][0]["evidence"].get<std::string>().find(
          "at 2 turns")
        != std::string::npos);
}

TEST_CASE("stress: bad arguments exit 2") {
  CHECK(run({spindle_binary(), "stress", "--requests", "5"}).exit_code == 2);
  CHECK(run({spindle_binary(), "stress", "--in-process"}).exit_code == 2);
  CHECK(run({spindle_binary(), "stress", "--in-process", "--requests", "5",
             "--mix", "dance=3"})
          .exit_code
        == 2);
  for (auto url : {"ftp://127.0.0.1:1", "http://127.0.0.1:99999",
                   "http://:80"}) {
    auto r = run({spindle_binary(), "stress", "--url", url, "--requests",
                  "5"});
    INFO(url << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--url") != std::string::npos);
  }
}
