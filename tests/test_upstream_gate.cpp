// The upstream's gate (docs/limits.md, "When the upstream refuses"): a 429
// or 503 closes it for the upstream's Retry-After (at most 60 s), one probe
// goes when it reopens, the calls that waited are released spread over a
// quarter of the time it was closed; the upstream's x-ratelimit-remaining-*
// headers pace what is sent until their reset.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "admission/upstream.hpp"
#include "llm/signal.hpp"

using namespace spindle;
using namespace spindle::admission;
using namespace std::chrono_literals;
using gate_state = upstream_queue::gate_state;

namespace {

struct fake_clock {
  std::atomic<int64_t> ms{7000000};
  limiter::clock_fn fn() {
    return [this] { return ms.load(); };
  }
};

upstream_signal answered(int status, int64_t retry_after_ms = -1) {
  upstream_signal s;
  s.status = status;
  s.retry_after_ms = retry_after_ms;
  return s;
}

// Calls queued on a test's clock: when each was sent, and its slot.
struct recorder {
  fake_clock& clock;
  std::mutex mx;
  std::vector<std::pair<int, int64_t>> sent; // call, clock ms
  std::vector<upstream_slot_ptr> slots;

  upstream_callback on(int call) {
    return [this, call](upstream_slot_ptr s, int64_t) {
      std::lock_guard<std::mutex> guard{mx};
      sent.emplace_back(call, clock.ms.load());
      slots.push_back(std::move(s));
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> guard{mx};
    return sent.size();
  }
};

} // namespace

TEST_CASE("upstream gate: a refusal closes it for Retry-After, one probe "
          "goes alone when it reopens, and its answer releases the waiting "
          "calls spread over a quarter of the time it was closed",
          "[upstream][gate]") {
  fake_clock clock;
  auto q = upstream_queue::make({}, {}, clock.fn());
  auto first = q->acquire("a", 10, {});
  REQUIRE(first.slot);
  auto closed_at = clock.ms.load();
  first.slot->signal(answered(429, 2000));
  first.slot->settle(0);
  auto g = q->gate();
  CHECK(g.state == gate_state::closed);
  CHECK(g.reopens_in_ms == 2000);
  CHECK(g.refused == 1);
  // A client told to come back waits until it reopens and the release
  // after it: 2 s + 0.5 s, rounded up.
  CHECK(q->retry_after_s() == 3);

  recorder rec{clock};
  constexpr int waiting = 40;
  std::vector<uint64_t> tickets;
  for (int i = 0; i < waiting; ++i) {
    auto w = q->acquire(i % 2 ? "a" : "b", 10, rec.on(i));
    REQUIRE_FALSE(w.slot); // behind the gate, not refused
    tickets.push_back(w.ticket);
  }
  // A waiting call can still leave (its client's deadline).
  CHECK(q->withdraw(tickets.back()));
  clock.ms += 1999;
  q->poke();
  CHECK(rec.count() == 0);
  clock.ms += 1;
  q->poke();
  REQUIRE(rec.count() == 1);
  CHECK(q->gate().state == gate_state::probing);
  CHECK(q->gate().probes == 1);
  // Nothing else goes while the probe is out, however long it takes.
  for (int i = 0; i < 50; ++i) {
    clock.ms += 100;
    q->poke();
  }
  CHECK(rec.count() == 1);
  upstream_slot_ptr probe;
  {
    std::lock_guard<std::mutex> guard{rec.mx};
    probe = rec.slots.front();
  }
  CHECK(probe->probe());
  auto reopened = clock.ms.load();
  probe->signal(answered(200));
  // Released over a quarter of the 7 s it was closed (1.75 s), each call
  // at a moment of its own slice: never a burst.
  CHECK(q->gate().state == gate_state::releasing);
  size_t most_in_a_step = 0;
  for (int step = 0; step < 400 && rec.count() < waiting - 1; ++step) {
    auto before = rec.count();
    clock.ms += 5;
    q->poke();
    most_in_a_step = std::max(most_in_a_step, rec.count() - before);
  }
  REQUIRE(rec.count() == waiting - 1);
  std::vector<int64_t> times;
  {
    std::lock_guard<std::mutex> guard{rec.mx};
    for (size_t i = 1; i < rec.sent.size(); ++i)
      times.push_back(rec.sent[i].second);
  }
  auto span = (reopened - closed_at) / 4;
  CHECK(times.front() >= reopened);
  CHECK(times.back() <= reopened + span + 5);
  // Spread over at least 20% of the time it was closed.
  CHECK(times.back() - times.front()
        >= static_cast<int64_t>(0.2 * static_cast<double>(reopened - closed_at)));
  CHECK(most_in_a_step <= 2);
  CHECK(q->gate().state == gate_state::open);
  // The withdrawn call never went.
  {
    std::lock_guard<std::mutex> guard{rec.mx};
    for (auto& [call, at] : rec.sent)
      CHECK(call != waiting - 1);
  }
  CHECK(q->counts().waiting == 0);
}

TEST_CASE("upstream gate: a refused probe closes it again, without "
          "Retry-After the wait doubles, and Retry-After is held to 60 s",
          "[upstream][gate]") {
  fake_clock clock;
  auto q = upstream_queue::make({}, {}, clock.fn());
  auto a = q->acquire("a", 1, {});
  a.slot->signal(answered(503));
  CHECK(q->gate().reopens_in_ms == 1000);
  recorder rec{clock};
  q->acquire("a", 1, rec.on(1));
  q->acquire("a", 1, rec.on(2));
  clock.ms += 1000;
  q->poke();
  REQUIRE(rec.count() == 1);
  rec.slots.front()->signal(answered(429));
  CHECK(q->gate().state == gate_state::closed);
  CHECK(q->gate().reopens_in_ms == 2000);
  clock.ms += 2000;
  q->poke();
  REQUIRE(rec.count() == 2);
  rec.slots.back()->signal(answered(429, 600000));
  CHECK(q->gate().reopens_in_ms == 60000);
  CHECK(q->gate().refused == 3);
  // A later refusal of a call sent before never shortens the wait.
  a.slot->signal(answered(429, 10)); // already signalled: ignored
  CHECK(q->gate().reopens_in_ms == 60000);
}

TEST_CASE("upstream gate: a call sent again after a refusal goes first of "
          "its tenant's calls, and a probe that ends unanswered reopens it",
          "[upstream][gate]") {
  fake_clock clock;
  auto q = upstream_queue::make({}, {}, clock.fn());
  auto a = q->acquire("a", 1, {});
  a.slot->signal(answered(429, 500));
  a.slot->settle(0);
  recorder rec{clock};
  q->acquire("a", 1, rec.on(1));
  q->acquire("a", 1, rec.on(2));
  auto again = q->acquire("a", 1, rec.on(0), true);
  CHECK(again.position == 1);
  clock.ms += 500;
  q->poke();
  REQUIRE(rec.count() == 1);
  CHECK(rec.sent.front().first == 0);
  // The probe fails on its own (a broken connection): not a refusal.
  rec.slots.front()->settle(0);
  CHECK(q->gate().state != gate_state::closed);
  for (int i = 0; i < 100 && rec.count() < 3; ++i) {
    clock.ms += 10;
    q->poke();
  }
  CHECK(rec.count() == 3);
  CHECK(q->gate().state == gate_state::open);
}

TEST_CASE("upstream gate: the upstream's remaining requests and tokens "
          "pace what is sent until their reset",
          "[upstream][gate]") {
  fake_clock clock;
  auto q = upstream_queue::make({}, {}, clock.fn());
  auto a = q->acquire("a", 10, {});
  upstream_signal s = answered(200);
  s.remaining_requests = 2;
  s.reset_requests_ms = 1000;
  a.slot->signal(s);
  a.slot->settle(10);
  CHECK(q->acquire("a", 10, {}).slot);
  CHECK(q->acquire("a", 10, {}).slot);
  recorder rec{clock};
  CHECK_FALSE(q->acquire("a", 10, rec.on(3)).slot);
  CHECK(q->gate().paced_for_ms == 1000);
  clock.ms += 999;
  q->poke();
  CHECK(rec.count() == 0);
  clock.ms += 1;
  q->poke();
  CHECK(rec.count() == 1);

  // Tokens: a call larger than what remains waits for the reset.
  upstream_signal t = answered(200);
  t.remaining_tokens = 100;
  t.reset_tokens_ms = 2000;
  rec.slots.front()->signal(t);
  CHECK(q->acquire("a", 60, {}).slot);
  CHECK_FALSE(q->acquire("a", 60, rec.on(5)).slot);
  clock.ms += 2000;
  q->poke();
  CHECK(rec.count() == 2);
  // A refused answer paces nothing: it closes the gate.
  CHECK(q->gate().state == gate_state::open);
}

TEST_CASE("upstream gate: with many threads sending and a real clock, at "
          "most one call reaches a refusing upstream per closed window, and "
          "every call is sent once it stops refusing",
          "[upstream][gate][concurrency]") {
  auto q = upstream_queue::make({}, {});
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  // The upstream refuses everything for its first 600 ms, Retry-After
  // 150 ms.
  constexpr auto refusing = 600ms;
  std::mutex mx;
  std::vector<std::pair<clock::time_point, bool>> hits; // when, refused
  std::atomic<int> answered_ok{0}, refusals{0};
  auto upstream = [&](upstream_slot_ptr s) {
    auto now = clock::now();
    bool refuse = now - t0 < refusing;
    {
      std::lock_guard<std::mutex> guard{mx};
      hits.emplace_back(now, refuse);
    }
    if (refuse) {
      ++refusals;
      s->signal(answered(429, 150));
      s->settle(0);
    } else {
      ++answered_ok;
      s->signal(answered(200));
      s->settle(1);
    }
  };
  constexpr int threads = 8;
  constexpr int per_thread = 30;
  std::atomic<int> refused_calls{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        // A refused call is sent again, first of its tenant; it is the
        // caller's to give up after three refusals.
        auto tenant = "t" + std::to_string(t % 4);
        auto w = q->acquire(tenant, 1, [&](upstream_slot_ptr s, int64_t) {
          upstream(std::move(s));
        });
        if (w.slot)
          upstream(std::move(w.slot));
        std::this_thread::sleep_for(2ms);
      }
    });
  for (auto& th : pool)
    th.join();
  // Everything waiting is released once the upstream answers again.
  auto deadline = clock::now() + 10s;
  while (q->counts().waiting > 0 && clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK(q->counts().waiting == 0);
  CHECK(answered_ok + refusals == threads * per_thread);
  std::lock_guard<std::mutex> guard{mx};
  std::sort(hits.begin(), hits.end());
  // After the first refusal, the upstream sees calls no closer than the
  // gate's window (less what was already in flight when it closed: the
  // calls of the same instant).
  auto first_refusal = std::find_if(hits.begin(), hits.end(),
                                    [](auto& h) { return h.second; });
  REQUIRE(first_refusal != hits.end());
  std::vector<clock::time_point> during;
  for (auto it = first_refusal; it != hits.end(); ++it)
    if (it->first - t0 < refusing && it->first - first_refusal->first > 20ms)
      during.push_back(it->first);
  for (size_t i = 1; i < during.size(); ++i)
    CHECK(during[i] - during[i - 1] >= 140ms);
  CHECK(during.size() <= 5);
}

TEST_CASE("upstream gate: headers are read as the upstream writes them",
          "[upstream][gate]") {
  CHECK(parse_retry_after("2", 0) == 2000);
  CHECK(parse_retry_after(" 1.5 ", 0) == 1500);
  CHECK(parse_retry_after("", 0) == -1);
  CHECK(parse_retry_after("soon", 0) == -1);
  // Sun, 06 Nov 1994 08:49:37 GMT is 784111777.
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111770) == 7000);
  CHECK(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111800) == 0);
  CHECK(parse_duration_ms("1s") == 1000);
  CHECK(parse_duration_ms("6m0s") == 360000);
  CHECK(parse_duration_ms("1m30.5s") == 90500);
  CHECK(parse_duration_ms("20ms") == 20);
  CHECK(parse_duration_ms("2h") == 7200000);
  CHECK(parse_duration_ms("0.5") == 500);
  CHECK(parse_duration_ms("3x") == -1);
  CHECK(parse_duration_ms("") == -1);
  CHECK(parse_count("59") == 59);
  CHECK(parse_count("-1") == -1);
  CHECK(parse_count("12a") == -1);
}
