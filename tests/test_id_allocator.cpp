// The ID allocator through the runtime facade: uniqueness and monotonicity
// under concurrency, bulk ranges, durability across restarts, exhaustion and
// the errors a caller can cause.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <sqlite3.h>

#include "spindle/messages/hybrid36.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;

namespace {

runtime_options durable(const test::test_store& dir) {
  runtime_options opts;
  dir.apply(opts.storage);
  return opts;
}

} // namespace

TEST_CASE("id allocator: concurrent callers get unique IDs, each caller's "
          "strictly increasing, together exactly 1..N") {
  for (size_t threads : {1, 2, 4, 8, 16}) {
    DYNAMIC_SECTION(threads << " threads x 10000 requests") {
      constexpr size_t per_thread = 10000;
      runtime rt;
      std::vector<std::vector<uint64_t>> got(threads);
      std::atomic<size_t> errors{0};
      std::vector<std::thread> workers;
      for (size_t t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
          got[t].reserve(per_thread);
          for (size_t i = 0; i < per_thread; ++i) {
            auto id = rt.next_context_id();
            if (!id) {
              ++errors;
              continue;
            }
            got[t].push_back(*parse_context_id(*id));
          }
        });
      for (auto& w : workers)
        w.join();
      REQUIRE(errors == 0);
      std::vector<uint64_t> all;
      for (auto& seq : got) {
        REQUIRE(seq.size() == per_thread);
        for (size_t i = 1; i < seq.size(); ++i)
          REQUIRE(seq[i - 1] < seq[i]);
        all.insert(all.end(), seq.begin(), seq.end());
      }
      std::sort(all.begin(), all.end());
      REQUIRE(all.size() == threads * per_thread);
      for (size_t i = 0; i < all.size(); ++i)
        REQUIRE(all[i] == i + 1); // no duplicate, no gap without a restart
    }
  }
}

TEST_CASE("id allocator: concurrent task IDs under shared and private "
          "parents are unique and increasing per caller") {
  runtime rt;
  auto orch = rt.next_orchestration_id();
  REQUIRE(orch);
  REQUIRE(*orch == "0001");
  constexpr size_t threads = 8, per_thread = 500;
  std::vector<std::vector<std::string>> shared(threads);
  std::vector<std::thread> workers;
  // Catch's assertions are not thread-safe: the workers count, the main
  // thread asserts.
  std::atomic<size_t> failed{0};
  for (size_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (size_t i = 0; i < per_thread; ++i) {
        if (auto id = rt.next_task_id(*orch))
          shared[t].push_back(*id);
        else
          ++failed;
      }
    });
  for (auto& w : workers)
    w.join();
  REQUIRE(failed == 0);
  std::set<uint64_t> seqs;
  for (auto& ids : shared) {
    uint64_t prev = 0;
    for (auto& id : ids) {
      auto parsed = task_id::parse(id);
      REQUIRE(parsed);
      REQUIRE(parsed->parent()->to_string() == "0001");
      REQUIRE(parsed->sequence() > prev);
      prev = parsed->sequence();
      REQUIRE(seqs.insert(prev).second);
    }
  }
  CHECK(seqs.size() == threads * per_thread);
  CHECK(*seqs.rbegin() == threads * per_thread);
}

TEST_CASE("id allocator: idle counters beyond the cap are forgotten and "
          "continue above their durable mark: never a repeat, each caller "
          "increasing, also across a restart") {
  test::test_store dir;
  auto opts = durable(dir);
  opts.ids.max_counters = 8;
  constexpr size_t threads = 8, per_thread = 400, parents = 64;
  auto parent = [](size_t k) {
    return task_id{1, {static_cast<uint64_t>(k + 1)}}.to_string();
  };
  std::map<std::string, std::set<uint64_t>> seen;
  std::atomic<size_t> failed{0}, decreased{0};
  {
    runtime rt{opts};
    std::vector<std::map<std::string, std::vector<uint64_t>>> got(threads);
    std::vector<std::thread> workers;
    for (size_t t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t));
        for (size_t i = 0; i < per_thread; ++i) {
          auto p = parent(rng() % parents);
          auto id = rt.next_task_id(p);
          if (!id) {
            ++failed;
            continue;
          }
          auto seq = task_id::parse(*id)->sequence();
          auto& mine = got[t][p];
          if (!mine.empty() && mine.back() >= seq)
            ++decreased;
          mine.push_back(seq);
        }
      });
    for (auto& w : workers)
      w.join();
    REQUIRE(failed == 0);
    CHECK(decreased == 0);
    for (auto& per_parent : got)
      for (auto& [p, seqs] : per_parent)
        for (auto seq : seqs)
          CHECK(seen[p].insert(seq).second); // never handed out twice
    auto stats = rt.call<id_stats>(rt.id_allocator(), std::chrono::seconds(5),
                                   stats_atom::value);
    REQUIRE(stats);
    // At most the cap, plus the one being looked up when it was reached.
    CHECK(stats->counters <= opts.ids.max_counters + 1);
    CHECK(stats->task == threads * per_thread);
  }
  runtime rt{opts};
  for (size_t k = 0; k < parents; ++k) {
    auto p = parent(k);
    auto seq = task_id::parse(rt.next_task_id(p).value())->sequence();
    if (!seen[p].empty())
      CHECK(seq > *seen[p].rbegin());
  }
}

TEST_CASE("id allocator: k consecutive IDs at once, contiguous and in "
          "order, never overlapping other callers") {
  runtime rt;
  auto first = rt.next_context_ids(5);
  REQUIRE(first);
  CHECK(*first == std::vector<std::string>{"ctx-1", "ctx-2", "ctx-3",
                                           "ctx-4", "ctx-5"});
  // Larger than a reservation block: waits for the reservation, then serves.
  auto big = rt.next_ids("ctx", 10000);
  REQUIRE(big);
  CHECK(big->first == 6);
  CHECK(big->count == 10000);
  CHECK(rt.next_context_id() == std::string{"ctx-10006"});
  auto tasks = rt.next_task_ids("0001_t1", 3);
  REQUIRE(tasks);
  CHECK(*tasks == std::vector<std::string>{"0001_t1.1", "0001_t1.2",
                                           "0001_t1.3"});

  std::vector<std::thread> workers;
  std::mutex mx;
  std::vector<id_range> ranges;
  std::atomic<size_t> failed{0};
  for (int t = 0; t < 8; ++t)
    workers.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto r = rt.next_ids("ctx", 1 + (t + i) % 7);
        if (!r) {
          ++failed;
          continue;
        }
        std::lock_guard<std::mutex> guard{mx};
        ranges.push_back(*r);
      }
    });
  for (auto& w : workers)
    w.join();
  REQUIRE(failed == 0);
  std::sort(ranges.begin(), ranges.end(),
            [](auto& a, auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < ranges.size(); ++i)
    REQUIRE(ranges[i - 1].last() + 1 == ranges[i].first);
}

TEST_CASE("id allocator: after a restart every new ID is above every ID "
          "handed out before") {
  test::test_store dir;
  uint64_t last_ctx = 0, last_orch = 0, last_task = 0;
  {
    runtime rt{durable(dir)};
    for (int i = 0; i < 100; ++i)
      last_ctx = *parse_context_id(*rt.next_context_id());
    auto bulk = rt.next_ids("ctx", 9000); // crosses a reservation block
    REQUIRE(bulk);
    last_ctx = bulk->last();
    for (int i = 0; i < 70; ++i)
      last_orch = *hybrid36::parse(*rt.next_orchestration_id());
    for (int i = 0; i < 3; ++i)
      last_task = task_id::parse(*rt.next_task_id("0001_t1"))->sequence();
  }
  for (int restart = 0; restart < 3; ++restart) {
    runtime rt{durable(dir)};
    auto ctx = *parse_context_id(*rt.next_context_id());
    auto orch = *hybrid36::parse(*rt.next_orchestration_id());
    auto task = task_id::parse(*rt.next_task_id("0001_t1"))->sequence();
    CHECK(ctx > last_ctx);
    CHECK(orch > last_orch);
    CHECK(task > last_task);
    last_ctx = ctx;
    last_orch = orch;
    last_task = task;
  }
}

TEST_CASE("id allocator: reservations are written once per block, not once "
          "per ID") {
  test::test_store dir;
  auto opts = durable(dir);
  opts.ids.context_block = 1000;
  {
    runtime rt{opts};
    for (int i = 0; i < 2500; ++i)
      REQUIRE(rt.next_context_id());
  }
  auto mark
    = std::stoll(dir.query("SELECT high_water FROM counters WHERE key='ctx'"));
  // The mark covers everything handed out and runs at most two blocks ahead.
  CHECK(mark >= 2500);
  CHECK(mark <= 2500 + 2 * 1000);
}

TEST_CASE("id allocator: orchestration IDs cross every tier and stop at "
          "ZZZZ with a clear error") {
  runtime rt;
  // Jump close to the tier boundary 9999 -> A000, then keep going.
  REQUIRE(rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                            advance_atom::value, std::string{"global"},
                            uint64_t{9997}));
  CHECK(rt.next_orchestration_id() == std::string{"9998"});
  CHECK(rt.next_orchestration_id() == std::string{"9999"});
  CHECK(rt.next_orchestration_id() == std::string{"A000"});
  CHECK(rt.next_orchestration_id() == std::string{"A001"});
  REQUIRE(rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                            advance_atom::value, std::string{"global"},
                            hybrid36::max_ordinal - 2));
  CHECK(rt.next_orchestration_id() == std::string{"ZZZY"});
  CHECK(rt.next_orchestration_id() == std::string{"ZZZZ"});
  auto past = rt.next_orchestration_id();
  REQUIRE_FALSE(past);
  CHECK(classify(past.error()) == errc::exhausted);
  CHECK(describe(past.error()).find("global") != std::string::npos);
}

TEST_CASE("id allocator: with durable counters ZZZZ is handed out once and "
          "every request after it is refused - also after a restart") {
  test::test_store dir;
  auto advance_to = [](runtime& rt, const std::string& key, uint64_t value) {
    REQUIRE(rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                              advance_atom::value, key, value));
  };
  auto refused = [](runtime& rt) {
    auto past = rt.next_orchestration_id();
    REQUIRE_FALSE(past);
    CHECK(classify(past.error()) == errc::exhausted);
  };
  {
    runtime rt{durable(dir)};
    advance_to(rt, "global", hybrid36::max_ordinal - 2);
    CHECK(rt.next_orchestration_id() == std::string{"ZZZY"});
    CHECK(rt.next_orchestration_id() == std::string{"ZZZZ"});
    refused(rt);
    refused(rt);
  }
  for (int restart = 0; restart < 2; ++restart) {
    runtime rt{durable(dir)};
    refused(rt);
    // A bulk request cannot reach past the end either.
    auto bulk = rt.next_ids("global", 2);
    REQUIRE_FALSE(bulk);
    CHECK(classify(bulk.error()) == errc::exhausted);
  }
  // A task level ends at the same value.
  {
    runtime rt{durable(dir)};
    advance_to(rt, "0001", hybrid36::max_ordinal - 1);
    CHECK(rt.next_task_id("0001") == std::string{"0001_t736335"});
    CHECK_FALSE(rt.next_task_id("0001"));
  }
  runtime rt{durable(dir)};
  CHECK_FALSE(rt.next_task_id("0001"));
}

TEST_CASE("id allocator: restoring an explicit ID advances the counter past "
          "it (D4)") {
  runtime rt;
  auto next = rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                                advance_atom::value, std::string{"ctx"},
                                uint64_t{41});
  REQUIRE(next);
  CHECK(*next == 42);
  CHECK(rt.next_context_id() == std::string{"ctx-42"});
  // Advancing below the counter changes nothing.
  CHECK(rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                          advance_atom::value, std::string{"ctx"},
                          uint64_t{5})
        == uint64_t{43});
  CHECK(rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                          peek_atom::value, std::string{"ctx"})
        == uint64_t{43});
}

TEST_CASE("id allocator: bad requests get a clear error and change no "
          "counter") {
  runtime rt;
  REQUIRE(rt.next_context_id() == std::string{"ctx-1"});
  auto zero = rt.next_ids("ctx", 0);
  REQUIRE_FALSE(zero);
  CHECK(classify(zero.error()) == errc::invalid_argument);
  for (auto bad : {"../x", "", "0000", "0001_t0", "GLOBAL", "ctx-1"}) {
    INFO(bad);
    auto r = rt.next_ids(bad, 1);
    REQUIRE_FALSE(r);
    CHECK(classify(r.error()) == errc::invalid_id);
  }
  auto bad_parent = rt.next_task_id("a/b");
  REQUIRE_FALSE(bad_parent);
  CHECK(describe(bad_parent.error()).find("'a/b' is not a task ID")
        != std::string::npos);
  CHECK(rt.next_context_id() == std::string{"ctx-2"});
}

TEST_CASE("runtime: asynchronous calls from many threads each complete "
          "exactly once") {
  runtime rt;
  constexpr int threads = 8, per_thread = 500;
  std::mutex mx;
  std::condition_variable cv;
  std::vector<uint64_t> got;
  int done = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i)
        rt.next_ids_async("ctx", 1, [&](caf::expected<id_range> r) {
          std::lock_guard<std::mutex> guard{mx};
          if (r)
            got.push_back(r->first);
          ++done;
          cv.notify_all();
        });
    });
  for (auto& w : workers)
    w.join();
  std::unique_lock<std::mutex> lock{mx};
  REQUIRE(cv.wait_for(lock, std::chrono::seconds(30),
                      [&] { return done == threads * per_thread; }));
  std::sort(got.begin(), got.end());
  REQUIRE(got.size() == static_cast<size_t>(threads * per_thread));
  for (size_t i = 0; i < got.size(); ++i)
    REQUIRE(got[i] == i + 1);
}

TEST_CASE("runtime: stop is idempotent and later calls fail as unavailable") {
  runtime rt;
  REQUIRE(rt.next_context_id());
  rt.stop();
  rt.stop();
  CHECK_FALSE(rt.running());
  auto after = rt.next_context_id();
  REQUIRE_FALSE(after);
  CHECK(classify(after.error()) == errc::unavailable);
  bool called = false;
  rt.next_ids_async("ctx", 1, [&](caf::expected<id_range> r) {
    called = true;
    CHECK_FALSE(r);
  });
  CHECK(called);
}

TEST_CASE("runtime: many runtimes start and stop from many threads without "
          "hanging") {
  std::vector<std::thread> workers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    workers.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        runtime rt;
        if (rt.next_context_id() == std::string{"ctx-1"})
          ++ok;
      }
    });
  for (auto& w : workers)
    w.join();
  CHECK(ok == 40);
}

TEST_CASE("runtime: storage that cannot be opened is a clear error at start",
          "[sqlite]") {
  test::temp_dir dir;
  auto in_dir = [&] {
    runtime_options opts;
    opts.storage.data_dir = dir.str();
    return opts;
  };
  SECTION("a data directory below a regular file") {
    std::ofstream{dir.path() / "file"} << "x";
    runtime_options opts;
    opts.storage.data_dir = (dir.path() / "file" / "data").string();
    auto rt = runtime::start(opts);
    REQUIRE_FALSE(rt);
    CHECK(classify(rt.error()) == errc::storage_failure);
    CHECK(describe(rt.error()).find("cannot create data directory")
          != std::string::npos);
    CHECK_THROWS_AS(runtime{opts}, startup_error);
  }
  SECTION("a corrupt database file") {
    std::ofstream{dir.path() / "spindle.db"}
      << std::string(8192, 'x') << "not a database";
    auto rt = runtime::start(in_dir());
    REQUIRE_FALSE(rt);
    CHECK(describe(rt.error()).find("spindle.db") != std::string::npos);
  }
  SECTION("a database of a newer schema is refused and left untouched") {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir.path() / "spindle.db").c_str(), &db)
            == SQLITE_OK);
    sqlite3_exec(db, "PRAGMA user_version = 99;", nullptr, nullptr, nullptr);
    sqlite3_close(db);
    auto rt = runtime::start(in_dir());
    REQUIRE_FALSE(rt);
    CHECK(describe(rt.error()).find("newer") != std::string::npos);
    REQUIRE(sqlite3_open((dir.path() / "spindle.db").c_str(), &db)
            == SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    sqlite3_prepare_v2(db, "PRAGMA user_version;", -1, &stmt, nullptr);
    REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
    CHECK(sqlite3_column_int(stmt, 0) == 99);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  }
}
