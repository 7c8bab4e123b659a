// The API as a contract (docs/api.md, "The API as a contract"): the router's
// table and docs/openapi.yaml name the same routes, the server answers the
// document at GET /v1/openapi.json, and it records every answer for the
// conformance check when asked to.

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "openapi.hpp"
#include "recorder.hpp"
#include "served.hpp"
#include "server/server.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/version.hpp"
#include "support.hpp"

using namespace spindle;
using nlohmann::json;

namespace {

// "GET /v1/threads/{id}" for every operation of the document.
std::set<std::string> documented_routes(const json& doc) {
  static const std::set<std::string> methods{"get",   "put",    "post",
                                             "patch", "delete", "head",
                                             "options"};
  std::set<std::string> out;
  for (auto& [path, item] : doc.at("paths").items())
    for (auto& [method, op] : item.items())
      if (methods.count(method)) {
        std::string upper = method;
        std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
        out.insert(upper + " " + path);
      }
  return out;
}

std::string listed(const std::set<std::string>& names) {
  std::string out;
  for (auto& n : names)
    out += "\n  " + n;
  return out;
}

} // namespace

TEST_CASE("openapi: every route of the router is described in "
          "docs/openapi.yaml and every operation of the document is a route",
          "[openapi]") {
  test::served_runtime s;
  auto routes = s.srv().routes();
  std::set<std::string> served_routes(routes.begin(), routes.end());
  REQUIRE(served_routes.size() == routes.size()); // no route twice
  auto documented = documented_routes(json::parse(http::openapi_source()));
  std::set<std::string> undocumented, unserved;
  std::set_difference(served_routes.begin(), served_routes.end(),
                      documented.begin(), documented.end(),
                      std::inserter(undocumented, undocumented.end()));
  std::set_difference(documented.begin(), documented.end(),
                      served_routes.begin(), served_routes.end(),
                      std::inserter(unserved, unserved.end()));
  INFO("routes the document does not describe:" << listed(undocumented));
  INFO("operations of the document no route serves:" << listed(unserved));
  CHECK(undocumented.empty());
  CHECK(unserved.empty());
  CHECK(served_routes.size() >= 42);
}

TEST_CASE("openapi: GET /v1/openapi.json answers the document with the "
          "version the server runs, without a token",
          "[openapi]") {
  server_options so;
  so.token = "secret";
  test::served_runtime s{{}, so};
  httplib::Client cli{"127.0.0.1", s.port()};
  auto res = cli.Get("/v1/openapi.json");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  auto doc = json::parse(res->body);
  CHECK(doc.at("openapi").get<std::string>().rfind("3.1", 0) == 0);
  CHECK(doc.at("info").at("version") == version_string);
  CHECK(documented_routes(doc).size() == s.srv().routes().size());
  // The same document the binary holds, but for the version.
  auto built = json::parse(http::openapi_source());
  built["info"]["version"] = version_string;
  CHECK(doc == built);
  // Everything else still needs the token.
  auto refused = cli.Get("/v1/threads");
  REQUIRE(refused);
  CHECK(refused->status == 401);
}

TEST_CASE("openapi: with a record directory the server records every "
          "answer, plain, streamed and refused, one JSON line each",
          "[openapi]") {
  test::temp_dir dir;
  server_options so;
  so.record_dir = dir.path().string();
  {
    test::served_runtime s{{}, so};
    httplib::Client cli{"127.0.0.1", s.port()};
    auto health = cli.Get("/healthz");
    REQUIRE(health);
    auto streamed = cli.Post("/v1/threads/rec-1/messages/stream",
                             R"({"content":"hello"})", "application/json");
    REQUIRE(streamed);
    REQUIRE(streamed->status == 200);
    auto missing = cli.Get("/v1/no-such-route");
    REQUIRE(missing);
    CHECK(missing->status == 404);
  }
  std::vector<json> lines;
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
    std::ifstream in{entry.path()};
    for (std::string line; std::getline(in, line);)
      lines.push_back(json::parse(line));
  }
  REQUIRE(lines.size() == 3);
  auto find = [&](const std::string& target) {
    auto it = std::find_if(lines.begin(), lines.end(), [&](const json& l) {
      return l.at("target") == target;
    });
    REQUIRE(it != lines.end());
    return *it;
  };
  auto health = find("/healthz");
  CHECK(health.at("method") == "GET");
  CHECK(health.at("status") == 200);
  CHECK(health.at("streamed") == false);
  CHECK(json::parse(health.at("body").get<std::string>()).at("status")
        == "ok");
  auto stream = find("/v1/threads/rec-1/messages/stream");
  CHECK(stream.at("status") == 200);
  CHECK(stream.at("streamed") == true);
  CHECK(stream.at("complete") == true);
  CHECK(stream.at("content_type").get<std::string>().rfind(
          "text/event-stream", 0)
        == 0);
  auto body = stream.at("body").get<std::string>();
  CHECK(body.find("event: done") != std::string::npos);
  auto missing = find("/v1/no-such-route");
  CHECK(missing.at("status") == 404);
  CHECK(json::parse(missing.at("body").get<std::string>())["error"]["code"]
        == "not_found");
}

TEST_CASE("openapi: what the schema fuzzer found refused is refused and "
          "changes nothing: loose integers, empty parameters, null "
          "metadata, and a claim shows its lease like GET /v1/tasks/{id}",
          "[openapi]") {
  test::served_runtime s;
  httplib::Client cli{"127.0.0.1", s.port()};
  auto code = [](const httplib::Result& r) {
    REQUIRE(r);
    return r->status;
  };
  // Integers: digits and an optional '-', nothing else.
  CHECK(code(cli.Get("/v1/stats?window=5")) == 200);
  CHECK(code(cli.Get("/v1/stats?window=%205")) == 400);
  CHECK(code(cli.Get("/v1/stats?window=+5")) == 400);
  CHECK(code(cli.Get("/v1/stats?window=5%20")) == 400);
  auto stored = cli.Post("/v1/memories",
                         R"({"content":"likes tea","user_id":"u1"})",
                         "application/json");
  REQUIRE(code(stored) == 201);
  auto id = json::parse(stored->body).at("id").get<int64_t>();
  auto entries = [&] {
    auto r = cli.Get("/v1/memories/entries?user_id=u1");
    REQUIRE(code(r) == 200);
    return json::parse(r->body).at("entries").size();
  };
  CHECK(code(cli.Delete("/v1/memories/+" + std::to_string(id))) == 400);
  CHECK(code(cli.Delete("/v1/memories/%20" + std::to_string(id))) == 400);
  CHECK(entries() == 1);
  // An empty parameter names nothing; it is not left out.
  CHECK(code(cli.Delete("/v1/memories?user_id=u1&thread_id=")) == 400);
  CHECK(code(cli.Get("/v1/memories/entries?user_id=")) == 400);
  CHECK(entries() == 1);
  CHECK(code(cli.Get("/v1/events?last_event_id=")) == 400);
  // PATCH needs a metadata object.
  auto made = cli.Post("/v1/threads", R"({"metadata":{"a":"b"}})",
                       "application/json");
  REQUIRE(code(made) == 201);
  auto thread = json::parse(made->body);
  auto path = "/v1/threads/" + thread.at("thread_id").get<std::string>();
  CHECK(code(cli.Patch(path, R"({"metadata":null})", "application/json"))
        == 400);
  CHECK(code(cli.Patch(path, R"({"metadata":"x"})", "application/json"))
        == 400);
  auto after = cli.Get(path);
  REQUIRE(code(after) == 200);
  CHECK(json::parse(after->body).at("updated_at") == thread.at("updated_at"));
  // A claim's task shows the lease it is under.
  REQUIRE(code(cli.Post("/v1/orchestrations", R"({"payload":"p"})",
                        "application/json"))
          == 201);
  auto claim = cli.Post("/v1/tasks/claim", R"({"worker":"w","lease_s":30})",
                        "application/json");
  REQUIRE(code(claim) == 200);
  auto claimed = json::parse(claim->body);
  auto lease_at = claimed.at("lease").at("expires_at");
  CHECK(claimed.at("lease_expires_at") == lease_at);
  auto task = cli.Get("/v1/tasks/" + claimed.at("id").get<std::string>());
  REQUIRE(code(task) == 200);
  CHECK(json::parse(task->body).at("lease_expires_at") == lease_at);
  // Outside a cluster the cluster's answer has every field, null.
  auto cluster = cli.Get("/v1/cluster");
  REQUIRE(code(cluster) == 200);
  auto c = json::parse(cluster->body);
  CHECK(c.at("clustered") == false);
  CHECK(c.at("scheduler").is_null());
}

namespace {

// A responder that only counts what reaches it.
struct counting_responder : http::responder {
  int sends = 0, begins = 0, writes = 0, ends = 0;
  void send(http::response) override {
    ++sends;
  }
  void begin_stream(int, std::string,
                    std::vector<std::pair<std::string, std::string>>)
    override {
    ++begins;
  }
  bool write(std::string) override {
    ++writes;
    return true;
  }
  std::shared_ptr<flow_control> flow() override {
    return nullptr;
  }
  void end_stream() override {
    ++ends;
  }
  bool gone() const noexcept override {
    return false;
  }
  void on_gone(std::function<void()>) override {
  }
};

std::vector<json> records_in(const std::filesystem::path& dir) {
  std::vector<json> out;
  for (auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in{entry.path()};
    for (std::string line; std::getline(in, line);)
      out.push_back(json::parse(line));
  }
  return out;
}

} // namespace

TEST_CASE("openapi: the record holds what the connection sends: stream "
          "steps after a plain answer, and an answer sent once streaming, "
          "are passed on but not recorded",
          "[openapi]") {
  test::temp_dir dir;
  auto rec = http::response_recorder::open(dir.str());
  REQUIRE(rec);
  http::request req;
  req.method = "POST";
  req.target = "/v1/threads/new/messages/stream";
  {
    // An error before the stream began, then the route's stream steps.
    auto inner = std::make_shared<counting_responder>();
    auto res = rec->wrap(req, inner);
    http::response plain;
    plain.status = 400;
    plain.set_content(R"({"error":{"code":"invalid_argument"}})",
                      "application/json");
    res->send(plain);
    res->write("event: error\ndata: {}\n\n");
    res->end_stream();
    CHECK(inner->sends == 1);
    CHECK(inner->writes == 1);
    CHECK(inner->ends == 1);
  }
  {
    // A stream, then an error sent once streaming.
    auto inner = std::make_shared<counting_responder>();
    auto res = rec->wrap(req, inner);
    res->begin_stream(200, "text/event-stream", {});
    res->write("event: delta\ndata: {\"content\":\"a\"}\n\n");
    http::response late;
    late.status = 500;
    res->send(late);
    res->end_stream();
    CHECK(inner->begins == 1);
    CHECK(inner->sends == 1);
  }
  auto lines = records_in(dir.path());
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].at("status") == 400);
  CHECK(lines[0].at("streamed") == false);
  CHECK(lines[0].at("body").get<std::string>().find("event:")
        == std::string::npos);
  CHECK(lines[1].at("status") == 200);
  CHECK(lines[1].at("streamed") == true);
  CHECK(lines[1].at("complete") == true);
  CHECK(lines[1].at("body") == "event: delta\ndata: {\"content\":\"a\"}\n\n");
}
