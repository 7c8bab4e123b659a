// The routes the browser console stands on (docs/console.md), end to end
// against the real binary: the console's files at / and /console/, GET
// /v1/stats, GET /v1/orchestrations with the next task in D1 order, and
// the lease expiry of running tasks. The page itself is tested in
// Chromium by tests/console/run.sh.

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::get_json;
using spindle::test::post_json;
using spindle::test::server_process;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

} // namespace

TEST_CASE("console: the page and its files are served from the binary with "
          "a content security policy and ETags - without a token") {
  server_process srv{{"--token", "t0ken"}};
  httplib::Client cli("127.0.0.1", srv.port());
  auto page = cli.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  CHECK(page->body.find("<script type=\"module\" src=\"/console/main.js\">")
        != std::string::npos);
  auto csp = page->get_header_value("Content-Security-Policy");
  CHECK(csp.find("script-src 'self'") != std::string::npos);
  CHECK(csp.find("unsafe-inline") == std::string::npos);
  auto etag = page->get_header_value("ETag");
  REQUIRE(etag.size() == 18);
  auto again = cli.Get("/", {{"If-None-Match", etag}});
  REQUIRE(again);
  CHECK(again->status == 304);
  CHECK(again->body.empty());
  for (auto [file, type] :
       {std::pair{"main.js", "text/javascript; charset=utf-8"},
        std::pair{"api.js", "text/javascript; charset=utf-8"},
        std::pair{"console.css", "text/css; charset=utf-8"}}) {
    auto r = cli.Get(std::string{"/console/"} + file);
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->get_header_value("Content-Type") == type);
    CHECK(r->get_header_value("X-Content-Type-Options") == "nosniff");
    CHECK(!r->body.empty());
  }
  // The API keeps its auth, health its route; nothing else is a file.
  for (auto [target, status] : {std::pair{"/console/secrets.txt", 404},
                                std::pair{"/console/", 404},
                                std::pair{"/v1/stats", 401},
                                std::pair{"/healthz", 200}}) {
    auto r = cli.Get(target);
    REQUIRE(r);
    CHECK(r->status == status);
  }
}

TEST_CASE("console: GET /v1/stats reports this node, request rate and "
          "latency, exchanges in flight and store commits") {
  spindle::test::temp_dir dir;
  server_process srv{{"--data", dir.str()}};
  httplib::Client cli("127.0.0.1", srv.port());
  for (int i = 0; i < 50; ++i)
    REQUIRE(cli.Get("/healthz"));
  REQUIRE(post_json(cli, "/v1/threads/new/messages", {{"content", "hi"}})
            .first
          == 200);
  // The window counts whole seconds before the current one.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto [status, s] = get_json(cli, "/v1/stats?window=5");
  REQUIRE(status == 200);
  REQUIRE(s["nodes"].size() == 1);
  CHECK(s["nodes"][0]["address"]
        == "127.0.0.1:" + std::to_string(srv.port()));
  CHECK(s["nodes"][0]["pid"] == srv.pid());
  CHECK(s["nodes"][0]["self"] == true);
  CHECK(s["http"]["requests_total"].get<int>() >= 51);
  CHECK(s["http"]["window_s"] == 5);
  // 51 requests or more in the last five seconds.
  CHECK(s["http"]["requests_per_s"].get<double>() * 5 >= 51);
  auto p50 = s["http"]["latency_ms"]["p50"].get<double>();
  auto p99 = s["http"]["latency_ms"]["p99"].get<double>();
  CHECK(p50 > 0);
  CHECK(p99 >= p50);
  CHECK(s["exchanges_in_flight"] == 0);
  CHECK(s["storage"]["commits"].get<int>() >= 1);
  CHECK(s["storage"]["writes"].get<int>() >= s["storage"]["commits"].get<int>());
  CHECK(s["storage"]["writes_per_commit"].get<double>() >= 1);
  CHECK(s["threads"] == 1);
  CHECK(s["events"]["published"].get<int>() >= 3);
  CHECK(get_json(cli, "/v1/stats?window=0").first == 400);
  CHECK(get_json(cli, "/v1/stats?other=1").first == 400);
}

TEST_CASE("console: GET /v1/orchestrations lists them with the next task in "
          "D1 order - a running task shows its lease expiry") {
  server_process srv;
  httplib::Client cli("127.0.0.1", srv.port());
  auto [s0, empty] = get_json(cli, "/v1/orchestrations");
  REQUIRE(s0 == 200);
  CHECK(empty["data"].empty());
  CHECK(empty["next"].is_null());
  // The seed's tree (D1): 0001 with t1{t1.1, t1.2} and t2, plus 0002.
  auto make = [&](const std::string& path) {
    auto [st, r] = post_json(cli, path, {{"payload", "x"}});
    REQUIRE(st == 201);
    return r["id"].get<std::string>();
  };
  auto o1 = make("/v1/orchestrations");
  auto t1 = make("/v1/tasks/" + o1 + "/subtasks");
  make("/v1/tasks/" + o1 + "/subtasks");
  make("/v1/tasks/" + t1 + "/subtasks");
  make("/v1/tasks/" + t1 + "/subtasks");
  auto o2 = make("/v1/orchestrations");
  auto [s1, list] = get_json(cli, "/v1/orchestrations");
  REQUIRE(s1 == 200);
  CHECK(list["data"] == json::array({o1, o2}));
  CHECK(list["next"] == "0001_t1.2");
  auto [s2, tree] = get_json(cli, "/v1/orchestrations/" + o2);
  REQUIRE(s2 == 200);
  CHECK(tree["next"] == "0001_t1.2"); // over every orchestration
  // Each claim takes the task `next` named.
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    auto next = get_json(cli, "/v1/orchestrations").second["next"];
    auto [cs, claimed] = post_json(cli, "/v1/tasks/claim",
                                   {{"worker", "w"}, {"lease_s", 30}});
    REQUIRE(cs == 200);
    CHECK(claimed["id"] == next);
    order.push_back(claimed["id"]);
    // Running under a lease: the expiry shows in the task and the tree.
    auto id = claimed["id"].get<std::string>();
    auto [ts, task] = get_json(cli, "/v1/tasks/" + id);
    REQUIRE(ts == 200);
    auto expires = task["lease_expires_at"];
    REQUIRE(expires.is_number_integer());
    CHECK(expires == claimed["lease"]["expires_at"]);
    CHECK(expires.get<int64_t>() > now_ms() + 20'000);
    auto in_tree = get_json(cli, "/v1/orchestrations/" + id.substr(0, 4))
                     .second["tasks"];
    for (auto& t : in_tree)
      if (t["id"] == id)
        CHECK(t["lease_expires_at"] == expires);
    REQUIRE(post_json(cli, "/v1/tasks/" + id + "/complete",
                      {{"lease", claimed["lease"]["token"]}})
              .first
            == 200);
    CHECK(get_json(cli, "/v1/tasks/" + id).second["lease_expires_at"]
            .is_null());
  }
  CHECK(order
        == std::vector<std::string>{"0001_t1.2", "0001_t1.1", "0001_t2",
                                    "0001_t1", "0002", "0001"});
  CHECK(get_json(cli, "/v1/orchestrations").second["next"].is_null());
  CHECK(get_json(cli, "/v1/orchestrations?limit=1").first == 400);
}
