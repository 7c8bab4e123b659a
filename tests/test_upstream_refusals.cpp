// When the upstream refuses (docs/limits.md, "When the upstream refuses"):
// an OpenAI-compatible upstream answering 429 with Retry-After closes one
// gate shared by every exchange; the exchanges that arrive meanwhile wait
// (they are not refused), one probe goes per window, the rest are
// released spread out once it answers; a call refused three times is 429
// upstream_busy with Retry-After and its user turn kept. The upstream's
// x-ratelimit-remaining-* headers pace the calls that follow.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "admission/upstream.hpp"
#include "fake_openai.hpp"
#include "served.hpp"
#include "spindle/runtime/openai_provider.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;
using steady = std::chrono::steady_clock;

namespace {

runtime_options through(const test::fake_openai& fake) {
  auto provider = make_openai_provider(fake.options());
  REQUIRE(provider);
  runtime_options ro;
  ro.provider = *provider;
  ro.conversation.memory = false;
  return ro;
}

struct answer {
  int status = 0;
  std::string body;
  std::string retry_after;
};

answer post(int port, const std::string& path, const json& body) {
  httplib::Client cli{"127.0.0.1", port};
  cli.set_read_timeout(60, 0);
  auto r = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(r);
  return {r->status, r->body, r->get_header_value("Retry-After")};
}

// How exchange `i` is asked: a thread's message, its stream, or the
// OpenAI-compatible route without a thread, plain and streamed.
answer ask(int port, int i) {
  auto content = "m" + std::to_string(i);
  auto thread = "/v1/threads/r" + std::to_string(i);
  json chat{{"model", "m"},
            {"messages", {{{"role", "user"}, {"content", content}}}}};
  switch (i % 4) {
    case 0:
      return post(port, thread + "/messages", {{"content", content}});
    case 1:
      return post(port, thread + "/messages/stream", {{"content", content}});
    case 2:
      return post(port, "/v1/chat/completions", chat);
    default:
      chat["stream"] = true;
      return post(port, "/v1/chat/completions", chat);
  }
}

// The exchange's reply reached its client whole.
bool completed(int i, const answer& a) {
  if (a.status != 200)
    return false;
  switch (i % 4) {
    case 1:
      return a.body.find("event: done") != std::string::npos
             && a.body.find("event: error") == std::string::npos;
    case 3:
      return a.body.find("data: [DONE]") != std::string::npos
             && a.body.find("\"error\"") == std::string::npos;
    default:
      return a.body.find("fake reply") != std::string::npos;
  }
}

// Its client heard upstream_busy: a 429 with Retry-After, or (a stream
// already under way) an error event naming it.
bool told_busy(int i, const answer& a) {
  if (i % 2 == 0)
    return a.status == 429
           && a.body.find("upstream_busy") != std::string::npos
           && !a.retry_after.empty()
           && std::stoll(a.retry_after) >= 1;
  return a.status == 200 && a.body.find("upstream_busy") != std::string::npos;
}

} // namespace

TEST_CASE("upstream refusals: an upstream answering 429 Retry-After 2 for "
          "5 s while 50 exchanges arrive: one probe per window, no 5xx, "
          "every exchange not itself refused three times completes, and "
          "the release is spread",
          "[limits][upstream][gate]") {
  test::fake_openai fake;
  test::served_runtime s{through(fake)};
  auto t0 = steady::now();
  auto refusing_until = t0 + 5s;
  fake.refuse_until(refusing_until, 429, "2");
  constexpr int exchanges = 50;
  std::vector<std::future<answer>> sent;
  bool saw_closed = false;
  for (int i = 0; i < exchanges; ++i) {
    sent.push_back(std::async(std::launch::async,
                              [port = s.port(), i] { return ask(port, i); }));
    std::this_thread::sleep_for(40ms);
    if (i == 30) {
      // The gate is shown closed while it is.
      httplib::Client cli{"127.0.0.1", s.port()};
      auto r = cli.Get("/v1/limits");
      REQUIRE(r);
      auto standing = json::parse(r->body);
      saw_closed = standing["upstream"]["gate"] == "closed";
      CHECK(standing["upstream"]["waiting"].get<int>() >= 20);
      auto m = cli.Get("/metrics");
      REQUIRE(m);
      CHECK(m->body.find("spindle_upstream_gate{state=\"closed\"} 1")
            != std::string::npos);
    }
  }
  CHECK(saw_closed);
  std::vector<answer> answers;
  for (auto& f : sent)
    answers.push_back(f.get());

  auto arrivals = fake.arrivals();
  std::map<std::string, int> refusals, accepted;
  for (auto& a : arrivals)
    ++(a.status == 200 ? accepted : refusals)[a.last];
  int busy = 0;
  for (int i = 0; i < exchanges; ++i) {
    auto key = "m" + std::to_string(i);
    INFO("exchange " << i << " answered " << answers[i].status << ": "
                     << answers[i].body.substr(0, 300));
    // No client gets a 5xx.
    CHECK(answers[i].status < 500);
    CHECK(refusals[key] <= 3);
    if (refusals[key] == 3) {
      CHECK(told_busy(i, answers[i]));
      ++busy;
    } else {
      CHECK(completed(i, answers[i]));
      CHECK(accepted[key] == 1);
    }
  }
  // The gate held all but the probes: few are refused thrice.
  CHECK(busy <= 2);

  // One probe per window: after the first refusal (and what was in flight
  // with it), the upstream sees a call no more often than every 2 s while
  // it refuses.
  auto first = std::find_if(arrivals.begin(), arrivals.end(),
                            [](auto& a) { return a.status == 429; });
  REQUIRE(first != arrivals.end());
  std::vector<steady::time_point> during;
  for (auto& a : arrivals)
    if (a.at > first->at + 150ms && a.at < refusing_until)
      during.push_back(a.at);
  std::sort(during.begin(), during.end());
  CHECK(during.size() <= 3);
  for (size_t i = 1; i < during.size(); ++i)
    CHECK(during[i] - during[i - 1] >= 1900ms);

  // Released spread over at least 20% of the 2-s window.
  std::vector<steady::time_point> released;
  for (auto& a : arrivals)
    if (a.status == 200)
      released.push_back(a.at);
  std::sort(released.begin(), released.end());
  REQUIRE(released.size() >= 40);
  CHECK(released.back() - released.front() >= 400ms);

  // A message refused three times kept its user turn.
  for (int i = 0; i < exchanges; i += 4)
    if (refusals["m" + std::to_string(i)] == 3) {
      httplib::Client cli{"127.0.0.1", s.port()};
      auto h = cli.Get(("/v1/threads/r" + std::to_string(i) + "/history")
                         .c_str());
      REQUIRE(h);
      auto turns = json::parse(h->body)["turns"];
      REQUIRE(turns.size() == 1);
      CHECK(turns[0]["role"] == "user");
    }
  auto g = s.rt().upstream()->gate();
  CHECK(g.state == admission::upstream_queue::gate_state::open);
  CHECK(g.refused >= 3);
}

TEST_CASE("upstream refusals: a refused call whose wait behind the gate "
          "outlasts the queue timeout is 429 upstream_busy, its user turn "
          "kept, and is never sent again",
          "[limits][upstream][gate]") {
  test::fake_openai fake;
  auto ro = through(fake);
  ro.conversation.queue_timeout = 300ms;
  test::served_runtime s{std::move(ro)};
  fake.refuse_until(steady::now() + 30s, 429, "5");
  auto a = post(s.port(), "/v1/threads/w1/messages", {{"content", "wait"}});
  INFO(a.body);
  CHECK(a.status == 429);
  CHECK(a.body.find("upstream_busy") != std::string::npos);
  REQUIRE_FALSE(a.retry_after.empty());
  CHECK(std::stoll(a.retry_after) >= 4);
  // Refused once, then withdrawn from behind the gate: one call reached
  // the upstream.
  CHECK(fake.arrivals().size() == 1);
  httplib::Client cli{"127.0.0.1", s.port()};
  auto h = cli.Get("/v1/threads/w1/history");
  REQUIRE(h);
  auto turns = json::parse(h->body)["turns"];
  REQUIRE(turns.size() == 1);
  CHECK(turns[0]["role"] == "user");
  CHECK(s.rt().upstream()->counts().waiting == 0);
}

TEST_CASE("upstream refusals: the upstream's x-ratelimit-remaining-requests "
          "of 0 holds the next call until its reset, without a refusal",
          "[limits][upstream][gate]") {
  test::fake_openai fake;
  fake.set_headers({{"x-ratelimit-limit-requests", "60"},
                    {"x-ratelimit-remaining-requests", "0"},
                    {"x-ratelimit-reset-requests", "1s"}});
  test::served_runtime s{through(fake)};
  auto a = post(s.port(), "/v1/threads/p1/messages", {{"content", "one"}});
  REQUIRE(a.status == 200);
  auto b = post(s.port(), "/v1/threads/p2/messages", {{"content", "two"}});
  REQUIRE(b.status == 200);
  auto arrivals = fake.arrivals();
  REQUIRE(arrivals.size() == 2);
  CHECK(arrivals[1].at - arrivals[0].at >= 900ms);
  // With room again, nothing waits.
  fake.set_headers({{"x-ratelimit-remaining-requests", "500"},
                    {"x-ratelimit-reset-requests", "1s"}});
  std::this_thread::sleep_for(1100ms);
  auto c0 = steady::now();
  REQUIRE(post(s.port(), "/v1/threads/p3/messages", {{"content", "3"}}).status
          == 200);
  REQUIRE(post(s.port(), "/v1/threads/p4/messages", {{"content", "4"}}).status
          == 200);
  CHECK(steady::now() - c0 < 900ms);
  CHECK(s.rt().upstream()->gate().refused == 0);
}

TEST_CASE("upstream refusals: the OpenAI provider reports the upstream's "
          "status, Retry-After and rate-limit headers, and a 429 is "
          "upstream_busy",
          "[upstream][gate]") {
  test::fake_openai fake;
  auto provider = make_openai_provider(fake.options());
  REQUIRE(provider);
  prompt p{{"user", "hi", {}, {}}};
  std::vector<upstream_signal> seen;
  completion_options o;
  o.on_signal = [&seen](const upstream_signal& s) { seen.push_back(s); };
  fake.set_headers({{"x-ratelimit-remaining-requests", "59"},
                    {"x-ratelimit-remaining-tokens", "149000"},
                    {"x-ratelimit-reset-requests", "1s"},
                    {"x-ratelimit-reset-tokens", "6m0s"}});
  auto ok = (*provider)->complete(p, o, {});
  REQUIRE(ok);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].status == 200);
  CHECK(seen[0].remaining_requests == 59);
  CHECK(seen[0].remaining_tokens == 149000);
  CHECK(seen[0].reset_requests_ms == 1000);
  CHECK(seen[0].reset_tokens_ms == 360000);
  CHECK(seen[0].retry_after_ms == -1);

  fake.refuse_until(steady::now() + 10s, 503, "7");
  auto refused = (*provider)->complete(p, o, {});
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == errc::upstream_busy);
  CHECK(describe(refused.error()).find("503") != std::string::npos);
  REQUIRE(seen.size() == 2);
  CHECK(seen[1].status == 503);
  CHECK(seen[1].refused());
  CHECK(seen[1].retry_after_ms == 7000);
  // Another status is a failure of the call alone.
  fake.refuse_until(steady::now() + 10s, 500, "");
  auto failed = (*provider)->complete(p, o, {});
  REQUIRE_FALSE(failed);
  CHECK(classify(failed.error()) == errc::upstream_failure);
  CHECK_FALSE(seen.back().refused());
}
