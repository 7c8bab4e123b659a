// The limiter of each tenant's calls to the model (docs/limits.md), on a
// clock the tests move: requests and tokens in any 60 s, reservations
// settled to what was used, calls at once with a queue in arrival order,
// and OpenAI's x-ratelimit-* headers.

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "admission/limiter.hpp"

using namespace spindle;
using namespace spindle::admission;

namespace {

struct fake_clock {
  std::atomic<int64_t> ms{1000000};
  limiter::clock_fn fn() {
    return [this] { return ms.load(); };
  }
};

std::shared_ptr<limiter> limited(fake_clock& clock, rate_limits l) {
  return limiter::make([l](std::string_view) { return l; }, clock.fn());
}

std::string header(const rate_state& s, const std::string& name) {
  for (auto& [k, v] : rate_headers(s))
    if (k == name)
      return v;
  return "(none)";
}

} // namespace

TEST_CASE("a tenant without limits is never counted, refused or queued",
          "[limiter]") {
  fake_clock clock;
  auto lim = limited(clock, rate_limits{});
  for (int i = 0; i < 1000; ++i) {
    request_ticket t;
    auto s = lim->take_request("a", t);
    CHECK_FALSE(s.limited);
    CHECK(s.refused_by.empty());
    auto a = lim->admit("a", 1000000, 0, {});
    CHECK(a.result == admission::admission::outcome::admitted);
    CHECK_FALSE(a.granted); // nothing to settle
  }
  CHECK(rate_headers(lim->state_of("a")).empty());
}

TEST_CASE("the request past requests_per_min in 60 s is refused with when to "
          "retry, and admitted once the first leaves the window",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.requests_per_min = 3;
  auto lim = limited(clock, l);
  for (int i = 0; i < 3; ++i) {
    request_ticket t;
    auto s = lim->take_request("a", t);
    REQUIRE(s.refused_by.empty());
    CHECK(s.remaining_requests == static_cast<uint64_t>(2 - i));
    CHECK(header(s, "x-ratelimit-limit-requests") == "3");
    CHECK(header(s, "x-ratelimit-remaining-requests") == std::to_string(2 - i));
    clock.ms += 10000; // 10 s apart
  }
  // At +30 s: the first request (at +0 s) leaves the window at +60 s.
  request_ticket t;
  auto s = lim->take_request("a", t);
  CHECK(s.refused_by == "requests_per_min");
  CHECK(s.retry_after_s == 30);
  CHECK(header(s, "Retry-After") == "30");
  CHECK(s.remaining_requests == 0);
  // The window empties 60 s after the last request (+20 s): in 50 s.
  CHECK(header(s, "x-ratelimit-reset-requests") == "50s");
  CHECK(lim->counts().refused_requests == 1);
  // Another tenant is not touched by it.
  request_ticket other;
  CHECK(lim->take_request("b", other).refused_by.empty());
  clock.ms += 29000;
  CHECK(lim->take_request("a", t).refused_by == "requests_per_min");
  clock.ms += 1000;
  CHECK(lim->take_request("a", t).refused_by.empty());
}

TEST_CASE("a request refused later by another limit is taken back",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.requests_per_min = 2;
  auto lim = limited(clock, l);
  request_ticket t1, t2, t3;
  REQUIRE(lim->take_request("a", t1).refused_by.empty());
  REQUIRE(lim->take_request("a", t2).refused_by.empty());
  REQUIRE(lim->take_request("a", t3).refused_by == "requests_per_min");
  lim->take_back(t2);
  CHECK(lim->take_request("a", t3).refused_by.empty());
  // A ticket of a request that was not counted takes nothing back.
  request_ticket none;
  lim->take_back(none);
  CHECK(lim->state_of("a").remaining_requests == 0);
}

TEST_CASE("tokens: a call reserves its prompt and its reply's reserve, is "
          "refused past tokens_per_min, and is charged what it used",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.tokens_per_min = 1000;
  l.reply_reserve = 100;
  auto lim = limited(clock, l);
  // 200 + the reserve of 100.
  auto a = lim->admit("a", 200, 0, {});
  REQUIRE(a.result == admission::admission::outcome::admitted);
  REQUIRE(a.granted);
  CHECK(a.granted->reserved() == 300);
  // No max_tokens: the reply is bounded by its reserve.
  CHECK(a.granted->reply_bound() == 100);
  CHECK(a.state.remaining_tokens == 700);
  // A max_tokens of its own is the reserve, and no bound is added.
  auto b = lim->admit("a", 100, 400, {});
  REQUIRE(b.granted);
  CHECK(b.granted->reserved() == 500);
  CHECK(b.granted->reply_bound() == 0);
  CHECK(b.state.remaining_tokens == 200);
  // 300 + 500 reserved: 250 more do not fit.
  auto c = lim->admit("a", 150, 0, {});
  CHECK(c.result == admission::admission::outcome::refused);
  CHECK(c.state.refused_by == "tokens_per_min");
  CHECK(c.state.retry_after_s >= 1);
  CHECK(lim->counts().refused_tokens == 1);
  // Settled: `a` used 250 of its 300, `b` 120 of its 500.
  a.granted->settle(250);
  b.granted->settle(120);
  auto s = lim->state_of("a");
  CHECK(s.remaining_tokens == 1000 - 370);
  // Now it fits.
  auto d = lim->admit("a", 150, 0, {});
  REQUIRE(d.result == admission::admission::outcome::admitted);
  // Settling twice charges once; destroying an unsettled grant charges
  // nothing and frees its reservation.
  d.granted->settle(10);
  d.granted->settle(10000);
  CHECK(lim->state_of("a").remaining_tokens == 1000 - 380);
  {
    auto e = lim->admit("a", 100, 0, {});
    REQUIRE(e.granted);
    CHECK(lim->state_of("a").remaining_tokens == 1000 - 380 - 200);
  }
  CHECK(lim->state_of("a").remaining_tokens == 1000 - 380);
  // The charges leave 60 s after their second.
  clock.ms += 60000;
  CHECK(lim->state_of("a").remaining_tokens == 1000);
}

TEST_CASE("a call that can never fit tokens_per_min is too large, not told "
          "to retry",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.tokens_per_min = 1000;
  l.reply_reserve = 100;
  auto lim = limited(clock, l);
  auto a = lim->admit("a", 950, 0, {});
  CHECK(a.result == admission::admission::outcome::too_large);
  CHECK(a.why.find("1050 tokens") != std::string::npos);
  CHECK(a.why.find("tokens_per_min of 1000") != std::string::npos);
  CHECK_FALSE(a.granted);
  CHECK(lim->state_of("a").remaining_tokens == 1000);
}

TEST_CASE("Retry-After for tokens is when enough of the window's charges "
          "have left it",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.tokens_per_min = 1000;
  l.reply_reserve = 1;
  auto lim = limited(clock, l);
  // 400 at +0 s, 400 at +20 s, each settled at once.
  lim->admit("a", 399, 0, {}).granted->settle(400);
  clock.ms += 20000;
  lim->admit("a", 399, 0, {}).granted->settle(400);
  clock.ms += 5000; // +25 s
  // 300 more: 800 + 300 > 1000, and 100 must leave: the first 400 leave
  // at +60 s, in 35 s.
  auto r = lim->admit("a", 299, 0, {});
  REQUIRE(r.result == admission::admission::outcome::refused);
  CHECK(r.state.retry_after_s == 35);
  clock.ms += 35000;
  CHECK(lim->admit("a", 299, 0, {}).result
        == admission::admission::outcome::admitted);
}

TEST_CASE("concurrent_exchanges: calls past it wait in arrival order, and "
          "past max_queued are refused at once",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.concurrent_exchanges = 2;
  l.max_queued = 3;
  auto lim = limited(clock, l);
  std::vector<grant_ptr> running;
  for (int i = 0; i < 2; ++i) {
    auto a = lim->admit("a", 10, 0, {});
    REQUIRE(a.result == admission::admission::outcome::admitted);
    running.push_back(a.granted);
  }
  std::mutex mx;
  std::vector<int> order;
  std::map<int, grant_ptr> grants;
  std::vector<uint64_t> waiters;
  for (int i = 0; i < 3; ++i) {
    auto a = lim->admit("a", 10, 0, [&, i](grant_ptr g, rate_state s) {
      std::lock_guard<std::mutex> guard{mx};
      order.push_back(i);
      CHECK(s.queued);
      grants[i] = std::move(g);
    });
    REQUIRE(a.result == admission::admission::outcome::queued);
    waiters.push_back(a.waiter);
  }
  auto full = lim->admit("a", 10, 0, {});
  CHECK(full.result == admission::admission::outcome::refused);
  CHECK(full.state.refused_by == "max_queued");
  CHECK(full.state.retry_after_s == 1);
  // Another tenant is not queued behind them.
  CHECK(lim->admit("b", 10, 0, {}).result
        == admission::admission::outcome::admitted);
  CHECK(lim->load_of("a") == std::make_pair(uint64_t{2}, uint64_t{3}));
  // The second waiter's client gives up.
  CHECK(lim->withdraw("a", waiters[1]));
  CHECK_FALSE(lim->withdraw("a", waiters[1]));
  running[0]->settle(5);
  running[0].reset();
  {
    std::lock_guard<std::mutex> guard{mx};
    CHECK(order == std::vector<int>{0});
  }
  running[1].reset(); // destroyed unsettled: frees its slot too
  {
    std::lock_guard<std::mutex> guard{mx};
    CHECK(order == std::vector<int>{0, 2});
  }
  // Admitted already: it cannot be withdrawn.
  CHECK_FALSE(lim->withdraw("a", waiters[2]));
  CHECK(lim->load_of("a") == std::make_pair(uint64_t{2}, uint64_t{0}));
  grants.clear();
  CHECK(lim->load_of("a") == std::make_pair(uint64_t{0}, uint64_t{0}));
}

TEST_CASE("many threads admitting and settling at once never hold more than "
          "concurrent_exchanges slots, and every queued call is admitted",
          "[limiter][concurrency]") {
  rate_limits l;
  l.concurrent_exchanges = 4;
  l.max_queued = 100000;
  auto lim = limiter::make([l](std::string_view) { return l; });
  constexpr int threads = 8;
  constexpr int calls = 2000;
  // Slots held now: from admission (or the callback) until settled. A
  // callback hands its grant to the threads' loop, as an exchange's sends
  // a message, instead of settling inside the settle that admitted it.
  std::atomic<int> held{0};
  std::atomic<int> most{0};
  std::atomic<int> done{0};
  std::atomic<int> refused{0};
  std::mutex ready_mx;
  std::vector<grant_ptr> ready;
  auto hold = [&] {
    auto now = ++held;
    auto seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
  };
  auto run = [&](grant_ptr g) {
    --held;
    g->settle(1);
    ++done;
  };
  auto drain = [&] {
    std::vector<grant_ptr> mine;
    {
      std::lock_guard<std::mutex> guard{ready_mx};
      mine.swap(ready);
    }
    for (auto& g : mine)
      run(std::move(g));
    return !mine.empty();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < calls; ++i) {
        auto a = lim->admit("a", 1, 0, [&](grant_ptr g, rate_state) {
          hold();
          std::lock_guard<std::mutex> guard{ready_mx};
          ready.push_back(std::move(g));
        });
        if (a.result == admission::admission::outcome::admitted) {
          hold();
          run(std::move(a.granted));
        } else if (a.result != admission::admission::outcome::queued) {
          ++refused;
        }
        drain();
      }
    });
  for (auto& th : pool)
    th.join();
  while (drain()) {
  }
  CHECK(refused == 0);
  CHECK(done == threads * calls);
  CHECK(most.load() <= 4);
  CHECK(lim->load_of("a") == std::make_pair(uint64_t{0}, uint64_t{0}));
}

TEST_CASE("tokens charged in any 60 whole seconds never pass tokens_per_min "
          "under calls of random size, length and overlap",
          "[limiter]") {
  fake_clock clock;
  rate_limits l;
  l.tokens_per_min = 50000;
  l.reply_reserve = 500;
  auto lim = limited(clock, l);
  std::mt19937_64 rng{42};
  struct live {
    grant_ptr g;
    int64_t ends_ms;
    uint64_t used;
  };
  std::vector<live> calls;
  std::map<int64_t, uint64_t> charged; // by second
  uint64_t admitted = 0, refused = 0;
  for (int step = 0; step < 20000; ++step) {
    clock.ms += static_cast<int64_t>(rng() % 200);
    // End the calls whose time came, charging at most their reservation.
    for (auto i = calls.begin(); i != calls.end();) {
      if (i->ends_ms <= clock.ms) {
        i->g->settle(i->used);
        charged[clock.ms / 1000] += i->used;
        i = calls.erase(i);
      } else {
        ++i;
      }
    }
    uint64_t prompt = 100 + rng() % 4000;
    uint64_t max_tokens = rng() % 3 == 0 ? 100 + rng() % 1000 : 0;
    auto a = lim->admit("hot", prompt, max_tokens, {});
    if (a.result != admission::admission::outcome::admitted) {
      ++refused;
      continue;
    }
    ++admitted;
    auto reserve = a.granted->reserved();
    uint64_t used = prompt + rng() % (reserve - prompt + 1);
    calls.push_back(
      {a.granted, clock.ms + static_cast<int64_t>(rng() % 20000), used});
  }
  CHECK(admitted > 100);
  CHECK(refused > 100);
  // Every 60 consecutive seconds.
  uint64_t worst = 0;
  for (auto& [second, n] : charged) {
    uint64_t sum = 0;
    for (auto s = second; s < second + 60; ++s)
      if (auto i = charged.find(s); i != charged.end())
        sum += i->second;
    worst = std::max(worst, sum);
  }
  INFO("most charged in 60 s: " << worst);
  CHECK(worst <= l.tokens_per_min);
  CHECK(worst > l.tokens_per_min * 6 / 10); // the limit was reached
}

TEST_CASE("reset durations are written as OpenAI writes them", "[limiter]") {
  CHECK(reset_text(0) == "0ms");
  CHECK(reset_text(120) == "120ms");
  CHECK(reset_text(1000) == "1s");
  CHECK(reset_text(1500) == "1.5s");
  CHECK(reset_text(59999) == "59.999s");
  CHECK(reset_text(60000) == "1m0s");
  CHECK(reset_text(-5) == "0ms");
}

TEST_CASE("the minute window drops what left it however long the clock "
          "jumped",
          "[limiter]") {
  minute_window w;
  w.add(100, 5);
  w.add(130, 7);
  CHECK(w.sum() == 12);
  CHECK(w.freed_after(130500, 5) == 29500); // second 100 leaves at 160 s
  CHECK(w.freed_after(130500, 6) == 59500); // second 130 leaves at 190 s
  CHECK(w.freed_after(130500, 13) == -1);
  CHECK(w.empty_after(130500) == 59500);
  w.advance(160);
  CHECK(w.sum() == 7);
  w.take_back(130, 3);
  CHECK(w.sum() == 4);
  w.take_back(99, 3); // no longer in the window: nothing
  CHECK(w.sum() == 4);
  w.advance(100000);
  CHECK(w.sum() == 0);
  CHECK(w.empty_after(100000000) == 0);
}
