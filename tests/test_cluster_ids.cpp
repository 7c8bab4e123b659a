// IDs in a cluster (docs/ids.md, "Clusters"): two runtimes in this
// process on one PostgreSQL database, as two `spindle serve` nodes are.
// Every ID is unique across them, never reused after a restart or a lost
// connection, and monotonic across them: an ID handed out after another
// ID's request was answered, on either node, is larger. Runs only on the
// PostgreSQL run (tests/CMakeLists.txt).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "spindle/messages/task_id.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

// A node: a runtime on the shared database, with a data directory of its
// own (as each `spindle serve` has) and no long-term memory (one node
// serves a database's memory at a time).
class node {
public:
  explicit node(const test::test_store& store) : url_(store.url()) {
    if (url_.empty())
      throw std::runtime_error("a node needs PostgreSQL: run on the "
                               "PostgreSQL run (SPINDLE_TEST_PG_DIR)");
    start();
  }
  runtime& operator*() {
    return *rt_;
  }
  runtime* operator->() {
    return rt_.get();
  }
  void stop() {
    rt_.reset();
  }
  void start() {
    runtime_options opts;
    opts.storage.data_dir = dir_.str();
    opts.storage.store = url_;
    opts.conversation.memory = false;
    rt_ = std::make_unique<runtime>(opts);
  }

private:
  std::string url_;
  test::temp_dir dir_;
  std::unique_ptr<runtime> rt_;
};

// A fresh database and two nodes on it.
struct two_nodes {
  two_nodes() : a(store), b(store) {
  }
  test::test_store store;
  node a;
  node b;
};

// One answered request: when it was sent, when its answer came, what it got.
struct call {
  steady::time_point sent;
  steady::time_point answered;
  uint64_t first = 0;
  uint64_t last = 0;
};

// Asks `rt` for `count` values of `key`, timed; an error goes to `failure`.
std::optional<call> timed_next(runtime& rt, const std::string& key,
                               uint64_t count, caf::error& failure) {
  call c;
  c.sent = steady::now();
  auto r = rt.next_ids(key, count);
  c.answered = steady::now();
  if (!r) {
    failure = r.error();
    return std::nullopt;
  }
  c.first = r->first;
  c.last = r->last();
  return c;
}

// Runs `threads` threads at once, the even ones on node `a`, the odd ones
// on `b`; thread t's i-th request asks for `count(t, i)` values of
// `key(t, i)`. Returns every answered call by key; `failed` gets every
// error.
template <class Key, class Count, class Failed>
std::map<std::string, std::vector<call>>
from_both(runtime& a, runtime& b, size_t threads, size_t per_thread, Key key,
          Count count, Failed failed) {
  std::vector<std::map<std::string, std::vector<call>>> got(threads);
  test::barrier start{threads};
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      auto& rt = t % 2 == 0 ? a : b;
      start.arrive_and_wait();
      for (size_t i = 0; i < per_thread; ++i) {
        caf::error err;
        auto k = key(t, i);
        if (auto c = timed_next(rt, k, count(t, i), err))
          got[t][k].push_back(*c);
        else
          failed(err);
      }
    });
  for (auto& w : workers)
    w.join();
  std::map<std::string, std::vector<call>> all;
  for (auto& mine : got)
    for (auto& [k, calls] : mine)
      all[k].insert(all[k].end(), calls.begin(), calls.end());
  return all;
}

// The promise over every answered call of one counter: no value twice,
// and a call sent after another's answer came got only larger values.
// Returns how many pairs broke the order (0 when kept), after checking.
size_t check_promise(std::vector<call> calls) {
  std::sort(calls.begin(), calls.end(),
            [](const call& a, const call& b) { return a.first < b.first; });
  for (size_t i = 1; i < calls.size(); ++i) {
    INFO("ranges " << calls[i - 1].first << ".." << calls[i - 1].last
                   << " and " << calls[i].first << ".." << calls[i].last);
    REQUIRE(calls[i - 1].last < calls[i].first); // unique
  }
  // By answer time, with the largest value answered so far: a call must
  // be above every call answered before it was sent.
  std::sort(calls.begin(), calls.end(), [](const call& a, const call& b) {
    return a.answered < b.answered;
  });
  std::vector<uint64_t> highest(calls.size());
  uint64_t top = 0;
  for (size_t i = 0; i < calls.size(); ++i)
    highest[i] = top = std::max(top, calls[i].last);
  size_t broken = 0;
  for (auto& c : calls) {
    auto before = std::lower_bound(
      calls.begin(), calls.end(), c.sent,
      [](const call& a, steady::time_point t) { return a.answered < t; });
    if (before == calls.begin())
      continue;
    auto i = static_cast<size_t>(before - calls.begin()) - 1;
    if (c.first <= highest[i])
      ++broken;
  }
  return broken;
}

// The counters a cluster shares: context items, orchestrations, and the
// tasks under one parent.
const std::vector<std::string> keys = {"ctx", "global", "0001_t1"};

} // namespace

TEST_CASE("cluster ids: requests alternating between two nodes each get "
          "an ID above every ID answered before, for ctx, orchestration "
          "and task counters",
          "[postgres]") {
  two_nodes nodes;
  auto& [store, a, b] = nodes;
  for (auto& key : keys) {
    INFO(key);
    uint64_t highest = 0;
    for (int i = 0; i < 200; ++i) {
      auto& rt = i % 2 == 0 ? *a : *b;
      auto count = static_cast<uint64_t>(1 + i % 3);
      auto r = rt.next_ids(key, count);
      REQUIRE(r);
      INFO("request " << i << " got " << r->first << ".." << r->last());
      REQUIRE(r->first > highest);
      highest = r->last();
    }
  }
  // Through the ID formats too.
  auto o1 = a->next_orchestration_id();
  auto o2 = b->next_orchestration_id();
  REQUIRE(o1);
  REQUIRE(o2);
  CHECK(*hybrid36::parse(*o2) > *hybrid36::parse(*o1));
  auto t1 = b->next_task_id("0001_t1");
  auto t2 = a->next_task_id("0001_t1");
  REQUIRE(t1);
  REQUIRE(t2);
  CHECK(task_id::parse(*t1)->sequence() < task_id::parse(*t2)->sequence());
}

TEST_CASE("cluster ids: 8 threads over two nodes: every ID unique, and "
          "every call sent after another's answer gets larger IDs, for "
          "ctx, orchestration and task counters",
          "[postgres]") {
  two_nodes nodes;
  auto& [store, a, b] = nodes;
  constexpr size_t threads = 8, per_thread = 300;
  std::atomic<size_t> failed{0};
  auto got = from_both(
    *a, *b, threads, per_thread,
    [](size_t t, size_t i) { return keys[(t + i) % keys.size()]; },
    [](size_t t, size_t i) { return uint64_t{1 + (t + i) % 4}; },
    [&](const caf::error&) { ++failed; });
  REQUIRE(failed == 0);
  for (auto& key : keys) {
    INFO(key);
    CHECK(got[key].size() == threads * per_thread / keys.size());
    CHECK(check_promise(got[key]) == 0);
  }
}

TEST_CASE("cluster ids: advance and peek reach the database, so one node "
          "sees what the other did",
          "[postgres]") {
  two_nodes nodes;
  auto& [store, a, b] = nodes;
  REQUIRE(a->next_context_id() == std::string{"ctx-1"});
  auto peek = [](runtime& rt, const std::string& key) {
    return rt.call<uint64_t>(rt.id_allocator(), 5s, peek_atom::value, key);
  };
  CHECK(peek(*b, "ctx") == uint64_t{2});
  auto advanced = b->call<uint64_t>(b->id_allocator(), 5s,
                                    advance_atom::value, std::string{"ctx"},
                                    uint64_t{41});
  REQUIRE(advanced);
  CHECK(*advanced == 42);
  CHECK(peek(*a, "ctx") == uint64_t{42});
  CHECK(a->next_context_id() == std::string{"ctx-42"});
  // Advancing below the counter changes nothing.
  CHECK(b->call<uint64_t>(b->id_allocator(), 5s, advance_atom::value,
                          std::string{"ctx"}, uint64_t{5})
        == uint64_t{43});
  CHECK(b->next_context_id() == std::string{"ctx-43"});
  // The end of a sequence holds across nodes: ZZZZ once, then refused.
  REQUIRE(a->call<uint64_t>(a->id_allocator(), 5s, advance_atom::value,
                            std::string{"global"},
                            hybrid36::max_ordinal - 2));
  CHECK(b->next_orchestration_id() == std::string{"ZZZY"});
  // A batch larger than what is left is refused, the request after it
  // still served.
  auto too_many = a->next_ids("global", 2);
  REQUIRE_FALSE(too_many);
  CHECK(classify(too_many.error()) == errc::exhausted);
  CHECK(a->next_orchestration_id() == std::string{"ZZZZ"});
  auto past = b->next_orchestration_id();
  REQUIRE_FALSE(past);
  CHECK(classify(past.error()) == errc::exhausted);
}

TEST_CASE("cluster ids: a node restarted while the other hands out IDs "
          "never reissues one, and continues above the other's",
          "[postgres]") {
  two_nodes nodes;
  auto& [store, a, b] = nodes;
  std::map<std::string, uint64_t> highest;
  auto take = [&](runtime& rt, const std::string& key, uint64_t count) {
    auto r = rt.next_ids(key, count);
    REQUIRE(r);
    INFO(key << " got " << r->first << ".." << r->last() << ", highest before "
              << highest[key]);
    CHECK(r->first > highest[key]);
    highest[key] = r->last();
  };
  for (int round = 0; round < 3; ++round) {
    for (auto& key : keys) {
      take(*a, key, 5);
      take(*b, key, 1);
    }
    a.stop();
    for (auto& key : keys)
      take(*b, key, 2);
    a.start();
    for (auto& key : keys) {
      take(*a, key, 1);
      take(*b, key, 3);
    }
  }
  // The database holds exactly what was handed out: no block ahead.
  CHECK(store.query("SELECT high_water FROM counters WHERE key = 'ctx'")
        == std::to_string(highest["ctx"]));
}

TEST_CASE("cluster ids: connections to the database cut while both nodes "
          "hand out IDs: the requests they catch fail as unavailable, none "
          "is answered twice or out of order, and IDs flow again",
          "[postgres]") {
  two_nodes nodes;
  auto& a = nodes.a;
  auto& b = nodes.b;
  constexpr size_t threads = 4, per_thread = 2000;
  std::atomic<size_t> unavailable{0}, other{0};
  std::atomic<bool> done{false};
  std::mutex mx;
  std::string other_error;
  // Ends the counter stores' connections (the ones that run the
  // increment) again and again, wherever they are.
  std::thread cutter{[&] {
    while (!done) {
      try {
        nodes.store.query("SELECT count(pg_terminate_backend(pid)) FROM "
                          "pg_stat_activity WHERE datname = "
                          "current_database() AND pid <> pg_backend_pid() "
                          "AND query LIKE '%RETURNING high_water%';");
      } catch (...) {
      }
      std::this_thread::sleep_for(20ms);
    }
  }};
  auto got = from_both(
    *a, *b, threads, per_thread,
    [](size_t, size_t) { return std::string{"ctx"}; },
    [](size_t, size_t i) { return uint64_t{1 + i % 3}; },
    [&](const caf::error& err) {
      if (classify(err) == errc::storage_unavailable) {
        ++unavailable;
        return;
      }
      ++other;
      std::lock_guard<std::mutex> guard{mx};
      other_error = describe(err);
    });
  done = true;
  cutter.join();
  INFO(other_error);
  CHECK(other == 0);
  CHECK(unavailable > 0); // the cuts caught requests in flight
  auto& all = got["ctx"];
  CHECK(all.size() + unavailable == threads * per_thread);
  CHECK(all.size() > threads * per_thread / 2);
  CHECK(check_promise(all) == 0);
  // After the cuts both nodes answer, above everything before. A
  // connection cut while idle fails the next statement on it, which
  // opens it again.
  uint64_t top = 0;
  for (auto& c : all)
    top = std::max(top, c.last);
  for (auto* n : {&a, &b}) {
    auto r = (*n)->next_ids("ctx", 1);
    if (!r) {
      CHECK(classify(r.error()) == errc::storage_unavailable);
      r = (*n)->next_ids("ctx", 1);
    }
    REQUIRE(r);
    CHECK(r->first > top);
    top = r->first;
  }
  WARN(unavailable << " of " << threads * per_thread
                   << " requests caught by a cut connection");
}
