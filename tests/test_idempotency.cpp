// Idempotent retries on spindle serve: a request retried with the same
// Idempotency-Key and body gets the first answer and stores nothing again,
// also while the first still runs, also after a restart; another body with
// the key is refused; error answers are not kept; keys expire.

#include <atomic>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;
using spindle::test::test_store;

namespace {

httplib::Headers keyed(const std::string& key) {
  return {{"Idempotency-Key", key}};
}

httplib::Result post(httplib::Client& cli, const std::string& path,
                     const json& body, const std::string& key) {
  return cli.Post(path, keyed(key), body.dump(), "application/json");
}

size_t turns_of(httplib::Client& cli, const std::string& thread) {
  auto h = cli.Get("/v1/threads/" + thread + "/history");
  REQUIRE(h);
  if (h->status == 404)
    return 0;
  REQUIRE(h->status == 200);
  return json::parse(h->body)["turns"].size();
}

} // namespace

TEST_CASE("idempotency: a retried message with the same key gets the first "
          "answer and stores no turn again") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  json body{{"content", "Remember the milk."}};
  auto first = post(cli, "/v1/threads/shop/messages", body, "k-1");
  REQUIRE(first);
  REQUIRE(first->status == 200);
  CHECK_FALSE(first->has_header("Idempotent-Replayed"));
  auto again = post(cli, "/v1/threads/shop/messages", body, "k-1");
  REQUIRE(again);
  CHECK(again->status == 200);
  CHECK(again->body == first->body);
  CHECK(again->get_header_value("Idempotent-Replayed") == "true");
  CHECK(turns_of(cli, "shop") == 2);
  // Without a key, or with another, the message is sent again.
  auto unkeyed = cli.Post("/v1/threads/shop/messages", body.dump(),
                          "application/json");
  REQUIRE(unkeyed);
  CHECK(unkeyed->status == 200);
  auto other = post(cli, "/v1/threads/shop/messages", body, "k-2");
  REQUIRE(other);
  CHECK(other->status == 200);
  CHECK(turns_of(cli, "shop") == 6);
  // "new" threads: the retry names the thread the first answer made.
  auto made = post(cli, "/v1/threads/new/messages", body, "k-new");
  auto remade = post(cli, "/v1/threads/new/messages", body, "k-new");
  REQUIRE(made);
  REQUIRE(remade);
  CHECK(json::parse(made->body)["thread_id"]
        == json::parse(remade->body)["thread_id"]);
}

TEST_CASE("idempotency: 100 clients sending the same message with the same "
          "key at once store one exchange and all get its reply") {
  // Each reply takes a while, so the retries arrive while it runs.
  server_process srv{{"--llm-delta-delay-ms", "50", "--http-workers", "32"}};
  constexpr int clients = 100;
  std::vector<std::string> bodies(clients);
  std::vector<int> statuses(clients, 0);
  std::vector<std::thread> pool;
  for (int i = 0; i < clients; ++i)
    pool.emplace_back([&, i] {
      httplib::Client cli{"127.0.0.1", srv.port()};
      cli.set_read_timeout(std::chrono::seconds(30));
      auto r = post(cli, "/v1/threads/crowd/messages",
                    {{"content", "Only once, please."}}, "crowd-key");
      if (r) {
        statuses[i] = r->status;
        bodies[i] = r->body;
      }
    });
  for (auto& t : pool)
    t.join();
  for (int i = 0; i < clients; ++i) {
    INFO("client " << i);
    CHECK(statuses[i] == 200);
    CHECK(bodies[i] == bodies[0]);
  }
  httplib::Client cli{"127.0.0.1", srv.port()};
  CHECK(turns_of(cli, "crowd") == 2);
}

TEST_CASE("idempotency: the same key with another body or path is 422 and "
          "runs nothing - a bad key is 400") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  REQUIRE(post(cli, "/v1/threads/a/messages", {{"content", "one"}}, "dup")
            ->status
          == 200);
  for (auto& [path, body] :
       std::vector<std::pair<std::string, json>>{
         {"/v1/threads/a/messages", {{"content", "two"}}},
         {"/v1/threads/b/messages", {{"content", "one"}}}}) {
    auto r = post(cli, path, body, "dup");
    REQUIRE(r);
    INFO(r->body);
    CHECK(r->status == 422);
    auto e = json::parse(r->body)["error"];
    CHECK(e["code"] == "idempotency_mismatch");
    CHECK(e["param"] == "Idempotency-Key");
  }
  CHECK(turns_of(cli, "a") == 2);
  CHECK(turns_of(cli, "b") == 0);
  for (auto* bad : {"", "has space", "tab\tkey"}) {
    auto r = post(cli, "/v1/threads/c/messages", {{"content", "x"}}, bad);
    REQUIRE(r);
    INFO(r->body);
    CHECK(r->status == 400);
    CHECK(json::parse(r->body)["error"]["param"] == "Idempotency-Key");
  }
  auto r = post(cli, "/v1/threads/c/messages", {{"content", "x"}},
                std::string(256, 'k'));
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(turns_of(cli, "c") == 0);
}

TEST_CASE("idempotency: an error answer is not kept - the retry runs again") {
  server_process srv{{"--llm-delta-delay-ms", "200"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  // A message holds the thread; a keyed one with on_conflict exit is 409.
  std::thread holder([&] {
    httplib::Client other{"127.0.0.1", srv.port()};
    other.set_read_timeout(std::chrono::seconds(30));
    other.Post("/v1/threads/busy/messages", R"({"content":"slow"})",
               "application/json");
  });
  json body{{"content", "now?"}, {"on_conflict", "exit"}};
  // Wait (without a key) until the holder has the thread: a keyed message
  // that came first would run, and its answer would be kept.
  int probe = 0;
  for (int i = 0; i < 400 && probe != 409; ++i) {
    auto r = cli.Post("/v1/threads/busy/messages", body.dump(),
                      "application/json");
    REQUIRE(r);
    probe = r->status;
    if (probe != 409)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(probe == 409);
  auto refused = post(cli, "/v1/threads/busy/messages", body, "retry-me");
  REQUIRE(refused);
  auto status = refused->status;
  holder.join();
  REQUIRE(status == 409);
  // The thread is free now: the same key runs the message.
  auto r = post(cli, "/v1/threads/busy/messages", body, "retry-me");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK_FALSE(r->has_header("Idempotent-Replayed"));
}

TEST_CASE("idempotency: a streamed reply is replayed whole - items memories "
          "orchestrations and chat completions honour the key too") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto stream = post(cli, "/v1/threads/s/messages/stream",
                     {{"content", "Stream it."}}, "stream-key");
  auto restream = post(cli, "/v1/threads/s/messages/stream",
                       {{"content", "Stream it."}}, "stream-key");
  REQUIRE(stream);
  REQUIRE(restream);
  CHECK(stream->status == 200);
  CHECK(restream->body == stream->body);
  CHECK(restream->body.find("event: done") != std::string::npos);
  CHECK(restream->get_header_value("Content-Type").rfind("text/event-stream",
                                                         0)
        == 0);
  CHECK(turns_of(cli, "s") == 2);

  json item{{"type", "text"}, {"content", "a note"}};
  auto i1 = post(cli, "/v1/threads/s/items", item, "item-key");
  auto i2 = post(cli, "/v1/threads/s/items", item, "item-key");
  REQUIRE(i1);
  REQUIRE(i2);
  CHECK(i1->status == 201);
  CHECK(i2->body == i1->body);
  auto items = cli.Get("/v1/threads/s/items");
  REQUIRE(items);
  CHECK(json::parse(items->body)["items"].size() == 1);

  json memory{{"content", "Zebras are striped."}, {"user_id", "zoe"}};
  auto m1 = post(cli, "/v1/memories", memory, "mem-key");
  auto m2 = post(cli, "/v1/memories", memory, "mem-key");
  REQUIRE(m1);
  REQUIRE(m2);
  CHECK(m2->body == m1->body);
  auto found = cli.Get("/v1/memories?user_id=zoe&thread_id=t&q=zebras");
  REQUIRE(found);
  CHECK(json::parse(found->body)["matched"] == 1);

  json orchestration{{"payload", "build it"}};
  auto o1 = post(cli, "/v1/orchestrations", orchestration, "orch-key");
  auto o2 = post(cli, "/v1/orchestrations", orchestration, "orch-key");
  REQUIRE(o1);
  REQUIRE(o2);
  CHECK(json::parse(o1->body)["id"] == "0001");
  CHECK(o2->body == o1->body);
  auto o3 = cli.Post("/v1/orchestrations", orchestration.dump(),
                     "application/json");
  REQUIRE(o3);
  CHECK(json::parse(o3->body)["id"] == "0002"); // no ID was spent on o2

  json chat{{"model", "m"},
            {"messages", {{{"role", "user"}, {"content", "hi"}}}},
            {"thread_id", "c"}};
  auto c1 = post(cli, "/v1/chat/completions", chat, "chat-key");
  auto c2 = post(cli, "/v1/chat/completions", chat, "chat-key");
  REQUIRE(c1);
  REQUIRE(c2);
  CHECK(c2->body == c1->body);
  CHECK(turns_of(cli, "c") == 2);
}

TEST_CASE("idempotency: answers survive a restart and expire after the "
          "retention time",
          "[store]") {
  test_store dir;
  auto args = dir.serve_flags();
  args.insert(args.end(), {"--idempotency-retention", "2"});
  std::string first;
  {
    server_process srv{args};
    httplib::Client cli{"127.0.0.1", srv.port()};
    auto r = post(cli, "/v1/threads/kept/messages", {{"content", "hello"}},
                  "restart-key");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    first = r->body;
    CHECK(srv.stop(SIGTERM) == 0);
  }
  server_process srv{args};
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto again = post(cli, "/v1/threads/kept/messages", {{"content", "hello"}},
                    "restart-key");
  REQUIRE(again);
  CHECK(again->body == first);
  CHECK(again->get_header_value("Idempotent-Replayed") == "true");
  CHECK(turns_of(cli, "kept") == 2);
  auto metrics = cli.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("spindle_idempotency_keys 1\n") != std::string::npos);
  // Past the retention time the key is free: the message runs again.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto late = post(cli, "/v1/threads/kept/messages", {{"content", "hello"}},
                   "restart-key");
  REQUIRE(late);
  CHECK(late->status == 200);
  CHECK_FALSE(late->has_header("Idempotent-Replayed"));
  CHECK(turns_of(cli, "kept") == 4);
}
