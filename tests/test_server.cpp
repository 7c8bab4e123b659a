// spindle serve end to end: the real binary on a free loopback port, spoken
// to over HTTP. Core behaviour: health, auth, errors, limits, metrics, logs,
// signals, and the ID route.

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;

namespace {

httplib::Headers bearer(const std::string& token) {
  return {{"Authorization", "Bearer " + token}};
}

json body_of(const httplib::Result& r) {
  REQUIRE(r);
  return json::parse(r->body);
}

void check_error(const httplib::Result& r, int status, const std::string& code) {
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == status);
  auto body = json::parse(r->body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body["error"]["code"] == code);
  CHECK(body["error"]["message"].is_string());
  CHECK_FALSE(body["error"]["message"].get<std::string>().empty());
  // OpenAI's error object too: a type from the status, a param or null.
  auto type = status == 401   ? "authentication_error"
              : status == 404 ? "not_found_error"
              : status == 409 ? "conflict_error"
              : status == 504 ? "timeout_error"
              : status >= 500 ? "api_error"
                              : "invalid_request_error";
  CHECK(body["error"]["type"] == type);
  CHECK(body["error"].contains("param"));
}

} // namespace

TEST_CASE("server: /healthz answers without auth - every other route needs "
          "the bearer token when one is set") {
  server_process srv{{"--token", "s3cret"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto health = cli.Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(body_of(health)["status"] == "ok");
  check_error(cli.Post("/v1/ids", R"({"kind":"context"})", "application/json"),
              401, "unauthorized");
  check_error(cli.Get("/metrics"), 401, "unauthorized");
  check_error(cli.Post("/v1/ids", bearer("wrong"), R"({"kind":"context"})",
                       "application/json"),
              401, "unauthorized");
  auto ok = cli.Post("/v1/ids", bearer("s3cret"), R"({"kind":"context"})",
                     "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(body_of(ok)["id"] == "ctx-1");
}

TEST_CASE("server: POST /v1/ids hands out context, orchestration and task "
          "IDs") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto post = [&](const std::string& body) {
    auto r = cli.Post("/v1/ids", body, "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body)["id"].get<std::string>();
  };
  CHECK(post(R"({"kind":"context"})") == "ctx-1");
  CHECK(post(R"({"kind":"context"})") == "ctx-2");
  CHECK(post(R"({"kind":"orchestration"})") == "0001");
  CHECK(post(R"({"kind":"task","parent":"0001"})") == "0001_t1");
  CHECK(post(R"({"kind":"task","parent":"0001_t1"})") == "0001_t1.1");
}

TEST_CASE("server: 32 concurrent clients get unique, per-client increasing "
          "IDs") {
  server_process srv;
  constexpr int clients = 32, per_client = 50;
  std::vector<std::vector<uint64_t>> got(clients);
  std::mutex failures_mx;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client cli{"127.0.0.1", srv.port()};
      cli.set_keep_alive(true);
      for (int i = 0; i < per_client; ++i) {
        auto r = cli.Post("/v1/ids", R"({"kind":"context"})",
                          "application/json");
        if (!r || r->status != 200) {
          std::lock_guard<std::mutex> guard{failures_mx};
          failures.push_back(r ? std::to_string(r->status) + " " + r->body
                               : "transport: " + httplib::to_string(r.error()));
          continue;
        }
        auto id = json::parse(r->body)["id"].get<std::string>();
        got[c].push_back(std::stoull(id.substr(4)));
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& f : failures)
    UNSCOPED_INFO(f);
  CHECK(failures.empty());
  std::set<uint64_t> all;
  for (auto& ids : got) {
    REQUIRE(ids.size() == per_client);
    for (size_t i = 1; i < ids.size(); ++i)
      REQUIRE(ids[i - 1] < ids[i]);
    all.insert(ids.begin(), ids.end());
  }
  CHECK(all.size() == clients * per_client);
  CHECK(*all.rbegin() == clients * per_client);
}

TEST_CASE("server: bad input to /v1/ids gets a clear error and changes no "
          "counter") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  struct bad_case {
    std::string body;
    int status;
    std::string code;
  };
  std::vector<bad_case> cases{
    {"", 400, "malformed"},
    {"{", 400, "malformed"},
    {R"({"kind":"context")", 400, "malformed"},
    {"[1,2]", 400, "malformed"},
    {"\"context\"", 400, "malformed"},
    {R"({"kind":42})", 400, "malformed"},
    {R"({"kind":null})", 400, "malformed"},
    {R"({"kind":"bogus"})", 400, "invalid_argument"},
    {R"({"kind":"context","extra":1})", 400, "unknown_field"},
    {R"({"kind":"task"})", 400, "malformed"},
    {R"({"kind":"task","parent":"../x"})", 400, "invalid_id"},
    {R"({"kind":"task","parent":"0001_t0"})", 400, "invalid_id"},
    {R"({"kind":"task","parent":5})", 400, "malformed"},
    {R"({"kind":"context","parent":"0001"})", 400, "malformed"},
    {"{\"kind\":\"\xff\xfe\"}", 400, "malformed"}, // invalid UTF-8
  };
  for (auto& c : cases) {
    INFO(c.body);
    check_error(cli.Post("/v1/ids", c.body, "application/json"), c.status,
                c.code);
  }
  // The server is up and no counter moved.
  auto r = cli.Post("/v1/ids", R"({"kind":"context"})", "application/json");
  REQUIRE(r);
  CHECK(body_of(r)["id"] == "ctx-1");
}

TEST_CASE("server: bodies over the limit get 413 - unknown routes 404 - both "
          "as JSON errors") {
  server_process srv{{"--body-limit", "1024"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  std::string big = R"({"kind":"context","pad":")" + std::string(2000, 'x')
                    + "\"}";
  check_error(cli.Post("/v1/ids", big, "application/json"), 413, "too_large");
  check_error(cli.Get("/v1/nothing/here"), 404, "not_found");
  check_error(cli.Delete("/v1/ids"), 404, "not_found");
  auto r = cli.Post("/v1/ids", R"({"kind":"context"})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("server: /metrics speaks the Prometheus text format with requests "
          "and latencies by route") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  for (int i = 0; i < 3; ++i)
    cli.Post("/v1/ids", R"({"kind":"context"})", "application/json");
  cli.Post("/v1/ids", "{", "application/json");
  auto m = cli.Get("/metrics");
  REQUIRE(m);
  CHECK(m->status == 200);
  CHECK(m->get_header_value("Content-Type").find("text/plain")
        != std::string::npos);
  CHECK(m->body.find("# TYPE spindle_http_requests_total counter")
        != std::string::npos);
  CHECK(m->body.find(R"(spindle_http_requests_total{method="POST",route="POST /v1/ids",status="200"} 3)")
        != std::string::npos);
  CHECK(m->body.find(R"(spindle_http_requests_total{method="POST",route="POST /v1/ids",status="400"} 1)")
        != std::string::npos);
  CHECK(m->body.find(R"(spindle_http_request_duration_seconds_count{route="POST /v1/ids"} 4)")
        != std::string::npos);
  CHECK(m->body.find("spindle_ids_issued") != std::string::npos);
  // The state store's counters (zero with --data :memory:).
  for (auto name : {"spindle_storage_commits", "spindle_storage_writes",
                    "spindle_storage_failed_writes",
                    "spindle_storage_commit_seconds", "spindle_storage_folds",
                    "spindle_storage_fold_seconds", "spindle_storage_lingers",
                    "spindle_storage_linger_hits",
                    "spindle_storage_linger_seconds"})
    CHECK(m->body.find(std::string{"# TYPE "} + name + " gauge")
          != std::string::npos);
}

TEST_CASE("server: --store-linger-us reaches the state store: it lingers "
          "after small commits by default and never with 0") {
  // The value of an unlabelled gauge in a /metrics body (-1: absent).
  auto gauge = [](const std::string& body, const std::string& name) {
    auto at = body.find("\n" + name + " ");
    if (at == std::string::npos)
      return -1.0;
    return std::stod(body.substr(at + name.size() + 2));
  };
  for (const char* linger : {"", "0"}) {
    CAPTURE(linger);
    spindle::test::temp_dir dir;
    std::vector<std::string> args{"--data", dir.str(), "--sync", "normal"};
    if (*linger != '\0')
      args.insert(args.end(), {"--store-linger-us", linger});
    server_process srv{args};
    httplib::Client cli{"127.0.0.1", srv.port()};
    // One caller, one message at a time: every commit is a small one.
    for (int i = 0; i < 5; ++i) {
      auto r = cli.Post("/v1/threads/linger/messages",
                        R"({"content":"hello"})", "application/json");
      REQUIRE(r);
      REQUIRE(r->status == 200);
    }
    auto m = cli.Get("/metrics");
    REQUIRE(m);
    CHECK(gauge(m->body, "spindle_storage_commits") >= 5);
    auto lingers = gauge(m->body, "spindle_storage_lingers");
    if (*linger == '\0')
      CHECK(lingers >= 4);
    else
      CHECK(lingers == 0);
  }
}

TEST_CASE("server: /metrics counts tasks by state - spindle_tasks changes "
          "after a claim and a completion") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  // The value of one sample, e.g. spindle_tasks{state="pending"}; -1 if
  // the scrape lacks it.
  auto sample = [&](const std::string& state) {
    auto m = cli.Get("/metrics");
    REQUIRE(m);
    REQUIRE(m->status == 200);
    auto key = R"(spindle_tasks{state=")" + state + R"("} )";
    auto at = m->body.find(key);
    if (at == std::string::npos)
      return -1.0;
    return std::stod(m->body.substr(at + key.size()));
  };
  CHECK(sample("pending") == 0);
  auto created = cli.Post("/v1/orchestrations", R"({"payload":"o"})",
                          "application/json");
  REQUIRE(created);
  REQUIRE(created->status == 201);
  for (auto payload : {"a", "b"})
    REQUIRE(cli.Post("/v1/tasks/0001/subtasks",
                     std::string{R"({"payload":")"} + payload + R"("})",
                     "application/json"));
  CHECK(sample("pending") == 3);
  CHECK(sample("running") == 0);
  CHECK(sample("completed") == 0);
  auto claimed = cli.Post("/v1/tasks/claim", R"({"worker":"w"})",
                          "application/json");
  REQUIRE(claimed);
  REQUIRE(claimed->status == 200);
  auto id = body_of(claimed)["id"].get<std::string>();
  auto lease = body_of(claimed)["lease"]["token"].get<std::string>();
  CHECK(sample("pending") == 2);
  CHECK(sample("running") == 1);
  auto done = cli.Post("/v1/tasks/" + id + "/complete",
                       json{{"result", 1}, {"lease", lease}}.dump(),
                       "application/json");
  REQUIRE(done);
  REQUIRE(done->status == 200);
  CHECK(sample("running") == 0);
  CHECK(sample("completed") == 1);
  CHECK(sample("failed") == 0);
  CHECK(sample("stale") == 0);
  auto m = cli.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("# TYPE spindle_tasks gauge") != std::string::npos);
}

TEST_CASE("server: one log line per request - --log-format json writes one "
          "JSON object per line") {
  server_process srv{{"--log-format", "json"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  cli.Post("/v1/ids", R"({"kind":"context"})", "application/json");
  cli.Post("/v1/ids", R"({"kind":"nope"})", "application/json");
  CHECK(srv.stop(SIGTERM) == 0);
  int requests = 0;
  for (auto& line : spindle::test::lines(srv.log())) {
    auto obj = json::parse(line, nullptr, false);
    INFO(line);
    REQUIRE(obj.is_object());
    CHECK(obj.contains("time"));
    CHECK(obj.contains("level"));
    if (obj.value("event", "") == "request" && obj["route"] == "POST /v1/ids") {
      ++requests;
      CHECK(obj["latency_ms"].is_number());
      CHECK((obj["status"] == 200 || obj["status"] == 400));
    }
  }
  CHECK(requests == 2);
}

TEST_CASE("server: SPINDLE_* environment variables mirror the flags") {
  server_process srv{{}, {{"SPINDLE_TOKEN", "from-env"},
                          {"SPINDLE_BODY_LIMIT", "64"}}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  check_error(cli.Post("/v1/ids", R"({"kind":"context"})", "application/json"),
              401, "unauthorized");
  check_error(cli.Post("/v1/ids", bearer("from-env"),
                       R"({"kind":"context","x":")" + std::string(100, 'y')
                         + "\"}",
                       "application/json"),
              413, "too_large");
}

TEST_CASE("server: SIGINT and SIGTERM stop it cleanly with exit code 0") {
  for (int sig : {SIGINT, SIGTERM}) {
    server_process srv;
    httplib::Client cli{"127.0.0.1", srv.port()};
    REQUIRE(cli.Get("/healthz"));
    CHECK(srv.stop(sig) == 0);
    CHECK(srv.log().find("stopped") != std::string::npos);
  }
}

TEST_CASE("server: bad flags are refused with exit code 2 and a message") {
  auto r = spindle::test::run({spindle::test::spindle_binary(), "serve",
                               "--log-format", "xml"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("log-format") != std::string::npos);
  auto port = spindle::test::run({spindle::test::spindle_binary(), "serve",
                                  "--port", "70000"});
  CHECK(port.exit_code == 2);
  auto unknown = spindle::test::run({spindle::test::spindle_binary(), "serve",
                                     "--no-such-flag"});
  CHECK(unknown.exit_code == 2);
  auto linger = spindle::test::run({spindle::test::spindle_binary(), "serve",
                                    "--store-linger-us", "-1"});
  CHECK(linger.exit_code == 2);
  CHECK(linger.err.find("store-linger-us") != std::string::npos);
}

TEST_CASE("server: memory entries are listed in pages and deleted by user "
          "or one by one - bad requests are refused and change nothing") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    auto r = cli.Post("/v1/memories",
                      json{{"content", "Fact " + std::to_string(i) + " about owls."},
                           {"user_id", "olga"},
                           {"thread_id", "t" + std::to_string(i)}}
                        .dump(),
                      "application/json");
    ids.push_back(body_of(r)["id"].get<int64_t>());
  }
  REQUIRE(cli.Post("/v1/memories",
                   R"({"content":"Owls of Oslo.","thread_id":"t9"})",
                   "application/json")
            ->status
          == 201);
  // Pages of two, newest first, every entry once.
  std::vector<int64_t> walked;
  std::string path = "/v1/memories/entries?user_id=olga&limit=2";
  for (int pages = 0; pages < 5; ++pages) {
    auto page = body_of(cli.Get(path));
    for (auto& e : page["entries"]) {
      walked.push_back(e["id"].get<int64_t>());
      CHECK(e["user_id"] == "olga");
      CHECK(e["content"].get<std::string>().find("owls") != std::string::npos);
    }
    if (page["next_cursor"].is_null())
      break;
    path = "/v1/memories/entries?user_id=olga&limit=2&cursor="
           + page["next_cursor"].get<std::string>();
  }
  CHECK(walked == std::vector<int64_t>(ids.rbegin(), ids.rend()));
  // Bad requests.
  check_error(cli.Get("/v1/memories/entries?user_id=olga&cursor=abc"), 400,
              "invalid_argument");
  check_error(cli.Get("/v1/memories/entries?user_id=olga&limit=0"), 400,
              "invalid_argument");
  check_error(cli.Get("/v1/memories/entries"), 400, "invalid_argument");
  check_error(cli.Get("/v1/memories/entries?user_id=olga&sort=asc"), 400,
              "unknown_field");
  check_error(cli.Delete("/v1/memories"), 400, "invalid_argument");
  check_error(cli.Delete("/v1/memories?user_id=olga&thread_id=t1"), 400,
              "invalid_argument");
  check_error(cli.Delete("/v1/memories?user_id=../x"), 400, "invalid_id");
  check_error(cli.Delete("/v1/memories/abc"), 400, "invalid_id");
  check_error(cli.Delete("/v1/memories/999999"), 404, "not_found");
  CHECK(body_of(cli.Get("/v1/memories/entries?user_id=olga"))["entries"].size()
        == 5);
  // One entry.
  auto one = cli.Delete("/v1/memories/" + std::to_string(ids[2]));
  CHECK(body_of(one)["deleted"] == true);
  check_error(cli.Delete("/v1/memories/" + std::to_string(ids[2])), 404,
              "not_found");
  auto snippet = body_of(cli.Get("/v1/memories?user_id=olga&thread_id=t1&q=owls"));
  CHECK(snippet["matched"] == 4);
  CHECK(snippet["snippet"].get<std::string>().find("Fact 2 ") == std::string::npos);
  // The whole user.
  auto all = cli.Delete("/v1/memories?user_id=olga");
  CHECK(body_of(all)["deleted"] == 4);
  CHECK(body_of(cli.Get("/v1/memories/entries?user_id=olga"))["entries"].empty());
  CHECK(body_of(cli.Get("/v1/memories?user_id=olga&thread_id=t1&q=owls"))["matched"] == 0);
  // The anonymous entry of t9 stays, and goes by its thread.
  auto anon = body_of(cli.Get("/v1/memories/entries?thread_id=t9"));
  REQUIRE(anon["entries"].size() == 1);
  CHECK(anon["entries"][0]["user_id"].is_null());
  CHECK(body_of(cli.Delete("/v1/memories?thread_id=t9"))["deleted"] == 1);
}

namespace {

// A filesystem of `bytes` mounted (tmpfs) on a new temporary directory,
// unmounted and removed on destruction. Mounting needs root (or
// CAP_SYS_ADMIN), which the test scripts have.
class small_disk {
public:
  explicit small_disk(size_t bytes) {
    auto tmpl = (std::filesystem::temp_directory_path()
                 / "spindle-small-disk-XXXXXX")
                  .string();
    if (::mkdtemp(tmpl.data()) == nullptr)
      FAIL("cannot create a temporary directory: " << std::strerror(errno));
    path_ = tmpl;
    auto opts = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      auto why = std::string{std::strerror(errno)};
      ::rmdir(path_.c_str());
      FAIL("cannot mount a " << bytes << "-byte tmpfs on " << path_ << " ("
           << why << "): the full-disk test needs root");
    }
  }
  ~small_disk() {
    ::umount2(path_.c_str(), MNT_DETACH);
    ::rmdir(path_.c_str());
  }
  small_disk(const small_disk&) = delete;
  small_disk& operator=(const small_disk&) = delete;

  std::filesystem::path path() const {
    return path_;
  }

private:
  std::string path_;
};

} // namespace

TEST_CASE("server: a full disk answers 507 to writes - reads go on - nothing "
          "acknowledged is lost or reissued - writes succeed again once "
          "space is freed") {
  small_disk disk{4u << 20};
  auto data = (disk.path() / "data").string();
  auto filler = disk.path() / "filler";
  {
    // Room for the database and a few dozen messages, then none.
    std::ofstream out{filler, std::ios::binary};
    std::string mib(1u << 20, '\0');
    for (int i = 0; i < 2; ++i)
      out.write(mib.data(), static_cast<std::streamsize>(mib.size()));
    REQUIRE(out.good());
  }
  std::map<std::string, std::vector<int>> acknowledged; // thread -> messages
  std::set<std::string> ids;
  auto check_stored = [&](httplib::Client& cli) {
    for (auto& [thread, sent] : acknowledged) {
      auto r = cli.Get(
        ("/v1/threads/" + thread + "/history?max_turns=100000").c_str());
      REQUIRE(r);
      REQUIRE(r->status == 200);
      std::set<std::string> users;
      auto body = json::parse(r->body);
      for (auto& t : body["turns"])
        if (t["role"] == "user") {
          auto content = t["content"].get<std::string>();
          users.insert(content.substr(0, content.find(' ')));
        }
      for (int n : sent) {
        INFO("thread " << thread << ", message " << n);
        CHECK(users.count(std::to_string(n)) == 1);
      }
    }
  };
  auto new_id = [&](httplib::Client& cli) {
    auto r = cli.Post("/v1/ids", R"({"kind":"context"})", "application/json");
    REQUIRE(r);
    if (r->status == 200) {
      auto id = json::parse(r->body)["id"].get<std::string>();
      INFO(id);
      CHECK(ids.insert(id).second); // never handed out twice
    } else {
      check_error(r, 507, "storage_full");
    }
    return r->status;
  };
  {
    server_process srv{{"--data", data}};
    httplib::Client cli{"127.0.0.1", srv.port()};
    cli.set_read_timeout(30);
    const std::string padding(20000, 'x');
    int full_at = -1;
    for (int n = 0; n < 400 && full_at < 0; ++n) {
      auto thread = "disk-" + std::to_string(n % 4);
      auto r = cli.Post(("/v1/threads/" + thread + "/messages").c_str(),
                        json{{"content", std::to_string(n) + " " + padding}}
                          .dump(),
                        "application/json");
      REQUIRE(r);
      if (r->status == 200) {
        acknowledged[thread].push_back(n);
        new_id(cli);
      } else {
        check_error(r, 507, "storage_full");
        full_at = n;
      }
    }
    INFO(srv.log());
    REQUIRE(full_at > 0); // the disk filled, after some writes
    // Full: every write is refused the same way, reads are served, and
    // the process stays up.
    for (int k = 0; k < 3; ++k) {
      auto r = cli.Post("/v1/threads/disk-0/messages",
                        json{{"content", "refused " + padding}}.dump(),
                        "application/json");
      check_error(r, 507, "storage_full");
    }
    for (int k = 0; k < 50; ++k)
      new_id(cli); // answered from a durable reservation, or 507
    auto health = cli.Get("/healthz");
    REQUIRE(health);
    CHECK(health->status == 200);
    check_stored(cli);
    // Space freed: writes succeed again, without a restart.
    std::filesystem::remove(filler);
    auto r = cli.Post("/v1/threads/disk-0/messages",
                      json{{"content", "1000 after the disk was freed"}}.dump(),
                      "application/json");
    REQUIRE(r);
    INFO(r->body);
    CHECK(r->status == 200);
    acknowledged["disk-0"].push_back(1000);
    CHECK(new_id(cli) == 200);
    check_stored(cli);
    CHECK(srv.stop(SIGTERM) == 0);
  }
  // After a restart: every acknowledged message is there, and no ID is
  // handed out again.
  {
    server_process srv{{"--data", data}};
    httplib::Client cli{"127.0.0.1", srv.port()};
    check_stored(cli);
    for (int k = 0; k < 20; ++k)
      CHECK(new_id(cli) == 200);
    CHECK(srv.stop(SIGTERM) == 0);
  }
  auto check = spindle::test::integrity_check(std::filesystem::path{data}
                                              / "spindle.db");
  CHECK(check == "ok");
}
