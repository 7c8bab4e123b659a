// Limits per tenant over HTTP (docs/limits.md): requests and tokens per
// minute with OpenAI's x-ratelimit-* headers and 429 rate_limited with
// Retry-After, nothing stored for a refused call; calls at once with a
// queue in arrival order; the limits of a tenant set, changed and checked
// through the tenant routes and carried to every process of a store.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "admission/limiter.hpp"
#include "admission/upstream.hpp"
#include "llm_doubles.hpp"
#include "served.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"
#include "tenancy/tenant_store.hpp"
#include "tenant_client.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

// Holds every call until the test lets it go, one at a time, and records
// the order the calls arrived in and the max_tokens each was sent with.
class turnstile_provider : public llm_provider {
public:
  std::string name() const override {
    return "turnstile";
  }

  caf::expected<completion> complete(const prompt& messages,
                                     const completion_options& options,
                                     const delta_callback& on_delta) override {
    std::unique_lock<std::mutex> lock{mx_};
    arrived_.push_back(std::string{messages.back().content});
    max_tokens_.push_back(options.max_tokens);
    auto me = arrived_.size();
    cv_.notify_all();
    cv_.wait_for(lock, 20s, [&] { return open_ || let_go_ >= me; });
    lock.unlock();
    completion out{"ok", false};
    if (on_delta && !on_delta("ok"))
      out.interrupted = true;
    return out;
  }

  /// Lets the next held call go.
  void let_one_go() {
    std::lock_guard<std::mutex> guard{mx_};
    ++let_go_;
    cv_.notify_all();
  }
  void open() {
    std::lock_guard<std::mutex> guard{mx_};
    open_ = true;
    cv_.notify_all();
  }
  bool wait_arrived(size_t n) {
    std::unique_lock<std::mutex> lock{mx_};
    return cv_.wait_for(lock, 10s, [&] { return arrived_.size() >= n; });
  }
  std::vector<std::string> arrived() {
    std::lock_guard<std::mutex> guard{mx_};
    return arrived_;
  }
  std::vector<uint32_t> max_tokens() {
    std::lock_guard<std::mutex> guard{mx_};
    return max_tokens_;
  }

  struct opener {
    turnstile_provider& p;
    ~opener() {
      p.open();
    }
  };

private:
  std::mutex mx_;
  std::condition_variable cv_;
  std::vector<std::string> arrived_;
  std::vector<uint32_t> max_tokens_;
  size_t let_go_ = 0;
  bool open_ = false;
};

runtime_options with(std::shared_ptr<llm_provider> provider) {
  runtime_options ro;
  ro.provider = std::move(provider);
  ro.conversation.memory = false;
  return ro;
}

httplib::Result call(int port, const std::string& method,
                     const std::string& path, const json& body = nullptr,
                     const std::string& token = {}) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(30, 0);
  httplib::Headers h;
  if (!token.empty())
    h.emplace("Authorization", "Bearer " + token);
  auto text = body.is_null() ? std::string{} : body.dump();
  httplib::Result r = method == "GET"     ? cli.Get(path.c_str(), h)
                      : method == "PATCH" ? cli.Patch(path.c_str(), h, text,
                                                      "application/json")
                                          : cli.Post(path.c_str(), h, text,
                                                     "application/json");
  REQUIRE(r);
  return r;
}

httplib::Result message(int port, const std::string& thread,
                        const std::string& content,
                        const std::string& token = {}) {
  return call(port, "POST", "/v1/threads/" + thread + "/messages",
              {{"content", content}}, token);
}

size_t turns_of(int port, const std::string& thread,
                const std::string& token = {}) {
  auto r = call(port, "GET", "/v1/threads/" + thread + "/history", nullptr,
                token);
  if (r->status == 404)
    return 0;
  REQUIRE(r->status == 200);
  return json::parse(r->body)["total_turns"].get<size_t>();
}

int64_t retry_after(const httplib::Result& r) {
  REQUIRE(r->has_header("Retry-After"));
  auto v = r->get_header_value("Retry-After");
  REQUIRE(!v.empty());
  REQUIRE(v.find_first_not_of("0123456789") == std::string::npos);
  return std::stoll(v);
}

} // namespace

TEST_CASE("limits: the request past requests_per_min is 429 rate_limited "
          "with OpenAI's headers and Retry-After, and nothing is stored",
          "[limits]") {
  auto provider = std::make_shared<test::scripted_provider>("fine");
  server_options so;
  so.default_limits.requests_per_min = 3;
  test::served_runtime s{with(provider), so};
  for (int i = 0; i < 3; ++i) {
    auto r = message(s.port(), "t1", "hello " + std::to_string(i));
    INFO(r->body);
    REQUIRE(r->status == 200);
    CHECK(r->get_header_value("x-ratelimit-limit-requests") == "3");
    CHECK(r->get_header_value("x-ratelimit-remaining-requests")
          == std::to_string(2 - i));
    CHECK(!r->get_header_value("x-ratelimit-reset-requests").empty());
    // Only the kinds limited are told.
    CHECK_FALSE(r->has_header("x-ratelimit-limit-tokens"));
    CHECK_FALSE(r->has_header("Retry-After"));
  }
  REQUIRE(turns_of(s.port(), "t1") == 6);
  auto refused = message(s.port(), "t1", "one too many");
  INFO(refused->body);
  REQUIRE(refused->status == 429);
  auto err = json::parse(refused->body)["error"];
  CHECK(err["code"] == "rate_limited");
  CHECK(err["type"] == "rate_limit_error");
  CHECK(err["message"].get<std::string>().find("requests_per_min of 3")
        != std::string::npos);
  auto wait = retry_after(refused);
  CHECK(wait >= 1);
  CHECK(wait <= 60);
  CHECK(refused->get_header_value("x-ratelimit-remaining-requests") == "0");
  // Nothing stored, on any route that reaches the model: a stream is a 429
  // before it starts, and so is a chat completion with or without a
  // thread.
  auto streamed = call(s.port(), "POST", "/v1/threads/t1/messages/stream",
                       {{"content", "streamed"}});
  CHECK(streamed->status == 429);
  CHECK(streamed->get_header_value("Content-Type").find("json")
        != std::string::npos);
  auto chat = call(s.port(), "POST", "/v1/chat/completions",
                   {{"model", "m"},
                    {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  CHECK(chat->status == 429);
  CHECK(chat->has_header("Retry-After"));
  auto threaded = call(s.port(), "POST", "/v1/chat/completions",
                       {{"model", "m"},
                        {"thread_id", "t1"},
                        {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  CHECK(threaded->status == 429);
  CHECK(turns_of(s.port(), "t1") == 6);
  CHECK(turns_of(s.port(), "t-new") == 0);
  CHECK(provider->prompts().size() == 3);
  // GET /v1/limits tells where the tenant stands.
  auto standing = call(s.port(), "GET", "/v1/limits");
  REQUIRE(standing->status == 200);
  auto st = json::parse(standing->body);
  CHECK(st["object"] == "limits");
  CHECK(st["limits"]["requests_per_min"] == 3);
  CHECK(st["limits"]["tokens_per_min"] == 0);
  CHECK(st["requests"]["limit"] == 3);
  CHECK(st["requests"]["remaining"] == 0);
  CHECK(st["requests"]["reset_ms"].get<int64_t>() > 0);
  CHECK(st["tokens"].is_null());
  CHECK(st["exchanges"]["running"] == 0);
  // The upstream's queue without bounds, and its gate, open.
  CHECK(st["upstream"]["concurrency"] == 0);
  CHECK(st["upstream"]["gate"] == "open");
  CHECK(st["upstream"]["reopens_in_ms"] == 0);
  CHECK(st["upstream"]["refused"] == 0);
  // Its refusals since start, by limit: the four above.
  CHECK(st["refused"] == json{{"requests_per_min", 4},
                              {"tokens_per_min", 0},
                              {"max_queued", 0}});
  auto metrics = call(s.port(), "GET", "/metrics")->body;
  CHECK(metrics.find("spindle_tenant_refusals{limit=\"requests_per_min\","
                     "tenant=\"default\"} 4")
        != std::string::npos);
  // Routes that do not reach the model are not limited.
  auto read = call(s.port(), "GET", "/v1/threads/t1");
  CHECK(read->status == 200);
  CHECK_FALSE(read->has_header("x-ratelimit-limit-requests"));
}

TEST_CASE("limits: a tenant at its tokens_per_min is refused while another "
          "is served, and a reply without max_tokens is bounded by its "
          "reserve",
          "[limits]") {
  auto provider = std::make_shared<turnstile_provider>();
  turnstile_provider::opener open{*provider};
  provider->open();
  server_options so;
  so.admin_token = test::tenants_admin_token;
  test::served_runtime s{with(provider), so};
  test::tenant_client admin{s.port(), test::tenants_admin_token};
  auto a = test::make_tenant(admin, "tokens-a");
  auto b = test::make_tenant(admin, "tokens-b");
  auto patched = call(s.port(), "PATCH", "/v1/tenants/" + a.id,
                      {{"limits", {{"tokens_per_min", 400},
                                   {"reply_reserve", 100}}}},
                      test::tenants_admin_token);
  INFO(patched->body);
  REQUIRE(patched->status == 200);
  CHECK(json::parse(patched->body)["limits"]["tokens_per_min"] == 400);
  CHECK(json::parse(patched->body)["limits"]["requests_per_min"].is_null());
  int served_a = 0;
  int last_status = 0;
  std::string last_body;
  httplib::Headers last_headers;
  uint64_t remaining_before = 400;
  for (int i = 0; i < 20; ++i) {
    auto last = message(s.port(), "ta", "a message of tenant a", a.key);
    last_status = last->status;
    last_body = last->body;
    last_headers = last->headers;
    if (last->status != 200)
      break;
    ++served_a;
    CHECK(last->get_header_value("x-ratelimit-limit-tokens") == "400");
    auto remaining =
      std::stoull(last->get_header_value("x-ratelimit-remaining-tokens"));
    CHECK(remaining < remaining_before);
    remaining_before = remaining;
    // Tenant b, without limits, is served all along.
    auto rb = message(s.port(), "tb", "a message of tenant b", b.key);
    REQUIRE(rb->status == 200);
    CHECK_FALSE(rb->has_header("x-ratelimit-limit-tokens"));
  }
  INFO(last_body);
  CHECK(served_a >= 1);
  CHECK(served_a < 20);
  REQUIRE(last_status == 429);
  auto err = json::parse(last_body)["error"];
  CHECK(err["code"] == "rate_limited");
  CHECK(err["message"].get<std::string>().find("tokens_per_min of 400")
        != std::string::npos);
  auto wait = last_headers.find("Retry-After");
  REQUIRE(wait != last_headers.end());
  CHECK(std::stoll(wait->second) >= 1);
  CHECK(turns_of(s.port(), "ta", a.key) == 2u * served_a);
  // A refused message to a new thread leaves no thread behind (about 130
  // tokens and the reserve of 100: more than is left, less than the
  // limit).
  std::string longer;
  for (int i = 0; i < 120; ++i)
    longer += "word ";
  auto fresh = message(s.port(), "ta-new", longer, a.key);
  CHECK(fresh->status == 429);
  CHECK(call(s.port(), "GET", "/v1/threads/ta-new", nullptr, a.key)->status
        == 404);
  // Every call of tenant a set no max_tokens: each went with its reserve.
  auto sent = provider->max_tokens();
  auto contents = provider->arrived();
  REQUIRE(sent.size() == contents.size());
  for (size_t i = 0; i < sent.size(); ++i)
    CHECK(sent[i] == (contents[i] == "a message of tenant a" ? 100u : 0u));
  // A call that can never fit is 413, not told to retry.
  std::string huge(3000, 'x');
  for (size_t i = 100; i < huge.size(); i += 7)
    huge[i] = ' ';
  auto too_large = message(s.port(), "ta", huge, a.key);
  CHECK(too_large->status == 413);
  CHECK_FALSE(too_large->has_header("Retry-After"));
}

TEST_CASE("limits: past concurrent_exchanges calls wait in arrival order, "
          "past max_queued they are refused at once",
          "[limits][concurrency]") {
  auto provider = std::make_shared<turnstile_provider>();
  turnstile_provider::opener open{*provider};
  server_options so;
  so.default_limits.concurrent_exchanges = 1;
  so.default_limits.max_queued = 2;
  test::served_runtime s{with(provider), so};
  auto limiter = s.rt().limiter();
  REQUIRE(limiter);
  auto wait_load = [&](uint64_t running, uint64_t queued) {
    for (int i = 0; i < 500; ++i) {
      if (limiter->load_of("default") == std::make_pair(running, queued))
        return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  std::vector<std::future<int>> answers;
  for (int i = 0; i < 3; ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      return message(s.port(), "c" + std::to_string(i),
                     "call " + std::to_string(i))
        ->status;
    }));
    // Each arrives before the next is sent.
    REQUIRE(wait_load(1, static_cast<uint64_t>(i)));
  }
  REQUIRE(provider->wait_arrived(1));
  // The queue holds two: the fourth is refused at once.
  auto refused = message(s.port(), "c3", "call 3");
  INFO(refused->body);
  CHECK(refused->status == 429);
  CHECK(json::parse(refused->body)["error"]["message"]
          .get<std::string>()
          .find("max_queued")
        != std::string::npos);
  CHECK(retry_after(refused) == 1);
  // Not even the thread it would have created stays.
  CHECK(call(s.port(), "GET", "/v1/threads/c3")->status == 404);
  // Queued calls stored nothing yet.
  CHECK(turns_of(s.port(), "c1") == 0);
  CHECK(turns_of(s.port(), "c2") == 0);
  for (size_t n = 1; n <= 3; ++n) {
    REQUIRE(provider->wait_arrived(n));
    provider->let_one_go();
  }
  for (auto& f : answers)
    CHECK(f.get() == 200);
  CHECK(provider->arrived()
        == std::vector<std::string>{"call 0", "call 1", "call 2"});
  CHECK(wait_load(0, 0));
  // The tenant's standing counts the two that waited, how long, and the
  // refusal.
  auto st = json::parse(call(s.port(), "GET", "/v1/limits")->body);
  CHECK(st["exchanges"]["waited"] == 2);
  CHECK(st["exchanges"]["wait_ms"].get<int64_t>()
        >= st["exchanges"]["max_wait_ms"].get<int64_t>());
  CHECK(st["exchanges"]["max_wait_ms"].get<int64_t>() > 0);
  CHECK(st["refused"]["max_queued"] == 1);
  auto metrics = call(s.port(), "GET", "/metrics")->body;
  CHECK(metrics.find("spindle_tenant_wait_seconds{") != std::string::npos);
  CHECK(metrics.find("queue=\"slot\"") != std::string::npos);
}

TEST_CASE("limits: a queued call whose deadline passes is 504 with nothing "
          "stored, and frees its place",
          "[limits]") {
  auto provider = std::make_shared<turnstile_provider>();
  turnstile_provider::opener open{*provider};
  auto ro = with(provider);
  ro.conversation.queue_timeout = 300ms;
  server_options so;
  so.default_limits.concurrent_exchanges = 1;
  test::served_runtime s{ro, so};
  auto first = std::async(std::launch::async, [&] {
    return message(s.port(), "d0", "held")->status;
  });
  REQUIRE(provider->wait_arrived(1));
  auto late = message(s.port(), "d1", "waits too long");
  INFO(late->body);
  CHECK(late->status == 504);
  CHECK(json::parse(late->body)["error"]["code"] == "timeout");
  CHECK(call(s.port(), "GET", "/v1/threads/d1")->status == 404);
  CHECK(s.rt().limiter()->load_of("default")
        == std::make_pair(uint64_t{1}, uint64_t{0}));
  provider->let_one_go();
  CHECK(first.get() == 200);
}

TEST_CASE("limits: bad limits are 400 naming the field, and nothing changes",
          "[limits]") {
  server_options so;
  so.admin_token = test::tenants_admin_token;
  test::served_runtime s{with(std::make_shared<offline_provider>()), so};
  test::tenant_client admin{s.port(), test::tenants_admin_token};
  auto t = test::make_tenant(admin, "bad-limits");
  auto path = "/v1/tenants/" + t.id;
  auto set = call(s.port(), "PATCH", path,
                  {{"limits", {{"requests_per_min", 60}}}},
                  test::tenants_admin_token);
  REQUIRE(set->status == 200);
  auto before = json::parse(
    call(s.port(), "GET", path, nullptr, test::tenants_admin_token)->body);
  struct bad {
    json limits;
    std::string names;
  };
  std::vector<bad> cases{
    {{{"requests_per_min", -1}}, "limits.requests_per_min"},
    {{{"tokens_per_min", 10000000000000LL}}, "limits.tokens_per_min"},
    {{{"concurrent_exchanges", 1.5}}, "limits.concurrent_exchanges"},
    {{{"max_queued", "10"}}, "limits.max_queued"},
    {{{"reply_reserve", 0}}, "limits.reply_reserve"},
    {{{"max_queued", 100001}}, "limits.max_queued"},
    {{{"tokens_per_minute", 10}}, "tokens_per_minute"},
    {json::array({1, 2}), "limits"},
    {"fast", "limits"},
  };
  for (auto& c : cases) {
    auto r = call(s.port(), "PATCH", path, {{"limits", c.limits}},
                  test::tenants_admin_token);
    INFO(c.limits.dump() << " -> " << r->body);
    CHECK(r->status == 400);
    CHECK(r->body.find(c.names) != std::string::npos);
    auto now = json::parse(
      call(s.port(), "GET", path, nullptr, test::tenants_admin_token)->body);
    CHECK(now == before);
  }
  // A weight of 0 likewise.
  auto w = call(s.port(), "PATCH", path, {{"weight", 0}},
                test::tenants_admin_token);
  CHECK(w->status == 400);
  // Creating with bad limits creates nothing.
  auto listed = [&] {
    return json::parse(call(s.port(), "GET", "/v1/tenants", nullptr,
                            test::tenants_admin_token)
                         ->body)["data"]
      .size();
  };
  auto count = listed();
  auto made = call(s.port(), "POST", "/v1/tenants",
                   {{"name", "never"}, {"limits", {{"tokens_per_min", -5}}}},
                   test::tenants_admin_token);
  CHECK(made->status == 400);
  CHECK(listed() == count);
  // The server keeps serving.
  CHECK(call(s.port(), "GET", "/healthz")->status == 200);
}

TEST_CASE("limits: PATCH changes the fields it names, null puts one back to "
          "the server's default, and a change applies to the next call",
          "[limits]") {
  server_options so;
  so.admin_token = test::tenants_admin_token;
  so.default_limits.requests_per_min = 1000;
  test::served_runtime s{with(std::make_shared<offline_provider>()), so};
  test::tenant_client admin{s.port(), test::tenants_admin_token};
  auto t = test::make_tenant(admin, "patchy");
  auto path = "/v1/tenants/" + t.id;
  auto patch = [&](const json& limits) {
    auto r = call(s.port(), "PATCH", path, {{"limits", limits}},
                  test::tenants_admin_token);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body)["limits"];
  };
  auto l = patch({{"requests_per_min", 2}});
  CHECK(l["requests_per_min"] == 2);
  l = patch({{"tokens_per_min", 100000}});
  CHECK(l["requests_per_min"] == 2);
  CHECK(l["tokens_per_min"] == 100000);
  // In force at once on this node: the tenant's own 2, not the default.
  for (int i = 0; i < 2; ++i) {
    auto r = message(s.port(), "p", "hello", t.key);
    REQUIRE(r->status == 200);
    CHECK(r->get_header_value("x-ratelimit-limit-requests") == "2");
    CHECK(r->get_header_value("x-ratelimit-limit-tokens") == "100000");
  }
  CHECK(message(s.port(), "p", "hello", t.key)->status == 429);
  l = patch({{"requests_per_min", nullptr}});
  CHECK(l["requests_per_min"].is_null());
  CHECK(l["tokens_per_min"] == 100000);
  // Back to the server's 1000 (two used).
  auto r = message(s.port(), "p", "hello", t.key);
  REQUIRE(r->status == 200);
  CHECK(r->get_header_value("x-ratelimit-limit-requests") == "1000");
  // 0 is "no limit of that kind", whatever the default.
  l = patch({{"requests_per_min", 0}});
  r = message(s.port(), "p", "hello", t.key);
  REQUIRE(r->status == 200);
  CHECK_FALSE(r->has_header("x-ratelimit-limit-requests"));
  l = patch(nullptr);
  for (auto& [k, v] : l.items())
    CHECK(v.is_null());
  // The tenant listing shows them too.
  auto all = json::parse(
    call(s.port(), "GET", "/v1/tenants", nullptr, test::tenants_admin_token)
      ->body);
  bool seen = false;
  for (auto& x : all["data"])
    if (x["id"] == t.id) {
      seen = true;
      CHECK(x["limits"].is_object());
    }
  CHECK(seen);
}

TEST_CASE("limits: a change of a tenant's limits reaches every process of "
          "the store within its refresh",
          "[limits][store]") {
  test::temp_dir dir;
  storage_options storage;
  storage.data_dir = dir.str();
  auto one = tenancy::tenant_store::open(storage);
  REQUIRE(one);
  auto two = tenancy::tenant_store::open(storage);
  REQUIRE(two);
  auto t = (*one)->create_tenant("spread", 1);
  REQUIRE(t);
  rate_limits defaults;
  defaults.requests_per_min = 7;
  CHECK((*two)->limits_of(t->id, defaults).requests_per_min == 7);
  tenancy::limit_settings l;
  l.requests_per_min = 3;
  l.concurrent_exchanges = 2;
  auto updated = (*one)->update_tenant(t->id, std::nullopt, std::nullopt, l);
  REQUIRE(updated);
  REQUIRE(*updated);
  CHECK((*updated)->limits.requests_per_min == uint64_t{3});
  CHECK((*one)->limits_of(t->id, defaults).requests_per_min == 3);
  auto deadline = std::chrono::steady_clock::now()
                  + tenancy::tenant_store::refresh * 4;
  while ((*two)->limits_of(t->id, defaults).requests_per_min != 3
         && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  auto seen = (*two)->limits_of(t->id, defaults);
  CHECK(seen.requests_per_min == 3);
  CHECK(seen.concurrent_exchanges == 2);
  // A process that opens later reads them at once, and a deleted tenant's
  // limits go with it.
  auto three = tenancy::tenant_store::open(storage);
  REQUIRE(three);
  CHECK((*three)->limits_of(t->id, defaults).requests_per_min == 3);
  REQUIRE((*one)->delete_tenant(t->id));
  CHECK((*one)->limits_of(t->id, defaults).requests_per_min == 7);
}

TEST_CASE("upstream: past --llm-concurrency a stream hears `queued` before "
          "any of its reply, and is sent when a call ends",
          "[limits][upstream]") {
  auto provider = std::make_shared<turnstile_provider>();
  turnstile_provider::opener open{*provider};
  server_options so;
  so.upstream.concurrency = 1;
  test::served_runtime s{with(provider), so};
  auto q = s.rt().upstream();
  REQUIRE(q);
  auto first = std::async(std::launch::async, [&] {
    return call(s.port(), "POST", "/v1/threads/u0/messages/stream",
                {{"content", "first"}})
      ->body;
  });
  REQUIRE(provider->wait_arrived(1));
  auto second = std::async(std::launch::async, [&] {
    return call(s.port(), "POST", "/v1/threads/u1/messages/stream",
                {{"content", "second"}})
      ->body;
  });
  // The second waits before the third is sent: their places are known.
  for (int i = 0; i < 500 && q->counts().waiting < 1; ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(q->counts().waiting == 1);
  auto third = std::async(std::launch::async, [&] {
    return call(s.port(), "POST", "/v1/chat/completions",
                {{"model", "m"},
                 {"stream", true},
                 {"thread_id", "u2"},
                 {"messages", {{{"role", "user"}, {"content", "third"}}}}})
      ->body;
  });
  for (int i = 0; i < 500 && q->counts().waiting < 2; ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(q->counts().waiting == 2);
  auto standing = json::parse(call(s.port(), "GET", "/v1/limits")->body);
  CHECK(standing["upstream"]["concurrency"] == 1);
  CHECK(standing["upstream"]["running"] == 1);
  CHECK(standing["upstream"]["waiting"] == 2);
  CHECK(standing["upstream"]["waiting_tenant"] == 2);
  CHECK(standing["upstream"]["waited_tenant"] == 0);
  // Nothing of theirs is stored while they wait.
  CHECK(turns_of(s.port(), "u1") == 0);
  auto metrics = call(s.port(), "GET", "/metrics")->body;
  CHECK(metrics.find("spindle_upstream_calls{state=\"waiting\"} 2")
        != std::string::npos);
  CHECK(metrics.find("spindle_upstream_waiting{tenant=\"default\"} 2")
        != std::string::npos);
  for (size_t n = 1; n <= 3; ++n) {
    REQUIRE(provider->wait_arrived(n));
    provider->let_one_go();
  }
  auto a = first.get();
  auto b = second.get();
  auto c = third.get();
  CHECK(a.find("event: queued") == std::string::npos);
  auto queued = b.find("event: queued");
  REQUIRE(queued != std::string::npos);
  CHECK(b.find("\"position\":1") != std::string::npos);
  CHECK(queued > b.find("event: thread"));
  CHECK(queued < b.find("event: delta"));
  CHECK(b.find("event: done") != std::string::npos);
  // OpenAI's stream tells it as a comment its clients skip.
  // Second in the tenant's queue.
  auto comment = c.find(": queued position=2 waiting=2");
  REQUIRE(comment != std::string::npos);
  CHECK(comment < c.find("\"content\":\"ok\""));
  CHECK(c.find("data: [DONE]") != std::string::npos);
  CHECK(provider->arrived()
        == std::vector<std::string>{"first", "second", "third"});
  auto after = call(s.port(), "GET", "/metrics")->body;
  CHECK(after.find("spindle_upstream_waiting{tenant=\"default\"} 0")
        != std::string::npos);
  CHECK(after.find("spindle_upstream_calls{state=\"sent\"} 3")
        != std::string::npos);
  // The two that waited for the upstream, once sent, in the tenant's
  // standing and the metrics.
  auto sent = json::parse(call(s.port(), "GET", "/v1/limits")->body);
  CHECK(sent["upstream"]["waited_tenant"] == 2);
  CHECK(sent["upstream"]["max_wait_ms_tenant"].get<int64_t>() > 0);
  CHECK(sent["upstream"]["wait_ms_tenant"].get<int64_t>()
        >= sent["upstream"]["max_wait_ms_tenant"].get<int64_t>());
  CHECK(after.find("spindle_tenant_wait_seconds{queue=\"upstream\","
                   "stat=\"max\",tenant=\"default\"}")
        != std::string::npos);
}

TEST_CASE("upstream: tenants are sent by their weights when they wait",
          "[limits][upstream][fairness]") {
  auto provider = std::make_shared<turnstile_provider>();
  turnstile_provider::opener open{*provider};
  server_options so;
  so.admin_token = test::tenants_admin_token;
  so.upstream.concurrency = 1;
  test::served_runtime s{with(provider), so};
  test::tenant_client admin{s.port(), test::tenants_admin_token};
  auto heavy = test::make_tenant(admin, "heavy");
  auto light = test::make_tenant(admin, "light");
  REQUIRE(call(s.port(), "PATCH", "/v1/tenants/" + light.id,
               {{"weight", 3}}, test::tenants_admin_token)
            ->status
          == 200);
  auto q = s.rt().upstream();
  // One call holds the upstream; then heavy sends 8 and light 6, each on
  // threads of its own.
  auto hold = std::async(std::launch::async, [&] {
    return message(s.port(), "h-hold", "hold", heavy.key)->status;
  });
  REQUIRE(provider->wait_arrived(1));
  std::vector<std::future<int>> calls;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return message(s.port(), "h" + std::to_string(i), "heavy", heavy.key)
        ->status;
    }));
    for (int k = 0; k < 500 && q->counts().waiting < uint64_t(i + 1); ++k)
      std::this_thread::sleep_for(5ms);
  }
  for (int i = 0; i < 6; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      return message(s.port(), "l" + std::to_string(i), "light", light.key)
        ->status;
    }));
    for (int k = 0; k < 500 && q->counts().waiting < uint64_t(9 + i); ++k)
      std::this_thread::sleep_for(5ms);
  }
  REQUIRE(q->counts().waiting == 14);
  for (size_t n = 1; n <= 15; ++n) {
    REQUIRE(provider->wait_arrived(n));
    provider->let_one_go();
  }
  CHECK(hold.get() == 200);
  for (auto& f : calls)
    CHECK(f.get() == 200);
  // After the hold: light (weight 3) gets three calls for each of heavy's
  // while both wait, then heavy the rest.
  auto order = provider->arrived();
  std::string pattern;
  for (size_t i = 1; i < order.size(); ++i)
    pattern += order[i] == "light" ? 'L' : 'H';
  INFO(pattern);
  // The first light call starts at the virtual time now, heavy's next a
  // share later: L L L H L L L H, then heavy's remaining six.
  CHECK(pattern == "LLLHLLLHHHHHHH");
}
