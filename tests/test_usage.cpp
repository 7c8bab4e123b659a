// Usage (docs/usage.md): what every exchange spent, counted exactly with
// the tokenizer or taken from the upstream, kept with its assistant turn,
// shown in the reply, the stream's `done`, the history and OpenAI's
// answers, and summed per tenant by GET /v1/usage from counters that
// never read a turn.

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "fake_openai.hpp"
#include "served.hpp"
#include "spindle/runtime/openai_provider.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/runtime/tokenizer.hpp"
#include "support.hpp"
#include "tenant_client.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;
using client = test::tenant_client;

namespace {

runtime_options stored(const test::test_store& store) {
  runtime_options opts;
  store.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  // Without long-term memory a prompt is a function of the thread alone,
  // so the builder can be asked for the same prompt beforehand.
  opts.conversation.memory = false;
  return opts;
}

runtime_options on_fake(const test::test_store& store,
                        const test::fake_openai& fake) {
  auto opts = stored(store);
  auto provider = make_openai_provider(fake.options());
  REQUIRE(provider);
  opts.provider = *provider;
  return opts;
}

server_options tenancy_on() {
  server_options so;
  so.admin_token = test::tenants_admin_token;
  return so;
}

const token_counter& counter() {
  static auto c = make_token_counter("o200k_base");
  return *c;
}

json post(int port, const std::string& path, const json& body,
          int expect = 200) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(30, 0);
  auto r = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  INFO(path << " " << r->body);
  REQUIRE(r->status == expect);
  return json::parse(r->body);
}

json get(int port, const std::string& path) {
  httplib::Client cli{"127.0.0.1", port};
  auto r = cli.Get(path.c_str());
  REQUIRE(r);
  INFO(path << " " << r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

std::string raw_post(int port, const std::string& path, const json& body) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(30, 0);
  auto r = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  return r->body;
}

// The `data:` payloads of an OpenAI stream but its [DONE].
std::vector<json> chunks_of(const std::string& body) {
  std::vector<json> out;
  for (auto& line : test::lines(body))
    if (line.rfind("data: ", 0) == 0 && line != "data: [DONE]")
      out.push_back(json::parse(line.substr(6)));
  return out;
}

json usage(uint64_t prompt, uint64_t completion, const char* source) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"source", source}};
}

// The sums a GET /v1/usage group must show for `usages` (objects of
// `usage`), all of one source.
json figures(const std::vector<json>& usages) {
  uint64_t p = 0, c = 0;
  for (auto& u : usages) {
    p += u["prompt_tokens"].get<uint64_t>();
    c += u["completion_tokens"].get<uint64_t>();
  }
  return {{"exchanges", usages.size()},
          {"prompt_tokens", p},
          {"completion_tokens", c},
          {"total_tokens", p + c}};
}

json zero() {
  return figures({});
}

} // namespace

TEST_CASE("usage: an exchange on the offline provider is counted exactly "
          "with the tokenizer, kept with its turn and shown wherever the "
          "reply is") {
  test::test_store store;
  test::served_runtime s{stored(store)};
  auto& rt = s.rt();
  std::vector<json> seen;
  for (int i = 0; i < 4; ++i) {
    auto message = "Message number " + std::to_string(i)
                   + " asks about the weather in Oslo, Rome and Lima.";
    // The prompt the exchange will send, built first by the read-only
    // builder from the same history: its exact token count.
    auto built = rt.build_context("counted", "alice", message);
    REQUIRE(built);
    auto reply = post(s.port(), "/v1/threads/counted/messages",
                      {{"content", message}, {"user_id", "alice"}});
    auto text = reply["reply"].get<std::string>();
    REQUIRE_FALSE(text.empty());
    INFO(reply.dump());
    CHECK(reply["usage"]
          == usage(built->manifest.total_tokens, counter().count_text(text),
                   "counted"));
    seen.push_back(reply["usage"]);
  }
  // A streamed reply ends with its usage in `done`.
  auto message = std::string{"And the stream?"};
  auto built = rt.build_context("counted", "alice", message);
  REQUIRE(built);
  auto body = raw_post(s.port(), "/v1/threads/counted/messages/stream",
                       {{"content", message}, {"user_id", "alice"}});
  std::string streamed;
  json done;
  for (auto& e : test::sse_events(body)) {
    if (e.type == "delta")
      streamed += e.data["content"].get<std::string>();
    if (e.type == "done")
      done = e.data;
  }
  INFO(body);
  REQUIRE(done.is_object());
  CHECK(done["usage"]
        == usage(built->manifest.total_tokens,
                 counter().count_text(streamed), "counted"));
  seen.push_back(done["usage"]);

  // The history shows each assistant turn's usage, and no other turn's.
  auto history = get(s.port(), "/v1/threads/counted/history");
  std::vector<json> kept;
  for (auto& t : history["turns"]) {
    if (t["role"] == "assistant")
      kept.push_back(t["usage"]);
    else
      CHECK_FALSE(t.contains("usage"));
  }
  CHECK(kept == seen);

  // A turn a client appends is no exchange: it has none.
  post(s.port(), "/v1/threads/counted/turns",
       {{"turns", {{{"role", "assistant"}, {"content", "appended"}}}}});
  history = get(s.port(), "/v1/threads/counted/history");
  CHECK_FALSE(history["turns"].back().contains("usage"));

  // The metrics count the same tokens, by kind and source.
  httplib::Client cli{"127.0.0.1", s.port()};
  auto metrics = cli.Get("/metrics");
  REQUIRE(metrics);
  auto sum = figures(seen);
  CHECK(metrics->body.find(
          "spindle_usage_tokens_total{kind=\"prompt\",source=\"counted\"} "
          + std::to_string(sum["prompt_tokens"].get<uint64_t>()))
        != std::string::npos);
  CHECK(metrics->body.find(
          "spindle_usage_tokens_total{kind=\"completion\",source=\"counted\"} "
          + std::to_string(sum["completion_tokens"].get<uint64_t>()))
        != std::string::npos);
  CHECK(metrics->body.find("spindle_usage_exchanges_total{source=\"counted\"} 5")
        != std::string::npos);
  CHECK(metrics->body.find("spindle_usage_exchanges_total{source=\"upstream\"} 0")
        != std::string::npos);

  // GET /v1/usage without grouping: all five, counted, none upstream.
  auto total = get(s.port(), "/v1/usage");
  REQUIRE(total["data"].size() == 1);
  auto& all = total["data"][0];
  CHECK(all["by_source"]["counted"] == sum);
  CHECK(all["by_source"]["upstream"] == zero());
  CHECK(all["exchanges"] == 5);
  CHECK(all["total_tokens"] == sum["total_tokens"]);
}

TEST_CASE("usage: the upstream's own figures pass through the thread "
          "routes and both OpenAI routes, plain and streamed") {
  test::test_store store;
  test::fake_openai fake;
  fake.set_replies({"An upstream reply."});
  fake.set_usage(123, 45);
  test::served_runtime s{on_fake(store, fake)};

  // Thread routes: the exchange asks for the usage chunk and keeps it.
  auto reply = post(s.port(), "/v1/threads/up/messages",
                    {{"content", "Hello"}});
  CHECK(reply["usage"] == usage(123, 45, "upstream"));
  auto sent = fake.requests().back();
  CHECK(sent["stream"] == true);
  CHECK(sent["stream_options"] == json{{"include_usage", true}});
  auto history = get(s.port(), "/v1/threads/up/history");
  CHECK(history["turns"].back()["usage"] == usage(123, 45, "upstream"));

  json openai_usage{{"prompt_tokens", 123},
                    {"completion_tokens", 45},
                    {"total_tokens", 168}};
  for (bool threaded : {true, false}) {
    INFO((threaded ? "with a thread" : "without a thread"));
    json request{{"model", "test-model"},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    if (threaded)
      request["thread_id"] = "openai-up";
    // Plain: `usage` in the completion.
    auto plain = post(s.port(), "/v1/chat/completions", request);
    CHECK(plain["usage"] == openai_usage);

    // Streamed with include_usage: every chunk carries "usage": null, and
    // a last chunk without choices carries the usage, before [DONE].
    request["stream"] = true;
    request["stream_options"] = {{"include_usage", true}};
    auto body = raw_post(s.port(), "/v1/chat/completions", request);
    auto chunks = chunks_of(body);
    INFO(body);
    REQUIRE(chunks.size() >= 3);
    for (size_t i = 0; i + 1 < chunks.size(); ++i) {
      CHECK(chunks[i].contains("usage"));
      CHECK(chunks[i]["usage"].is_null());
      CHECK(chunks[i]["choices"].size() == 1);
    }
    auto& last = chunks.back();
    CHECK(last["object"] == "chat.completion.chunk");
    CHECK(last["choices"] == json::array());
    CHECK(last["usage"] == openai_usage);
    CHECK(last["id"] == chunks.front()["id"]);
    CHECK(body.rfind("data: [DONE]") != std::string::npos);

    // Streamed without it: no usage anywhere, as OpenAI streams.
    request.erase("stream_options");
    body = raw_post(s.port(), "/v1/chat/completions", request);
    for (auto& c : chunks_of(body)) {
      CHECK_FALSE(c.contains("usage"));
      CHECK(c["choices"].size() == 1);
    }
  }

  // A plain upstream answer's usage is read too.
  fake.set_mode(test::fake_openai::mode::plain);
  reply = post(s.port(), "/v1/threads/up-plain/messages",
               {{"content", "Hello"}});
  CHECK(reply["usage"] == usage(123, 45, "upstream"));

  // The two sources stay apart in GET /v1/usage and the metrics. The
  // calls without a thread count under none, written after their reply.
  json total;
  for (int i = 0; i < 500; ++i) {
    total = get(s.port(), "/v1/usage");
    if (total["data"][0]["exchanges"] == 8)
      break;
    std::this_thread::sleep_for(10ms);
  }
  auto& all = total["data"][0];
  CHECK(all["by_source"]["counted"] == zero());
  CHECK(all["by_source"]["upstream"]["exchanges"] == 8);
  CHECK(all["by_source"]["upstream"]["prompt_tokens"] == 8 * 123);
  CHECK(all["by_source"]["upstream"]["completion_tokens"] == 8 * 45);
  auto threads = get(s.port(), "/v1/usage?group_by=thread");
  bool none_seen = false;
  for (auto& item : threads["data"])
    if (item["thread_id"].is_null()) {
      none_seen = true;
      CHECK(item["exchanges"] == 3);
    }
  CHECK(none_seen);
  httplib::Client cli{"127.0.0.1", s.port()};
  auto metrics = cli.Get("/metrics");
  REQUIRE(metrics);
  // Thread routes 2, OpenAI threaded 3, stateless 3: 8 exchanges.
  CHECK(metrics->body.find(
          "spindle_usage_exchanges_total{source=\"upstream\"} 8")
        != std::string::npos);
}

TEST_CASE("usage: a bad stream_options is refused with 400 naming it and "
          "nothing is stored") {
  test::test_store store;
  test::served_runtime s{stored(store)};
  json base{{"model", "m"},
            {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
            {"thread_id", "opts"},
            {"stream", true}};
  for (auto& [options, param] : std::vector<std::pair<json, std::string>>{
         {"yes", "stream_options"},
         {json::array(), "stream_options"},
         {{{"include_usage", "yes"}}, "stream_options.include_usage"},
         {{{"include_usage", true}, {"bogus", 1}}, "stream_options.bogus"}}) {
    auto body = base;
    body["stream_options"] = options;
    httplib::Client cli{"127.0.0.1", s.port()};
    auto r = cli.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    INFO(options.dump() << " " << r->body);
    CHECK(r->status == 400);
    CHECK(json::parse(r->body)["error"]["param"] == param);
  }
  // Nothing was stored: the thread does not exist.
  httplib::Client cli{"127.0.0.1", s.port()};
  auto missing = cli.Get("/v1/threads/opts");
  REQUIRE(missing);
  CHECK(missing->status == 404);
  // include_obfuscation is accepted (and changes nothing), as OpenAI's.
  auto body = base;
  body["stream_options"] = {{"include_obfuscation", false},
                            {"include_usage", false}};
  auto ok = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(ok->body.find("\"usage\"") == std::string::npos);
}

TEST_CASE("usage: an upstream that reports none is counted, and so is a "
          "stream without a thread") {
  test::test_store store;
  test::fake_openai fake;
  fake.set_replies({"Counted here, not upstream."});
  test::served_runtime s{on_fake(store, fake)};
  auto reply = post(s.port(), "/v1/threads/c/messages", {{"content", "Hi"}});
  CHECK(reply["usage"]["source"] == "counted");
  CHECK(reply["usage"]["completion_tokens"]
        == counter().count_text("Counted here, not upstream."));

  json messages = {{{"role", "system"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", "Hello there"}}};
  auto plain = post(s.port(), "/v1/chat/completions",
                    {{"model", "m"}, {"messages", messages}});
  // 3 per message, its role and content, and 3 for the reply's primer.
  uint64_t prompt = 3 + 3 + 3 + counter().count_text("system")
                    + counter().count_text("Be brief.")
                    + counter().count_text("user")
                    + counter().count_text("Hello there");
  CHECK(plain["usage"]
        == json{{"prompt_tokens", prompt},
                {"completion_tokens",
                 counter().count_text("Counted here, not upstream.")},
                {"total_tokens",
                 prompt + counter().count_text("Counted here, not upstream.")}});
}

TEST_CASE("usage: a cancelled stream is charged the tokens it generated") {
  test::test_store store;
  test::fake_openai fake;
  // 7 characters every 200 ms: long enough to cancel in the middle.
  fake.set_replies({std::string(40, 'x') + " " + std::string(40, 'y') + " "
                    + std::string(40, 'z')});
  fake.set_mode(test::fake_openai::mode::slow);
  fake.set_usage(999, 999); // in the last chunk only: never reached
  test::served_runtime s{on_fake(store, fake)};
  std::atomic<bool> heard{false};
  std::string body;
  std::thread streaming{[&] {
    httplib::Client cli{"127.0.0.1", s.port()};
    cli.set_read_timeout(30, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/threads/cut/messages/stream";
    req.body = json{{"content", "Go on"}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t,
                               uint64_t) {
      body.append(data, n);
      if (body.find("event: delta") != std::string::npos)
        heard = true;
      return true;
    };
    cli.send(req);
  }};
  while (!heard)
    std::this_thread::sleep_for(10ms);
  post(s.port(), "/v1/threads/cut/cancel", json::object());
  streaming.join();
  auto history = get(s.port(), "/v1/threads/cut/history");
  auto& last = history["turns"].back();
  INFO(history.dump());
  REQUIRE(last["role"] == "assistant");
  CHECK(last["interrupted"] == true);
  auto text = last["content"].get<std::string>();
  CHECK(text.size() < 122);
  CHECK_FALSE(text.empty());
  // Counted: the upstream never sent its usage chunk.
  CHECK(last["usage"]["source"] == "counted");
  CHECK(last["usage"]["completion_tokens"] == counter().count_text(text));
  CHECK(last["usage"]["prompt_tokens"].get<uint64_t>() > 0);
  auto total = get(s.port(), "/v1/usage");
  CHECK(total["data"][0]["by_source"]["counted"]["completion_tokens"]
        == counter().count_text(text));
}

TEST_CASE("usage: GET /v1/usage sums a tenant's counters by thread, user "
          "and day, shows nothing of another tenant and refuses bad "
          "input") {
  test::test_store store;
  test::served_runtime s{stored(store), tenancy_on()};
  client admin{s.port(), test::tenants_admin_token};
  auto a = test::make_tenant(admin, "usage-a");
  auto b = test::make_tenant(admin, "usage-b");
  client ka{s.port(), a.key};
  client kb{s.port(), b.key};
  std::map<std::string, std::vector<json>> by_thread, by_user;
  std::vector<json> every;
  auto send = [&](client& c, const std::string& thread,
                  const std::string& user, bool record) {
    json body{{"content", "A question on " + thread}};
    if (!user.empty())
      body["user_id"] = user;
    auto r = c.post("/v1/threads/" + thread + "/messages", body);
    INFO(r.body);
    REQUIRE(r.status == 200);
    auto u = r.parsed()["usage"];
    u.erase("source");
    if (record) {
      by_thread[thread].push_back(u);
      by_user[user].push_back(u);
      every.push_back(u);
    }
  };
  for (int i = 0; i < 3; ++i)
    send(ka, "t1", "alice", true);
  for (int i = 0; i < 2; ++i)
    send(ka, "t2", "bob", true);
  send(ka, "t3", "", true);
  send(kb, "t1", "alice", false); // the other tenant's t1 and alice

  auto ask = [&](client& c, const std::string& query) {
    auto r = c.get("/v1/usage" + query);
    INFO(query << " " << r.body);
    REQUIRE(r.status == 200);
    return r.parsed();
  };
  auto one = [](const json& item) {
    json f = item;
    f.erase("by_source");
    f.erase("thread_id");
    f.erase("user_id");
    f.erase("day");
    return f;
  };
  auto total = ask(ka, "");
  CHECK(total["object"] == "usage");
  CHECK(total["group_by"].is_null());
  REQUIRE(total["data"].size() == 1);
  CHECK(one(total["data"][0]) == figures(every));
  CHECK(total["data"][0]["by_source"]["counted"] == figures(every));

  auto threads = ask(ka, "?group_by=thread");
  REQUIRE(threads["data"].size() == 3);
  for (auto& item : threads["data"]) {
    auto id = item["thread_id"].get<std::string>();
    CHECK(one(item) == figures(by_thread[id]));
  }
  CHECK(threads["data"][0]["thread_id"] == "t1");
  CHECK(threads["has_more"] == false);

  auto users = ask(ka, "?group_by=user");
  REQUIRE(users["data"].size() == 3);
  for (auto& item : users["data"]) {
    auto id = item["user_id"].is_null() ? std::string{}
                                        : item["user_id"].get<std::string>();
    CHECK(one(item) == figures(by_user[id]));
  }

  auto days = ask(ka, "?group_by=day");
  REQUIRE_FALSE(days["data"].empty());
  uint64_t exchanges = 0;
  for (auto& item : days["data"]) {
    CHECK(item["day"].get<std::string>().size() == 10);
    exchanges += item["exchanges"].get<uint64_t>();
  }
  CHECK(exchanges == 6);

  // Filters and pages.
  CHECK(one(ask(ka, "?thread_id=t2")["data"][0]) == figures(by_thread["t2"]));
  CHECK(one(ask(ka, "?user_id=alice")["data"][0])
        == figures(by_user["alice"]));
  auto first = ask(ka, "?group_by=thread&limit=2");
  CHECK(first["data"].size() == 2);
  CHECK(first["has_more"] == true);
  auto rest = ask(ka, "?group_by=thread&limit=2&after=t2");
  REQUIRE(rest["data"].size() == 1);
  CHECK(rest["data"][0]["thread_id"] == "t3");
  CHECK(rest["has_more"] == false);
  // A window before any of it: nothing.
  CHECK(one(ask(ka, "?to=2020-01-01")["data"][0]) == zero());
  CHECK(one(ask(ka, "?from=2020-01-01T00:00:00Z")["data"][0])
        == figures(every));

  // The other tenant sees its own exchange only, even by A's IDs.
  auto theirs = ask(kb, "?group_by=thread");
  REQUIRE(theirs["data"].size() == 1);
  CHECK(theirs["data"][0]["exchanges"] == 1);
  CHECK(ask(kb, "?thread_id=t2")["data"][0]["exchanges"] == 0);
  CHECK(theirs.dump().find(a.id) == std::string::npos);
  // The admin token names a tenant to read its usage.
  client admin_a{s.port(), test::tenants_admin_token, a.id};
  CHECK(one(ask(admin_a, "")["data"][0]) == figures(every));

  // Scopes: a key without usage:read, an end user, the admin in no tenant.
  auto admin_made = admin.post("/v1/tenants/" + a.id + "/keys",
                               {{"scopes", {"threads:read"}}});
  REQUIRE(admin_made.status == 201);
  client k_narrow{s.port(), admin_made.parsed()["key"].get<std::string>()};
  auto refused = k_narrow.get("/v1/usage");
  CHECK(refused.status == 403);
  CHECK(refused.parsed()["error"]["code"] == "permission_denied");
  CHECK(refused.body.find("usage:read") != std::string::npos);
  // An end user's token reaches its own threads and memories only.
  const std::string secret = "a-secret-of-the-usage-tests-0123456789";
  auto set = admin.put("/v1/tenants/" + a.id + "/auth",
                       {{"issuer", "https://id.usage.example"},
                        {"hs256_secret", secret}});
  REQUIRE(set.status == 200);
  client alice{s.port(),
               test::hs256_token(secret,
                                 test::user_claims("https://id.usage.example",
                                                   "", "alice", 300))};
  auto mine = alice.get("/v1/me");
  REQUIRE(mine.status == 200);
  auto user_refused = alice.get("/v1/usage");
  CHECK(user_refused.status == 403);
  CHECK(user_refused.parsed()["error"]["code"] == "permission_denied");
  // The admin token names a tenant to read usage, or it is refused.
  auto no_tenant = admin.get("/v1/usage");
  CHECK(no_tenant.status == 403);
  CHECK(no_tenant.body.find(a.id) == std::string::npos);

  // Bad input: a clear 400 naming the parameter, nothing changed.
  for (auto& [query, param] :
       std::vector<std::pair<std::string, std::string>>{
         {"?group_by=week", "group_by"},
         {"?from=yesterday", "from"},
         {"?to=2026-02-30", "to"},
         {"?from=2026-01-02&to=2026-01-01", "from"},
         {"?limit=0", "limit"},
         {"?limit=10001", "limit"},
         {"?after=t1", "after"},
         {"?group_by=day&after=t1", "after"},
         {"?thread_id=a%20b", "thread_id"},
         {"?limit=many", "limit"},
         {"?bogus=1", "bogus"},
         {"?from=", "from"}}) {
    auto r = ka.get("/v1/usage" + query);
    INFO(query << " " << r.body);
    CHECK(r.status == 400);
    CHECK(r.parsed()["error"]["param"] == param);
  }
  CHECK(one(ask(ka, "")["data"][0]) == figures(every));

  // Deleting a tenant deletes its counters.
  auto gone = admin.call("DELETE", "/v1/tenants/" + b.id + "?force=true");
  REQUIRE(gone.status == 200);
  auto rows = s.rt().usage(usage_query{b.id});
  REQUIRE(rows);
  CHECK(rows->groups.empty());
}

TEST_CASE("usage: the counters hold one row per hour, thread, user and "
          "source however many exchanges a thread has",
          "[sqlite]") {
  test::test_store store;
  test::served_runtime s{stored(store)};
  for (int i = 0; i < 30; ++i)
    post(s.port(), "/v1/threads/long/messages",
         {{"content", "Turn " + std::to_string(i)}, {"user_id", "alice"}});
  auto total = get(s.port(), "/v1/usage?thread_id=long");
  CHECK(total["data"][0]["exchanges"] == 30);
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2((store.path() / "spindle.db").c_str(), &db,
                          SQLITE_OPEN_READONLY, nullptr)
          == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db,
                             "SELECT count(*), sum(exchanges) FROM "
                             "usage_counters WHERE thread_id = 'long';",
                             -1, &stmt, nullptr)
          == SQLITE_OK);
  REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
  // One row, or two when the hour turned during the test.
  CHECK(sqlite3_column_int(stmt, 0) >= 1);
  CHECK(sqlite3_column_int(stmt, 0) <= 2);
  CHECK(sqlite3_column_int(stmt, 1) == 30);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_CASE("usage: concurrent exchanges on shared threads add up exactly in "
          "the counters") {
  test::test_store store;
  test::served_runtime s{stored(store)};
  constexpr int clients = 8;
  constexpr int each = 10;
  std::vector<std::vector<json>> seen(clients);
  std::vector<std::thread> workers;
  for (int c = 0; c < clients; ++c)
    workers.emplace_back([&, c] {
      httplib::Client cli{"127.0.0.1", s.port()};
      cli.set_read_timeout(60, 0);
      for (int i = 0; i < each; ++i) {
        json body{{"content", "Client " + std::to_string(c) + " turn "
                                + std::to_string(i)},
                  {"user_id", "user-" + std::to_string(c % 3)},
                  {"on_conflict", "queue"}};
        auto path = "/v1/threads/shared-" + std::to_string(c % 4)
                    + "/messages";
        auto r = cli.Post(path.c_str(), body.dump(), "application/json");
        if (r && r->status == 200)
          seen[c].push_back(json::parse(r->body)["usage"]);
      }
    });
  for (auto& w : workers)
    w.join();
  std::vector<json> all;
  std::map<std::string, std::vector<json>> by_thread;
  for (int c = 0; c < clients; ++c) {
    CHECK(seen[c].size() == each);
    for (auto u : seen[c]) {
      CHECK(u["source"] == "counted");
      u.erase("source");
      all.push_back(u);
      by_thread["shared-" + std::to_string(c % 4)].push_back(u);
    }
  }
  auto total = get(s.port(), "/v1/usage");
  auto f = total["data"][0];
  f.erase("by_source");
  CHECK(f == figures(all));
  auto threads = get(s.port(), "/v1/usage?group_by=thread");
  REQUIRE(threads["data"].size() == 4);
  for (auto item : threads["data"]) {
    auto id = item["thread_id"].get<std::string>();
    item.erase("by_source");
    item.erase("thread_id");
    CHECK(item == figures(by_thread[id]));
  }
}
