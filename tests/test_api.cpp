// The HTTP API end to end: the real binary on a free loopback port. Every
// route, the documented errors, hostile input, concurrency, streaming, and
// the seed's Trump scenario through the OpenAI-compatible provider.

#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include "fake_openai.hpp"
#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;

namespace {

struct api {
  explicit api(int port) : cli("127.0.0.1", port) {
    cli.set_keep_alive(true);
    cli.set_read_timeout(std::chrono::seconds(30));
  }

  std::pair<int, json> post(const std::string& path, const std::string& body) {
    auto r = cli.Post(path.c_str(), body, "application/json");
    REQUIRE(r);
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> post(const std::string& path, const json& body) {
    return post(path, body.dump());
  }
  std::pair<int, json> get(const std::string& path) {
    auto r = cli.Get(path.c_str());
    REQUIRE(r);
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> del(const std::string& path) {
    auto r = cli.Delete(path.c_str());
    REQUIRE(r);
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  std::string new_thread() {
    auto [status, body] = post("/v1/threads", std::string{"{}"});
    REQUIRE(status == 201);
    return body["thread_id"];
  }

  json history(const std::string& thread, int max_turns = 1000) {
    auto [status, body] = get("/v1/threads/" + thread
                              + "/history?max_turns="
                              + std::to_string(max_turns));
    REQUIRE(status == 200);
    return body;
  }

  httplib::Client cli;
};

void check_error(const std::pair<int, json>& r, int status,
                 const std::string& code) {
  INFO(r.second.dump());
  CHECK(r.first == status);
  REQUIRE(r.second.is_object());
  CHECK(r.second["error"]["code"] == code);
  CHECK_FALSE(r.second["error"]["message"].get<std::string>().empty());
}

// Parses an SSE body into (event, data) pairs.
std::vector<std::pair<std::string, json>> events_of(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  std::string event;
  for (auto& line : spindle::test::lines(body)) {
    if (line.rfind("event: ", 0) == 0)
      event = line.substr(7);
    else if (line.rfind("data: ", 0) == 0)
      out.emplace_back(event, json::parse(line.substr(6)));
  }
  return out;
}

} // namespace

TEST_CASE("api: a conversation through every thread route") {
  server_process srv;
  api a{srv.port()};
  auto t = a.new_thread();
  auto [s1, r1] = a.post("/v1/threads/" + t + "/messages",
                         json{{"content", "Who is Donald Trump?"},
                              {"user_id", "alice"}});
  REQUIRE(s1 == 200);
  CHECK(r1["thread_id"] == t);
  CHECK(r1["turns"] == 2);
  CHECK(r1["reply"].get<std::string>().find("offline provider")
        != std::string::npos);
  auto [s2, r2] = a.post("/v1/threads/" + t + "/messages",
                         json{{"content", "who are his children"},
                              {"user_id", "alice"}});
  REQUIRE(s2 == 200);
  CHECK(r2["turns"] == 4);
  // The offline provider reports what it received: both earlier turns.
  CHECK(r2["reply"].get<std::string>().find("2 history turns")
        != std::string::npos);

  auto h = a.history(t);
  CHECK(h["thread_id"] == t);
  CHECK(h["total_turns"] == 4);
  REQUIRE(h["turns"].size() == 4);
  CHECK(h["turns"][0]["role"] == "user");
  CHECK(h["turns"][0]["content"] == "Who is Donald Trump?");
  CHECK(h["turns"][1]["role"] == "assistant");
  CHECK(h["turns"][2]["content"] == "who are his children");
  CHECK(h["turns"][3]["role"] == "assistant");
  CHECK(h["turns"][0]["timestamp"].is_number_integer());
  CHECK(a.history(t, 2)["turns"].size() == 2);

  auto [sc, ctx] = a.post("/v1/threads/" + t + "/context",
                          json{{"content", "and his wife?"}});
  REQUIRE(sc == 200);
  CHECK(ctx["thread_found"] == true);
  CHECK(ctx["short_term_history"].size() == 4);
  auto& msgs = ctx["messages"];
  CHECK(msgs.front()["role"] == "system");
  CHECK(msgs.back()["role"] == "user");
  CHECK(msgs.back()["content"].get<std::string>().find("and his wife?")
        != std::string::npos);
  CHECK(a.history(t)["total_turns"] == 4); // the build stored nothing

  auto m = a.cli.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("spindle_turns_stored_total 4") != std::string::npos);
  CHECK(m->body.find("spindle_threads 1") != std::string::npos);
  auto [sd, cleared] = a.del("/v1/threads/" + t + "/turns");
  REQUIRE(sd == 200);
  CHECK(cleared["cleared"] == 4);
  CHECK(a.history(t)["total_turns"] == 0);
}

TEST_CASE("api: thread 'new' creates a thread - unknown threads are 404 on "
          "reads and never created") {
  server_process srv;
  api a{srv.port()};
  auto [s, r] = a.post("/v1/threads/new/messages", json{{"content", "hi"}});
  REQUIRE(s == 200);
  CHECK(r["created"] == true);
  auto t = r["thread_id"].get<std::string>();
  CHECK(t.size() == 36);
  CHECK(a.history(t)["total_turns"] == 2);

  check_error(a.get("/v1/threads/ghost/history"), 404, "not_found");
  check_error(a.del("/v1/threads/ghost/turns"), 404, "not_found");
  auto [sc, ctx] = a.post("/v1/threads/ghost/context",
                          json{{"content", "hello"}});
  REQUIRE(sc == 200);
  CHECK(ctx["thread_found"] == false);
  CHECK(ctx["short_term_history"].empty());
  check_error(a.get("/v1/threads/ghost/history"), 404, "not_found");
}

TEST_CASE("api: context items: add with evictions, list, render") {
  server_process srv;
  api a{srv.port()};
  std::vector<std::string> ids;
  for (int i = 0; i < 52; ++i) {
    auto [s, r] = a.post("/v1/threads/w/items",
                         json{{"type", "text"},
                              {"content", "note " + std::to_string(i)}});
    REQUIRE(s == 201);
    ids.push_back(r["item"]["id"]);
    if (i < 50)
      CHECK(r["evicted"].empty());
    else
      CHECK(r["evicted"] == json::array({ids[i - 50]}));
  }
  auto [sl, list] = a.get("/v1/threads/w/items?limit=3");
  REQUIRE(sl == 200);
  REQUIRE(list["items"].size() == 3);
  CHECK(list["items"][2]["id"] == ids.back());
  auto item = a.post("/v1/threads/w/items",
                     json{{"type", "code"},
                          {"content", "(defun f () 1)"},
                          {"metadata", {{"filename", "f.lisp"},
                                        {"start_line", 3},
                                        {"end_line", 4}}}});
  REQUIRE(item.first == 201);
  CHECK(item.second["item"].size() == 5);
  auto md = a.cli.Get("/v1/threads/w/items/render?limit=1");
  REQUIRE(md);
  CHECK(md->status == 200);
  CHECK(md->get_header_value("Content-Type").find("text/markdown")
        != std::string::npos);
  CHECK(md->body == "### Code\n#### f.lisp:3-4\n```lisp\n(defun f () 1)\n```\n");
  check_error(a.post("/v1/threads/w/items", json{{"type", "video"},
                                                 {"content", "x"}}),
              400, "invalid_argument");
  check_error(a.post("/v1/threads/w/items",
                     json{{"content", "x"}, {"id", "ctx-1"}}),
              400, "unknown_field");
  check_error(a.post("/v1/threads/w/items",
                     json{{"content", "x"},
                          {"metadata", {{"start_line", 5}, {"end_line", 2}}}}),
              400, "invalid_argument");
  check_error(a.get("/v1/threads/w/items?limit=0"), 400, "invalid_argument");
  CHECK(a.get("/v1/threads/w/items").second["items"].size() == 50);
  auto m = a.cli.Get("/metrics");
  REQUIRE(m);
  CHECK(m->body.find("spindle_context_evictions_total 3") != std::string::npos);
}

TEST_CASE("api: memories are stored and retrieved within the user's scope") {
  server_process srv;
  api a{srv.port()};
  REQUIRE(a.post("/v1/memories", json{{"content", "Alice plays chess on "
                                                  "Sundays."},
                                      {"user_id", "alice"}})
            .first
          == 201);
  REQUIRE(a.post("/v1/memories", json{{"content", "Bob plays chess too."},
                                      {"user_id", "bob"}})
            .first
          == 201);
  auto [s, r] = a.get("/v1/memories?user_id=alice&thread_id=t1&q=chess");
  REQUIRE(s == 200);
  CHECK(r["snippet"].get<std::string>().find("Alice") != std::string::npos);
  CHECK(r["snippet"].get<std::string>().find("Bob") == std::string::npos);
  check_error(a.post("/v1/memories", json{{"content", "orphan"}}), 400,
              "malformed");
  check_error(a.get("/v1/memories?user_id=alice&thread_id=t1&q=x&max_chars=9999"),
              400, "invalid_argument");
  check_error(a.get("/v1/memories?user=alice"), 400, "unknown_field");
}

TEST_CASE("api: orchestration routes follow deepest-leaf-first and refuse "
          "illegal moves") {
  server_process srv;
  api a{srv.port()};
  auto [so, orch] = a.post("/v1/orchestrations",
                           json{{"payload", {{"goal", "demo"}}}});
  REQUIRE(so == 201);
  CHECK(orch["id"] == "0001");
  CHECK(a.post("/v1/tasks/0001/subtasks", json{{"payload", "t1"}}).second["id"]
        == "0001_t1");
  CHECK(a.post("/v1/tasks/0001/subtasks", json{{"payload", "t2"}}).second["id"]
        == "0001_t2");
  CHECK(a.post("/v1/tasks/0001_t1/subtasks", json{{"payload", "t1.1"}})
          .second["id"]
        == "0001_t1.1");
  std::vector<std::string> order;
  while (true) {
    auto r = a.cli.Post("/v1/tasks/claim", R"({"worker":"w"})",
                        "application/json");
    REQUIRE(r);
    if (r->status == 204)
      break;
    REQUIRE(r->status == 200);
    auto task = json::parse(r->body);
    CHECK(task["state"] == "running");
    order.push_back(task["id"]);
    CHECK(task["lease"]["token"].get<std::string>().size() == 32);
    auto [sc, done] = a.post("/v1/tasks/" + order.back() + "/complete",
                             json{{"result", {{"ok", true}}},
                                  {"lease", task["lease"]["token"]}});
    REQUIRE(sc == 200);
    CHECK(done["state"] == "completed");
    CHECK(done["result"] == json{{"ok", true}});
  }
  CHECK(order == std::vector<std::string>{"0001_t1.1", "0001_t2", "0001_t1",
                                          "0001"});
  auto [st, tree] = a.get("/v1/orchestrations/0001");
  REQUIRE(st == 200);
  CHECK(tree["tasks"].size() == 4);
  CHECK(tree["tasks"][0]["payload"] == json{{"goal", "demo"}});
  for (auto& t : tree["tasks"])
    CHECK(t["state"] == "completed");
  check_error(a.post("/v1/tasks/0001/complete", json{{"result", 1}}), 409,
              "conflict");
  check_error(a.post("/v1/tasks/0001_t2/subtasks", json{{"payload", "late"}}),
              409, "conflict");
  check_error(a.get("/v1/orchestrations/0009"), 404, "not_found");
  check_error(a.get("/v1/orchestrations/..x"), 400, "invalid_id");
  check_error(a.post("/v1/tasks/0042/subtasks", json{{"payload", 1}}), 404,
              "not_found");
  check_error(a.post("/v1/tasks/claim", json{{"worker", 7}}), 400,
              "malformed");
  auto fail_orch = a.post("/v1/orchestrations", json{{"payload", "f"}});
  auto claimed = a.post("/v1/tasks/claim", json{{"worker", "w"}});
  REQUIRE(claimed.first == 200);
  auto [sf, failed] = a.post("/v1/tasks/" + claimed.second["id"].get<std::string>()
                               + "/fail",
                             json{{"reason", "broken"},
                                  {"lease", claimed.second["lease"]["token"]}});
  REQUIRE(sf == 200);
  CHECK(failed["state"] == "failed");
  CHECK(failed["reason"] == "broken");
}

TEST_CASE("api: hostile and malformed input gets clear errors, the server "
          "stays up and nothing stored changes") {
  server_process srv{{"--body-limit", "4096"}};
  api a{srv.port()};
  auto t = a.new_thread();
  REQUIRE(a.post("/v1/threads/" + t + "/messages", json{{"content", "hi"}})
            .first
          == 200);
  REQUIRE(a.post("/v1/threads/" + t + "/items", json{{"content", "x"}}).first
          == 201);
  auto before = a.history(t);

  struct bad {
    std::string method, path, body;
    int status;
    std::string code;
  };
  std::string long_id(10000, 'a');
  std::vector<bad> cases{
    {"POST", "/v1/threads/" + t + "/messages", "", 400, "malformed"},
    {"POST", "/v1/threads/" + t + "/messages", "{", 400, "malformed"},
    {"POST", "/v1/threads/" + t + "/messages", R"({"content":"x")", 400,
     "malformed"},
    {"POST", "/v1/threads/" + t + "/messages", "[]", 400, "malformed"},
    {"POST", "/v1/threads/" + t + "/messages", R"({"content":42})", 400,
     "malformed"},
    {"POST", "/v1/threads/" + t + "/messages", R"({"content":null})", 400,
     "malformed"},
    {"POST", "/v1/threads/" + t + "/messages", "{\"content\":\"\xc3\x28\"}",
     400, "malformed"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":"x","on_conflict":"panic"})", 400, "invalid_argument"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":"x","max_turns":0})", 400, "invalid_argument"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":"x","max_turns":1})", 400, "invalid_argument"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":"x","max_turns":-1})", 400, "invalid_argument"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":"x","max_turns":"x"})", 400, "malformed"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":"x","colour":"red"})", 400, "unknown_field"},
    {"POST", "/v1/threads/" + t + "/messages",
     R"({"content":")" + std::string(5000, 'x') + "\"}", 413, "too_large"},
    {"POST", "/v1/threads/../messages", R"({"content":"x"})", 400,
     "invalid_id"},
    {"POST", "/v1/threads/a%2Fb/messages", R"({"content":"x"})", 404,
     "not_found"},
    {"POST", "/v1/threads/" + long_id + "/messages", R"({"content":"x"})",
     414, "too_large"},
    {"POST", "/v1/threads/" + std::string(129, 'a') + "/messages",
     R"({"content":"x"})", 400, "invalid_id"},
    {"POST", "/v1/threads/a%20b/messages", R"({"content":"x"})", 400,
     "invalid_id"},
    {"GET", "/v1/threads/" + t + "/history?max_turns=0", "", 400,
     "invalid_argument"},
    {"GET", "/v1/threads/" + t + "/history?max_turns=1", "", 400,
     "invalid_argument"},
    {"GET", "/v1/threads/" + t + "/history?max_turns=-1", "", 400,
     "invalid_argument"},
    {"GET", "/v1/threads/" + t + "/history?max_turns=x", "", 400,
     "invalid_argument"},
    {"GET", "/v1/threads/../history", "", 400, "invalid_id"},
    {"GET", "/v1/threads/new/history", "", 400, "invalid_id"},
    {"POST", "/v1/threads/" + t + "/items", R"({"type":"hologram","content":"x"})",
     400, "invalid_argument"},
    {"POST", "/v1/threads/" + t + "/items", R"({"content":5})", 400,
     "malformed"},
    {"POST", "/v1/threads/" + t + "/items", R"({"content":"x","metadata":[]})",
     400, "malformed"},
    {"DELETE", "/v1/threads/../turns", "", 400, "invalid_id"},
  };
  for (auto& c : cases) {
    INFO(c.method << " " << c.path.substr(0, 80) << " " << c.body.substr(0, 80));
    httplib::Client fresh{"127.0.0.1", srv.port()};
    httplib::Result r = c.method == "GET"
                          ? fresh.Get(c.path.c_str())
                        : c.method == "DELETE"
                          ? fresh.Delete(c.path.c_str())
                          : fresh.Post(c.path.c_str(), c.body,
                                       "application/json");
    REQUIRE(r);
    check_error({r->status, json::parse(r->body, nullptr, false)}, c.status,
                c.code);
  }
  CHECK(a.history(t) == before);
  CHECK(a.get("/v1/threads/" + t + "/items").second["items"].size() == 1);
  CHECK(a.get("/healthz").first == 200);
}

TEST_CASE("api: 32 concurrent clients x 50 messages on 8 threads: exact "
          "turn counts, user/assistant order kept") {
  server_process srv;
  constexpr int clients = 32, per_client = 50, threads = 8;
  std::vector<std::thread> workers;
  std::mutex mx;
  std::vector<std::string> failures;
  for (int c = 0; c < clients; ++c)
    workers.emplace_back([&, c] {
      api a{srv.port()};
      auto thread = "load-" + std::to_string(c % threads);
      for (int i = 0; i < per_client; ++i) {
        auto r = a.cli.Post(("/v1/threads/" + thread + "/messages").c_str(),
                            json{{"content", "c" + std::to_string(c) + " m"
                                               + std::to_string(i)}}
                              .dump(),
                            "application/json");
        if (!r || r->status != 200) {
          std::lock_guard<std::mutex> guard{mx};
          failures.push_back(r ? r->body : "transport");
        }
      }
    });
  for (auto& w : workers)
    w.join();
  for (auto& f : failures)
    UNSCOPED_INFO(f);
  REQUIRE(failures.empty());
  api a{srv.port()};
  for (int t = 0; t < threads; ++t) {
    auto h = a.history("load-" + std::to_string(t), 100000);
    CHECK(h["total_turns"] == clients / threads * per_client * 2);
    auto& turns = h["turns"];
    REQUIRE(turns.size() == clients / threads * per_client * 2);
    std::map<std::string, int> next_of_client;
    for (size_t i = 0; i < turns.size(); ++i) {
      REQUIRE(turns[i]["role"] == (i % 2 == 0 ? "user" : "assistant"));
      if (i % 2 == 0) {
        // Each client's messages appear in the order it sent them.
        auto text = turns[i]["content"].get<std::string>();
        auto client = text.substr(0, text.find(' '));
        auto n = std::stoi(text.substr(text.find('m') + 1));
        CHECK(n == next_of_client[client]++);
        // The reply right after answers this very message.
        CHECK(turns[i + 1]["content"].get<std::string>().find(text)
              != std::string::npos);
      }
    }
  }
}

TEST_CASE("api: streamed replies: thread first, deltas, then the stored "
          "turn count") {
  server_process srv;
  api a{srv.port()};
  auto r = a.cli.Post("/v1/threads/new/messages/stream",
                      R"({"content":"stream this"})", "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(r->get_header_value("Content-Type").find("text/event-stream")
        != std::string::npos);
  auto events = events_of(r->body);
  REQUIRE(events.size() >= 3);
  CHECK(events.front().first == "thread");
  auto t = events.front().second["thread_id"].get<std::string>();
  CHECK(events.back().first == "done");
  CHECK(events.back().second["turns"] == 2);
  CHECK(events.back().second["thread_id"] == t);
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    CHECK(events[i].first == "delta");
    text += events[i].second["content"].get<std::string>();
  }
  auto h = a.history(t);
  REQUIRE(h["turns"].size() == 2);
  CHECK(h["turns"][1]["content"] == text);
  // Errors before anything streamed are plain JSON errors.
  auto bad = a.cli.Post("/v1/threads/../messages/stream", R"({"content":"x"})",
                        "application/json");
  REQUIRE(bad);
  CHECK(bad->status == 400);
}

TEST_CASE("api: a client that goes away mid-stream leaves the partial reply "
          "stored and marked interrupted") {
  server_process srv{{"--llm-delta-delay-ms", "300"}};
  {
    httplib::Client cli{"127.0.0.1", srv.port()};
    int deltas = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/threads/gone/messages/stream";
    req.body = R"({"content":"tell me a long story"})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t size, uint64_t,
                               uint64_t) {
      std::string chunk{data, size};
      if (chunk.find("event: delta") != std::string::npos)
        ++deltas;
      return deltas < 1; // hang up after the first delta
    };
    cli.send(req);
  }
  api a{srv.port()};
  json h;
  for (int i = 0; i < 100; ++i) {
    h = a.history("gone");
    if (h["turns"].size() == 2)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(h["turns"].size() == 2);
  CHECK(h["turns"][0]["content"] == "tell me a long story");
  CHECK(h["turns"][1]["interrupted"] == true);
  CHECK_FALSE(h["turns"][1]["content"].get<std::string>().empty());
}

TEST_CASE("api: the OpenAI provider sees the Trump scenario in order: system, "
          "memory, both earlier turns, then the new message") {
  spindle::test::fake_openai fake;
  // The first message has nothing to resolve (no history, no memory that
  // matches it): no rewrite is asked. The second is rewritten by the
  // rewrite model (its empty answer falls back to the original).
  fake.set_replies({"Donald Trump is the 45th and 47th US president.", "",
                    "He has five children: Donald Jr., Ivanka, Eric, "
                    "Tiffany and Barron."});
  server_process srv{{"--llm", "openai", "--llm-url", fake.url(),
                      "--llm-model", "fake-model", "--rewrite-model",
                      "fake-small"},
                     {{"SPINDLE_LLM_API_KEY", "sk-fake"}}};
  api a{srv.port()};
  REQUIRE(a.post("/v1/memories", json{{"content", "The user is researching "
                                                  "famous families and "
                                                  "their children."},
                                      {"user_id", "u1"}})
            .first
          == 201);
  auto t = a.new_thread();
  auto [s1, r1] = a.post("/v1/threads/" + t + "/messages",
                         json{{"content", "Who is Donald Trump?"},
                              {"user_id", "u1"}});
  REQUIRE(s1 == 200);
  CHECK(r1["reply"] == "Donald Trump is the 45th and 47th US president.");
  auto [s2, r2] = a.post("/v1/threads/" + t + "/messages",
                         json{{"content", "who are his children"},
                              {"user_id", "u1"}});
  REQUIRE(s2 == 200);
  CHECK(r2["reply"].get<std::string>().find("Ivanka") != std::string::npos);

  // Requests: answer 1, rewrite 2, answer 2.
  auto reqs = fake.requests();
  REQUIRE(reqs.size() == 3);
  CHECK(reqs[0]["model"] == "fake-model");
  CHECK(reqs[1]["model"] == "fake-small");
  CHECK(reqs[2]["model"] == "fake-model");
  CHECK(fake.auth_headers()[2] == "Bearer sk-fake");
  auto& m = reqs[2]["messages"];
  INFO(m.dump(2));
  REQUIRE(m.size() == 5);
  CHECK(m[0]["role"] == "system");
  CHECK(m[1]["role"] == "system");
  CHECK(m[1]["content"].get<std::string>().rfind("Long-term memory:\n", 0) == 0);
  CHECK(m[1]["content"].get<std::string>().find("their children")
        != std::string::npos);
  CHECK(m[2] == json{{"role", "user"}, {"content", "Who is Donald Trump?"}});
  CHECK(m[3] == json{{"role", "assistant"},
                     {"content", "Donald Trump is the 45th and 47th US "
                                 "president."}});
  CHECK(m[4]["role"] == "user");
  CHECK(m[4]["content"] == "who are his children");
}

TEST_CASE("api: an upstream failure is a 502 carrying its message, and the "
          "user turn stays stored") {
  spindle::test::fake_openai fake;
  fake.set_mode(spindle::test::fake_openai::mode::error);
  server_process srv{{"--llm", "openai", "--llm-url", fake.url(),
                      "--llm-model", "m"}};
  api a{srv.port()};
  auto r = a.post("/v1/threads/up/messages", json{{"content", "hello?"}});
  check_error(r, 502, "upstream_failure");
  CHECK(r.second["error"]["message"].get<std::string>().find(
          "model is overloaded")
        != std::string::npos);
  auto h = a.history("up");
  REQUIRE(h["turns"].size() == 1);
  CHECK(h["turns"][0]["role"] == "user");
  CHECK(h["turns"][0]["content"] == "hello?");
}

TEST_CASE("api: SIGTERM lets an in-flight exchange finish and store its "
          "reply before exiting 0") {
  server_process srv{{"--llm-delta-delay-ms", "200"}};
  std::thread sender{[&] {
    httplib::Client cli{"127.0.0.1", srv.port()};
    cli.set_read_timeout(std::chrono::seconds(30));
    auto r = cli.Post("/v1/threads/inflight/messages",
                      R"({"content":"slow one"})", "application/json");
    CHECK(r);
    if (r)
      CHECK(r->status == 200);
  }};
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(srv.stop(SIGTERM) == 0);
  sender.join();
  CHECK(srv.log().find("route=\"POST /v1/threads/{id}/messages\" status=200")
        != std::string::npos);
}
