// The fair queue toward the upstream (docs/limits.md, "The upstream"):
// calls at once and tokens in any 60 s for the upstream as a whole, the
// tenants served by their weights, work-conserving, each tenant's calls
// in arrival order, a tokens window that frees on its own.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "admission/upstream.hpp"

using namespace spindle;
using namespace spindle::admission;
using namespace std::chrono_literals;

namespace {

struct fake_clock {
  std::atomic<int64_t> ms{5000000};
  limiter::clock_fn fn() {
    return [this] { return ms.load(); };
  }
};

upstream_limits at_once(uint64_t n) {
  upstream_limits l;
  l.concurrency = n;
  return l;
}

} // namespace

TEST_CASE("upstream: past its concurrency calls wait, and a lone tenant "
          "gets all of it in arrival order",
          "[upstream]") {
  fake_clock clock;
  auto q = upstream_queue::make(at_once(2), {}, clock.fn());
  std::vector<upstream_slot_ptr> running;
  std::mutex mx;
  std::vector<int> sent;
  for (int i = 0; i < 6; ++i) {
    auto w = q->acquire("a", 10, [&, i](upstream_slot_ptr s, int64_t) {
      std::lock_guard<std::mutex> guard{mx};
      sent.push_back(i);
      running.push_back(std::move(s));
    });
    if (w.slot) {
      sent.push_back(i);
      running.push_back(std::move(w.slot));
    } else {
      CHECK(w.position == static_cast<uint64_t>(i - 1));
      CHECK(w.waiting == static_cast<uint64_t>(i - 1));
    }
  }
  CHECK(sent == std::vector<int>{0, 1});
  CHECK(q->counts().waiting == 4);
  CHECK(q->waiting_by_tenant()
        == std::vector<std::pair<std::string, uint64_t>>{{"a", 4}});
  // Each end sends the next, in order.
  for (int k = 0; k < 4; ++k) {
    auto first = running.front();
    running.erase(running.begin());
    first->settle(10);
  }
  CHECK(sent == std::vector<int>{0, 1, 2, 3, 4, 5});
  auto c = q->counts();
  CHECK(c.sent == 6);
  CHECK(c.queued == 4);
  CHECK(c.waiting == 0);
  CHECK(c.running == 2);
}

TEST_CASE("upstream: a withdrawn call is never sent and does not hold the "
          "others",
          "[upstream]") {
  fake_clock clock;
  auto q = upstream_queue::make(at_once(1), {}, clock.fn());
  auto first = q->acquire("a", 1, {});
  REQUIRE(first.slot);
  std::vector<std::string> sent;
  upstream_slot_ptr held;
  auto record = [&](std::string name) {
    return [&, name](upstream_slot_ptr s, int64_t) {
      sent.push_back(name);
      held = std::move(s);
    };
  };
  auto b = q->acquire("b", 1, record("b"));
  auto c = q->acquire("c", 1, record("c"));
  REQUIRE_FALSE(b.slot);
  REQUIRE_FALSE(c.slot);
  CHECK(q->withdraw(b.ticket));
  CHECK_FALSE(q->withdraw(b.ticket));
  first.slot.reset(); // ends unsettled: its slot frees all the same
  CHECK(sent == std::vector<std::string>{"c"});
  CHECK_FALSE(q->withdraw(c.ticket)); // sent already
}

TEST_CASE("upstream: backlogged tenants get their weight's share of the "
          "calls over 60 s, and a light tenant waits at most a slot",
          "[upstream][fairness]") {
  // Simulated time: 4 calls at once, each served 100 ms; tenant A keeps
  // 50 calls outstanding, B to E one or two each, as clients that send
  // the next call when one ends. A discrete-event simulation, so the
  // figures are exact and the test takes no minute.
  fake_clock clock;
  std::map<std::string, uint64_t> weights{
    {"A", 1}, {"B", 2}, {"C", 1}, {"D", 1}, {"E", 1}};
  std::map<std::string, int> outstanding{
    {"A", 50}, {"B", 2}, {"C", 1}, {"D", 2}, {"E", 1}};
  auto q = upstream_queue::make(
    at_once(4), [&](std::string_view t) { return weights[std::string{t}]; },
    clock.fn());
  constexpr int64_t service_ms = 100;
  constexpr int64_t run_ms = 60000;
  struct end {
    int64_t at;
    uint64_t seq;
    std::string tenant;
    upstream_slot_ptr slot;
    bool operator>(const end& o) const {
      return std::tie(at, seq) > std::tie(o.at, o.seq);
    }
  };
  std::priority_queue<end, std::vector<end>, std::greater<end>> ends;
  uint64_t seq = 0;
  std::map<std::string, uint64_t> sent_count;
  std::map<std::string, std::vector<int64_t>> waits;
  std::function<void(const std::string&)> send;
  auto on_sent = [&](const std::string& tenant, upstream_slot_ptr slot,
                     int64_t waited) {
    if (clock.ms < 5000000 + run_ms) {
      ++sent_count[tenant];
      waits[tenant].push_back(waited);
    }
    ends.push(end{clock.ms + service_ms, seq++, tenant, std::move(slot)});
  };
  send = [&](const std::string& tenant) {
    auto w = q->acquire(tenant, 1,
                        [&, tenant](upstream_slot_ptr s, int64_t waited) {
                          on_sent(tenant, std::move(s), waited);
                        });
    if (w.slot)
      on_sent(tenant, std::move(w.slot), 0);
  };
  // They arrive interleaved at the start.
  for (int k = 0; k < 50; ++k)
    for (auto& [tenant, n] : outstanding)
      if (k < n)
        send(tenant);
  while (!ends.empty() && clock.ms < 5000000 + run_ms) {
    auto e = ends.top();
    ends.pop();
    clock.ms = e.at;
    // The call ends; its client sends the next one at once.
    e.slot->settle(1);
    e.slot.reset();
    send(e.tenant);
  }
  uint64_t total = 0;
  uint64_t weight_sum = 0;
  for (auto& [t, n] : sent_count)
    total += n;
  for (auto& [t, w] : weights)
    weight_sum += w;
  // 4 slots of 100 ms for 60 s: 2,400 calls, all of them used.
  CHECK(total >= 2396);
  double sum_x = 0, sum_x2 = 0;
  for (auto& [t, w] : weights) {
    double share = static_cast<double>(sent_count[t]) / total;
    double expected = static_cast<double>(w) / weight_sum;
    INFO(t << ": " << sent_count[t] << " calls, share " << share
           << " for weight share " << expected);
    CHECK(std::abs(share - expected) <= 0.1 * expected);
    double x = share / expected;
    sum_x += x;
    sum_x2 += x * x;
  }
  double jain = sum_x * sum_x / (weights.size() * sum_x2);
  INFO("Jain's index " << jain);
  CHECK(jain >= 0.95);
  // B's wait for the upstream, p95: at most one slot's service + 50 ms.
  auto b = waits["B"];
  std::sort(b.begin(), b.end());
  auto p95 = b[b.size() * 95 / 100];
  INFO("B waits p95 " << p95 << " ms");
  CHECK(p95 <= service_ms + 50);
  // The calls still held end with the test: nothing more is sent into
  // the containers going away.
  q->stop();
}

TEST_CASE("upstream: a tenant that was idle banks no credit: it starts at "
          "the others' place",
          "[upstream][fairness]") {
  fake_clock clock;
  auto q = upstream_queue::make(at_once(1), {}, clock.fn());
  std::vector<std::string> order;
  std::vector<upstream_slot_ptr> held;
  auto record = [&](std::string name) {
    return [&, name](upstream_slot_ptr s, int64_t) {
      order.push_back(name);
      held.push_back(std::move(s));
    };
  };
  auto end_one = [&] {
    auto s = held.front();
    held.erase(held.begin());
    s.reset();
  };
  auto first = q->acquire("A", 1, record("A"));
  REQUIRE(first.slot);
  for (int i = 0; i < 30; ++i)
    q->acquire("A", 1, record("A"));
  // A sends ten alone.
  first.slot.reset();
  while (order.size() < 10)
    end_one();
  // B comes: it is next, and then they alternate. Its absence while A
  // sent gives it no run of its own.
  for (int i = 0; i < 5; ++i)
    q->acquire("B", 1, record("B"));
  while (order.size() < 22)
    end_one();
  std::vector<std::string> tail(order.begin() + 10, order.end());
  std::vector<std::string> want{"B", "A", "B", "A", "B", "A",
                                "B", "A", "B", "A", "A", "A"};
  CHECK(tail == want);
  q->stop();
}

TEST_CASE("upstream: tokens per minute hold calls until the window frees, "
          "the timer sends them without another call ending",
          "[upstream]") {
  fake_clock clock;
  upstream_limits l;
  l.tokens_per_min = 1000;
  auto q = upstream_queue::make(l, {}, clock.fn());
  std::atomic<int> sent_later{0};
  for (int i = 0; i < 3; ++i) {
    auto w = q->acquire("a", 300, {});
    REQUIRE(w.slot);
    w.slot->settle(300);
  }
  // 900 charged: 300 more do not fit until the first leave the window.
  auto w = q->acquire("a", 300, [&](upstream_slot_ptr s, int64_t waited) {
    CHECK(waited >= 60000);
    s->settle(300);
    ++sent_later;
  });
  REQUIRE_FALSE(w.slot);
  clock.ms += 59000;
  std::this_thread::sleep_for(600ms);
  CHECK(sent_later == 0);
  clock.ms += 1000;
  // The timer looks again within a quarter of a second.
  for (int i = 0; i < 200 && sent_later == 0; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK(sent_later == 1);
  // A call larger than the whole window goes alone, once nothing else is
  // charged or in flight.
  clock.ms += 60000;
  auto huge = q->acquire("a", 5000, {});
  CHECK(huge.slot);
}

TEST_CASE("upstream: many threads at once never send more than its "
          "concurrency, and every call is sent once",
          "[upstream][concurrency]") {
  auto q = upstream_queue::make(at_once(3), {});
  constexpr int threads = 8;
  constexpr int calls = 1500;
  std::atomic<int> held{0}, most{0}, done{0};
  std::mutex ready_mx;
  std::vector<upstream_slot_ptr> ready;
  auto hold = [&] {
    auto now = ++held;
    auto seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
  };
  auto finish = [&](upstream_slot_ptr s) {
    --held;
    s->settle(1);
    ++done;
  };
  auto drain = [&] {
    std::vector<upstream_slot_ptr> mine;
    {
      std::lock_guard<std::mutex> guard{ready_mx};
      mine.swap(ready);
    }
    for (auto& s : mine)
      finish(std::move(s));
    return !mine.empty();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      auto tenant = "t" + std::to_string(t % 5);
      for (int i = 0; i < calls; ++i) {
        auto w = q->acquire(tenant, 1, [&](upstream_slot_ptr s, int64_t) {
          hold();
          std::lock_guard<std::mutex> guard{ready_mx};
          ready.push_back(std::move(s));
        });
        if (w.slot) {
          hold();
          finish(std::move(w.slot));
        }
        drain();
      }
    });
  for (auto& th : pool)
    th.join();
  while (drain()) {
  }
  CHECK(done == threads * calls);
  CHECK(most.load() <= 3);
  auto c = q->counts();
  CHECK(c.waiting == 0);
  CHECK(c.running == 0);
  CHECK(c.sent == static_cast<uint64_t>(threads * calls));
}
