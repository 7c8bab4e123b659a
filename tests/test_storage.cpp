// Durable state through the runtime facade: every kind of state survives a
// restart exactly as acknowledged; threads and context windows are
// activated from the store and passivated under a resident cap without
// changing a single answer; concurrent writers commit in groups without
// losing or reordering anything.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <sqlite3.h>

#include "llm_doubles.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

runtime_options durable(const test::test_store& dir, uint64_t max_resident = 0,
                        std::chrono::milliseconds idle = 0ms) {
  runtime_options opts;
  dir.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  activation_options a;
  a.max_resident = max_resident;
  a.idle_timeout = idle;
  opts.context.activation = a;
  opts.conversation.registry.activation = a;
  opts.conversation.memory = true;
  return opts;
}

std::vector<std::string> contents(const std::vector<turn>& turns) {
  std::vector<std::string> out;
  for (auto& t : turns)
    out.push_back(t.content);
  return out;
}

std::vector<std::string> item_ids(const std::vector<context_item>& items) {
  std::vector<std::string> out;
  for (auto& x : items)
    out.push_back(x.id());
  return out;
}

std::string name(const char* prefix, size_t i) {
  return prefix + std::to_string(i);
}

} // namespace

TEST_CASE("storage: threads, turns, clears and forks survive a restart "
          "exactly") {
  test::test_store dir;
  thread_snapshot before_a;
  thread_snapshot before_b;
  std::string forked;
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.add_turn("a", make_system_turn("be brief")));
    REQUIRE(rt.add_turn("a", make_user_turn("hello")));
    REQUIRE(rt.add_turn("a", make_assistant_turn("hi", true)));
    REQUIRE(rt.add_turn("a", make_tool_turn("42", "call-1")));
    REQUIRE(rt.add_turn("b", make_user_turn("gone soon")));
    REQUIRE(rt.clear_thread("b") == uint64_t{1});
    REQUIRE(rt.add_turn("b", make_user_turn("after the clear")));
    auto ref = rt.call<thread_ref>(rt.thread_registry(), 5s, fork_atom::value,
                                   std::string{"a"});
    REQUIRE(ref);
    forked = ref->thread_id;
    REQUIRE(rt.add_turn(forked, make_user_turn("only in the fork")));
    auto a = rt.snapshot("a");
    auto b = rt.snapshot("b");
    REQUIRE(a);
    REQUIRE(b);
    before_a = *a;
    before_b = *b;
  }
  runtime rt{durable(dir)};
  auto a = rt.snapshot("a");
  auto b = rt.snapshot("b");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->turns == before_a.turns); // roles, contents, timestamps, flags
  CHECK(b->turns == before_b.turns);
  CHECK(b->epoch == 1);
  CHECK(contents(b->turns) == std::vector<std::string>{"after the clear"});
  auto f = rt.history(forked, 100);
  REQUIRE(f);
  REQUIRE(f->size() == 5);
  CHECK(f->back().content == "only in the fork");
  auto list = rt.list_threads();
  REQUIRE(list);
  auto expected = std::vector<std::string>{"a", "b", forked};
  std::sort(expected.begin(), expected.end());
  CHECK(*list == expected);
  CHECK(rt.count_threads() == uint64_t{3});
  // Reading an unknown thread after a restart still creates nothing.
  auto none = rt.read_history("nobody", 10);
  REQUIRE(none);
  CHECK_FALSE(none->found);
  CHECK(rt.count_threads() == uint64_t{3});
}

TEST_CASE("storage: context windows keep their items, order, bounds and "
          "counters across a restart") {
  test::test_store dir;
  std::vector<context_item> before;
  context_stats stats_before;
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.configure_context("w", window_options{3, 0}));
    for (int i = 0; i < 5; ++i)
      REQUIRE(rt.add_context("w", context_type::text,
                             "note " + std::to_string(i)));
    auto removed = rt.context_items("w");
    REQUIRE(removed);
    REQUIRE(rt.remove_context_item("w", removed->front().id()));
    REQUIRE(rt.add_context("w", context_type::code, "int x = 1;",
                           nlohmann::json{{"language", "cpp"}}));
    REQUIRE(rt.add_context("cleared", context_type::text, "x"));
    REQUIRE(rt.clear_context("cleared") == uint64_t{1});
    auto items = rt.context_items("w");
    auto stats = rt.get_context_stats("w");
    REQUIRE(items);
    REQUIRE(stats);
    before = *items;
    stats_before = *stats;
  }
  runtime rt{durable(dir)};
  auto items = rt.context_items("w");
  REQUIRE(items);
  CHECK(item_ids(*items) == item_ids(before));
  CHECK(*items == before);
  auto stats = rt.get_context_stats("w");
  REQUIRE(stats);
  CHECK(stats->capacity == 3);
  CHECK(stats->size == stats_before.size);
  CHECK(stats->added == stats_before.added);
  CHECK(stats->evicted == stats_before.evicted);
  CHECK(stats->removed == stats_before.removed);
  auto cleared = rt.get_context_stats("cleared");
  REQUIRE(cleared);
  CHECK(cleared->size == 0);
  CHECK(cleared->cleared == 1);
  // The window keeps working where it stopped: FIFO at capacity 3.
  auto added = rt.add_context("w", context_type::text, "after restart");
  REQUIRE(added);
  REQUIRE(added->evicted.size() == 1);
  CHECK(added->evicted.front() == before.front().id());
  // IDs continue above everything handed out, and a stored ID cannot be
  // restored into another window (D4 across restarts).
  auto id_before = parse_context_id(before.back().id());
  auto id_after = parse_context_id(added->item.id());
  REQUIRE(id_before);
  REQUIRE(id_after);
  CHECK(*id_after > *id_before);
  auto dup = rt.restore_context("other", before.back());
  REQUIRE_FALSE(dup);
  CHECK(classify(dup.error()) == errc::already_exists);
  CHECK(rt.context_items("other")->empty());
}

TEST_CASE("storage: long-term memories survive a restart and stay scoped") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.store_memory("Alice keeps bees in Lyon",
                            memory_tags("alice", "")));
    REQUIRE(rt.store_memory("Bob grows tomatoes in Oslo",
                            memory_tags("bob", "")));
  }
  runtime rt{durable(dir)};
  auto alice = rt.retrieve_memory("alice", "t", "where are the bees?");
  REQUIRE(alice);
  CHECK(alice->text.find("Lyon") != std::string::npos);
  CHECK(alice->text.find("Oslo") == std::string::npos);
  auto bob = rt.retrieve_memory("bob", "t", "bees");
  REQUIRE(bob);
  CHECK(bob->text.find("Lyon") == std::string::npos);
}

TEST_CASE("storage: 10k threads with at most 1k resident answer exactly "
          "as if all were in memory") {
  test::test_store dir;
  constexpr size_t threads = 10000;
  constexpr size_t cap = 1000;
  runtime rt{durable(dir, cap)};
  // Writers on 4 threads, each thread ID written by one writer, two turns
  // per thread in two rounds (so every thread is passivated and activated
  // again in between).
  constexpr size_t writers = 4;
  std::atomic<size_t> failures{0};
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> pool;
    for (size_t w = 0; w < writers; ++w)
      pool.emplace_back([&, w] {
        for (size_t i = w; i < threads; i += writers) {
          auto content = name("turn ", i) + " round " + std::to_string(round);
          auto n = rt.add_turn(name("t", i), make_user_turn(content));
          if (!n || *n != static_cast<uint64_t>(round + 1))
            ++failures;
        }
      });
    for (auto& t : pool)
      t.join();
  }
  CHECK(failures == 0);
  // The last activations may still be passivating their least recently
  // used neighbours (resident counts those until they stopped): wait for
  // the table to settle, at most a few seconds.
  auto stats = rt.thread_stats();
  REQUIRE(stats);
  for (int i = 0; i < 300 && stats && stats->resident > cap; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
    stats = rt.thread_stats();
  }
  REQUIRE(stats);
  CHECK(stats->resident <= cap);
  CHECK(stats->passivations >= threads - cap);
  CHECK(stats->activations >= threads - cap); // round 2 reloaded them
  size_t wrong = 0;
  for (size_t i = 0; i < threads; ++i) {
    auto h = rt.history(name("t", i), 10);
    if (!h
        || contents(*h)
             != std::vector<std::string>{name("turn ", i) + " round 0",
                                         name("turn ", i) + " round 1"})
      ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(rt.count_threads() == uint64_t{threads});
  stats = rt.thread_stats();
  REQUIRE(stats);
  CHECK(stats->resident <= cap);
}

TEST_CASE("storage: context windows are passivated under a cap and "
          "reloaded exactly") {
  test::test_store dir;
  constexpr size_t windows = 600;
  runtime rt{durable(dir, 50)};
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < windows; ++i)
      REQUIRE(rt.add_context(name("w", i), context_type::text,
                             name("item ", i) + "." + std::to_string(round)));
  auto dstats = rt.call<context_directory_stats>(rt.context_directory(), 5s,
                                                 ctx_stats_atom::value);
  REQUIRE(dstats);
  CHECK(dstats->managers <= 50);
  for (size_t i = 0; i < windows; ++i) {
    auto items = rt.context_items(name("w", i));
    REQUIRE(items);
    REQUIRE(items->size() == 3);
    for (int round = 0; round < 3; ++round)
      CHECK(items->at(static_cast<size_t>(round)).content()
            == name("item ", i) + "." + std::to_string(round));
  }
}

TEST_CASE("storage: idle threads are passivated after the idle timeout") {
  test::test_store dir;
  runtime rt{durable(dir, 0, 50ms)};
  for (size_t i = 0; i < 20; ++i)
    REQUIRE(rt.add_turn(name("idle", i), make_user_turn("x")));
  auto deadline = std::chrono::steady_clock::now() + 10s;
  uint64_t resident = 20;
  while (resident > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    auto stats = rt.thread_stats();
    REQUIRE(stats);
    resident = stats->resident;
  }
  CHECK(resident == 0);
  auto h = rt.history("idle7", 10);
  REQUIRE(h);
  CHECK(contents(*h) == std::vector<std::string>{"x"});
}

TEST_CASE("storage: concurrent writers lose nothing and keep per-thread "
          "order across a restart") {
  for (size_t writers : {1, 4, 16}) {
    DYNAMIC_SECTION(writers << " writers") {
      test::test_store dir;
      constexpr size_t per_writer = 300;
      constexpr size_t shared_threads = 8;
      {
        runtime rt{durable(dir, 4)}; // a tiny cap: constant passivation
        std::atomic<size_t> failures{0};
        std::vector<std::thread> pool;
        for (size_t w = 0; w < writers; ++w)
          pool.emplace_back([&, w] {
            for (size_t i = 0; i < per_writer; ++i) {
              auto thread = name("shared", i % shared_threads);
              auto content = name("w", w) + ":" + std::to_string(i);
              if (!rt.add_turn(thread, make_user_turn(content)))
                ++failures;
            }
          });
        for (auto& t : pool)
          t.join();
        REQUIRE(failures == 0);
      }
      runtime rt{durable(dir, 4)};
      size_t total = 0;
      for (size_t s = 0; s < shared_threads; ++s) {
        auto snap = rt.snapshot(name("shared", s));
        REQUIRE(snap);
        total += snap->turns.size();
        // Each writer's turns appear in the order it wrote them.
        std::vector<long> last(writers, -1);
        for (auto& t : snap->turns) {
          auto colon = t.content.find(':');
          auto w = std::stoul(t.content.substr(1, colon - 1));
          auto i = std::stol(t.content.substr(colon + 1));
          CHECK(i > last[w]);
          last[w] = i;
        }
      }
      CHECK(total == writers * per_writer);
    }
  }
}

TEST_CASE("storage: reads racing the first writes of new threads and "
          "windows never fail the writes") {
  // A read of a thread or window that does not exist yet loads it without
  // creating; a write that arrives during that load must still create it
  // (it was answered with no actor at all, and a message failed with 503).
  test::test_store dir;
  runtime rt{durable(dir, 64)};
  constexpr size_t threads = 200, readers = 3, writers = 3;
  std::atomic<size_t> failed_writes{0}, wrong_reads{0};
  std::vector<std::thread> pool;
  for (size_t w = 0; w < readers + writers; ++w)
    pool.emplace_back([&, w] {
      for (size_t i = 0; i < threads; ++i) {
        auto id = name("race-", i);
        if (w < readers) {
          // Not found, or what a writer stored: never anything else.
          auto h = rt.read_history(id);
          if (!h && classify(h.error()) != errc::not_found)
            ++wrong_reads;
          auto items = rt.context_items(id);
          if (!items && classify(items.error()) != errc::not_found)
            ++wrong_reads;
        } else {
          if (!rt.add_turn(id, make_user_turn("w" + std::to_string(w))))
            ++failed_writes;
          if (!rt.add_context(id, context_type::text, "item"))
            ++failed_writes;
        }
      }
    });
  for (auto& t : pool)
    t.join();
  CHECK(failed_writes == 0);
  CHECK(wrong_reads == 0);
  for (size_t i = 0; i < threads; ++i) {
    auto snap = rt.snapshot(name("race-", i));
    REQUIRE(snap);
    CHECK(snap->turns.size() == writers);
    auto items = rt.context_items(name("race-", i));
    REQUIRE(items);
    CHECK(items->size() == writers);
  }
}

TEST_CASE("storage: exchanges over passivated threads keep the whole "
          "conversation") {
  test::test_store dir;
  {
    runtime rt{durable(dir, 2)};
    for (int round = 0; round < 3; ++round)
      for (int t = 0; t < 5; ++t) {
        auto r = rt.send_message(name("chat", static_cast<size_t>(t)),
                                 "message " + std::to_string(round), "u");
        REQUIRE(r);
        CHECK(r->turns == static_cast<uint64_t>(2 * (round + 1)));
        CHECK(r->history_turns == static_cast<uint64_t>(2 * round));
      }
  }
  runtime rt{durable(dir, 2)};
  auto h = rt.history("chat3", 100);
  REQUIRE(h);
  REQUIRE(h->size() == 6);
  for (size_t i = 0; i < 6; ++i)
    CHECK(h->at(i).role == (i % 2 == 0 ? turn_role::user
                                       : turn_role::assistant));
}

TEST_CASE("storage: in-memory mode keeps nothing after the runtime stops") {
  runtime_options opts;
  opts.storage.data_dir = ":memory:";
  {
    runtime rt{opts};
    CHECK_FALSE(rt.state_store());
    REQUIRE(rt.add_turn("m", make_user_turn("x")));
    REQUIRE(rt.add_context("m", context_type::text, "y"));
  }
  runtime rt{opts};
  CHECK(rt.count_threads() == uint64_t{0});
  CHECK(rt.context_items("m")->empty());
}

TEST_CASE("storage: a corrupt database or one of a newer schema is refused "
          "at start and left untouched", "[sqlite]") {
  test::test_store dir;
  auto db_path = dir.path() / "spindle.db";
  SECTION("corrupt") {
    {
      std::ofstream out{db_path, std::ios::binary};
      out << std::string(8192, 'x');
    }
    auto rt = runtime::start(durable(dir));
    REQUIRE_FALSE(rt);
    CHECK(classify(rt.error()) == errc::storage_failure);
    CHECK(std::filesystem::file_size(db_path) == 8192);
  }
  SECTION("newer schema") {
    { runtime rt{durable(dir)}; }
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(db_path.string().c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "PRAGMA user_version = 99;", nullptr, nullptr,
                         nullptr)
            == SQLITE_OK);
    sqlite3_close(db);
    auto rt = runtime::start(durable(dir));
    REQUIRE_FALSE(rt);
    CHECK(classify(rt.error()) == errc::storage_failure);
    CHECK(describe(rt.error()).find("newer") != std::string::npos);
  }
}

TEST_CASE("storage: a data directory is owned by one process: a second "
          "one is refused at start and the owner's state is untouched",
          "[sqlite]") {
  test::test_store dir;
  auto data = dir.path().string();
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.add_turn("owned", make_user_turn("first")));
    // Bounded: a second server that did start would serve until killed.
    auto second = test::run({"timeout", "20", test::spindle_binary(), "serve",
                             "--port", "0", "--data", data});
    CHECK(second.exit_code == 1);
    CHECK(second.err.find("in use by another process") != std::string::npos);
    // The owner goes on as if nothing happened.
    REQUIRE(rt.add_turn("owned", make_user_turn("second")));
    auto h = rt.history("owned", 10);
    REQUIRE(h);
    REQUIRE(h->size() == 2);
    CHECK(h->at(1).content == "second");
  }
  // Once the owner stops, the directory is free again, with everything.
  runtime rt{durable(dir)};
  auto h = rt.history("owned", 10);
  REQUIRE(h);
  REQUIRE(h->size() == 2);
  CHECK(h->at(0).content == "first");
}

TEST_CASE("storage: the log is checkpointed into the database while the "
          "store commits, and nothing is lost", "[sqlite]") {
  test::test_store dir;
  auto db_file = dir.path() / "spindle.db";
  const size_t writers = 4;
  const size_t per_writer = 2000;
  const std::string filler(4096, 'c'); // 32 MiB of turns in all
  {
    runtime rt{durable(dir)};
    auto at_start = std::filesystem::file_size(db_file);
    std::vector<std::thread> pool;
    std::atomic<size_t> failed{0};
    for (size_t w = 0; w < writers; ++w)
      pool.emplace_back([&, w] {
        for (size_t i = 0; i < per_writer; ++i)
          if (!rt.add_turn(name("cp", w),
                           make_user_turn(std::to_string(i) + filler)))
            ++failed;
      });
    for (auto& t : pool)
      t.join();
    REQUIRE(failed == 0);
    // Committed pages reach the database file while the runtime runs: the
    // checkpointer copied them. (Without checkpoints they would stay in
    // the log until the last connection closes.)
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::filesystem::file_size(db_file) < at_start + (16u << 20)
           && std::chrono::steady_clock::now() < deadline) {
      REQUIRE(rt.add_turn("cp-tick", make_user_turn("tick")));
      std::this_thread::sleep_for(50ms);
    }
    CHECK(std::filesystem::file_size(db_file) >= at_start + (16u << 20));
  }
  runtime rt{durable(dir)};
  for (size_t w = 0; w < writers; ++w) {
    auto h = rt.history(name("cp", w), 10000);
    REQUIRE(h);
    REQUIRE(h->size() == per_writer);
    for (size_t i = 0; i < per_writer; ++i)
      REQUIRE(h->at(i).content == std::to_string(i) + filler);
  }
}

namespace {

// Rows of `table` in the store of `dir`, read beside the runtime.
int64_t rows_in(const test::test_store& dir, const char* table) {
  try {
    return std::stoll(dir.query(std::string{"SELECT count(*) FROM "} + table
                                + ";"));
  } catch (const std::exception&) {
    return -1;
  }
}

// Runs `sql` on a connection of its own beside the runtime's, as an
// operator (or a failing disk) would, on memory.db.
bool exec_in_memory_db(const test::test_store& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  auto path = (dir.path() / "memory.db").string();
  bool ok = sqlite3_open(path.c_str(), &db) == SQLITE_OK
            && sqlite3_busy_timeout(db, 5000) == SQLITE_OK
            && sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr)
                 == SQLITE_OK;
  sqlite3_close(db);
  return ok;
}

// Makes the store of `dir` (created first) refuse every insert into
// `table` whose new row matches `when` (NEW.column ...), with the error
// "disk says no": a trigger in SQLite or in PostgreSQL.
void refuse(const test::test_store& dir, const runtime_options& opts,
            const std::string& table, const std::string& when) {
  { runtime rt{opts}; } // creates the schema
  // On SQLite long-term memory has a file of its own.
  if (table.rfind("memor", 0) == 0 && !dir.on_postgres()) {
    REQUIRE(exec_in_memory_db(dir, "CREATE TRIGGER refuse BEFORE INSERT ON "
                                     + table + " WHEN " + when
                                     + " BEGIN SELECT RAISE(ABORT, 'disk "
                                       "says no'); END;"));
  } else {
    dir.refuse("refuse", "BEFORE INSERT", table, when, "disk says no");
  }
}

// Durable options without long-term memory, over a database of `dir`
// that refuses the inserts into `table` matching `when`.
runtime_options refusing(const test::test_store& dir, const std::string& table,
                         const std::string& when) {
  auto opts = durable(dir);
  opts.conversation.memory = false;
  refuse(dir, opts, table, when);
  return opts;
}

// Runs `clients` threads calling `write(c, i)` for i < n, and `meanwhile()`
// once every one of them is under way; returns the writes that failed.
template <class Write, class Meanwhile>
size_t concurrently(size_t clients, size_t n, Write write,
                    Meanwhile meanwhile) {
  std::atomic<size_t> written{0};
  std::atomic<size_t> failed{0};
  std::vector<std::thread> threads;
  for (size_t c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      for (size_t i = 0; i < n; ++i) {
        if (!write(c, i))
          ++failed;
        ++written;
      }
    });
  while (written < clients * std::min<size_t>(n, 3))
    std::this_thread::yield();
  meanwhile();
  for (auto& t : threads)
    t.join();
  return failed;
}

} // namespace

TEST_CASE("storage: a turn whose write fails is an error, is neither seen "
          "nor stored, and the writes committed beside it are kept") {
  for (size_t clients : {1, 4, 16}) {
    CAPTURE(clients);
    test::test_store dir;
    auto opts = refusing(dir, "turn_journal", "NEW.content = 'boom'");
    const size_t turns = 30;
    auto check_all = [&](runtime& rt) {
      auto t = rt.history("t", 100);
      REQUIRE(t);
      CHECK(contents(*t) == std::vector<std::string>{"before", "after"});
      for (size_t c = 0; c < clients; ++c) {
        auto h = rt.history(name("w", c), 100);
        REQUIRE(h);
        std::vector<std::string> want;
        for (size_t i = 0; i < turns; ++i)
          want.push_back(name("t", i));
        CHECK(contents(*h) == want);
      }
    };
    {
      runtime rt{opts};
      REQUIRE(rt.add_turn("t", make_user_turn("before")));
      auto write = [&](size_t c, size_t i) {
        return static_cast<bool>(
          rt.add_turn(name("w", c), make_user_turn(name("t", i))));
      };
      // The refused write goes while the others commit around it.
      auto failed = concurrently(clients, turns, write, [&] {
        auto boom = rt.add_turn("t", make_user_turn("boom"));
        REQUIRE_FALSE(boom);
        CHECK(classify(boom.error()) == errc::storage_failure);
        CHECK(describe(boom.error()).find("disk says no")
              != std::string::npos);
        REQUIRE(rt.add_turn("t", make_user_turn("after")));
      });
      CHECK(failed == 0);
      check_all(rt);
      CHECK(rt.store_stats().failed_writes == 1);
    }
    CHECK(rows_in(dir, "turns") + rows_in(dir, "turn_journal")
          == static_cast<int64_t>(2 + clients * turns));
    runtime rt{opts};
    check_all(rt);
  }
}

TEST_CASE("storage: a message whose user turn cannot be stored fails with "
          "storage_failure, none of its reply reaches the client, and the "
          "thread takes the next message") {
  test::test_store dir;
  auto opts = refusing(dir, "turn_journal", "NEW.content = 'boom'");
  // The provider streams while the user turn commits (its deltas wait for
  // the commit); an instant one and one that takes its time.
  for (auto delay : {0, 20}) {
    CAPTURE(delay);
    opts.provider = std::make_shared<test::echo_provider>(
      std::chrono::milliseconds(delay));
    runtime rt{opts};
    auto thread = "t" + std::to_string(delay);
    std::atomic<int> deltas{0};
    auto count = [&](std::string_view) {
      ++deltas;
      return true;
    };
    auto boom = rt.send_message(thread, "boom", "", conflict_policy::queue, 12,
                                count);
    REQUIRE_FALSE(boom);
    CHECK(classify(boom.error()) == errc::storage_failure);
    CHECK(deltas == 0);
    auto h = rt.history(thread, 100);
    REQUIRE(h);
    CHECK(h->empty());
    auto next = rt.send_message(thread, "hello", "", conflict_policy::queue,
                                12, count);
    REQUIRE(next);
    CHECK(next->turns == 2);
    CHECK(deltas > 0);
    h = rt.history(thread, 100);
    REQUIRE(h);
    CHECK(contents(*h)
          == std::vector<std::string>{"hello", next->reply});
  }
}

TEST_CASE("storage: a context item whose write fails is an error, its "
          "window is loaded again from what committed, and the items "
          "committed beside it are kept") {
  for (size_t clients : {1, 4, 16}) {
    CAPTURE(clients);
    test::test_store dir;
    auto opts = refusing(dir, "context_items", "NEW.item LIKE '%boom%'");
    const size_t items = 20;
    auto contents_of = [](runtime& rt, const std::string& window) {
      std::vector<std::string> out;
      auto got = rt.context_items(window);
      REQUIRE(got);
      for (auto& item : *got)
        out.push_back(item.content());
      return out;
    };
    auto check_all = [&](runtime& rt) {
      CHECK(contents_of(rt, "w")
            == std::vector<std::string>{"before", "after"});
      std::vector<std::string> want;
      for (size_t i = 0; i < items; ++i)
        want.push_back(name("i", i));
      for (size_t c = 0; c < clients; ++c)
        CHECK(contents_of(rt, name("n", c)) == want);
    };
    {
      runtime rt{opts};
      REQUIRE(rt.add_context("w", context_type::text, "before"));
      auto write = [&](size_t c, size_t i) {
        return static_cast<bool>(
          rt.add_context(name("n", c), context_type::text, name("i", i)));
      };
      auto failed = concurrently(clients, items, write, [&] {
        auto boom = rt.add_context("w", context_type::text, "boom");
        REQUIRE_FALSE(boom);
        CHECK(classify(boom.error()) == errc::storage_failure);
        CHECK(describe(boom.error()).find("disk says no")
              != std::string::npos);
        REQUIRE(rt.add_context("w", context_type::text, "after"));
      });
      CHECK(failed == 0);
      check_all(rt);
      CHECK(rt.store_stats().failed_writes == 1);
    }
    runtime rt{opts};
    check_all(rt);
  }
}

TEST_CASE("storage: a memory whose write fails is an error and is never "
          "retrieved, and the memories stored beside it are kept") {
  test::test_store dir;
  auto opts = durable(dir);
  refuse(dir, opts, "memories", "NEW.content LIKE '%boom%'");
  auto check_all = [](runtime& rt) {
    auto got = rt.retrieve_memory("alice", "t", "bees boom hives");
    REQUIRE(got);
    CHECK(got->text.find("Lyon") != std::string::npos);
    CHECK(got->text.find("Paris") != std::string::npos);
    CHECK(got->text.find("boom") == std::string::npos);
  };
  {
    runtime rt{opts};
    REQUIRE(rt.store_memory("Alice keeps bees in Lyon",
                            memory_tags("alice", "")));
    auto boom = rt.store_memory("Alice keeps boom bees",
                                memory_tags("alice", ""));
    REQUIRE_FALSE(boom);
    CHECK(classify(boom.error()) == errc::storage_failure);
    REQUIRE(rt.store_memory("Alice has hives in Paris",
                            memory_tags("alice", "")));
    check_all(rt);
  }
  runtime rt{opts};
  check_all(rt);
}

TEST_CASE("storage: stores committed together fail one by one: of many "
          "concurrent memory stores, exactly those the database refuses "
          "fail") {
  test::test_store dir;
  auto opts = durable(dir);
  refuse(dir, opts, "memories", "NEW.content LIKE '%boom%'");
  runtime rt{opts};
  constexpr int clients = 8, each = 50;
  std::atomic<int> wrong{0}, refused{0};
  std::vector<std::thread> pool;
  for (int c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      for (int i = 0; i < each; ++i) {
        bool bad = i % 5 == 0;
        auto got = rt.store_memory("Writer" + std::to_string(c) + " note"
                                     + std::to_string(i)
                                     + (bad ? " boom" : " calm"),
                                   memory_tags("w" + std::to_string(c), ""));
        if (bad && !got
            && classify(got.error()) == errc::storage_failure)
          ++refused;
        else if (bad || !got)
          ++wrong;
      }
    });
  for (auto& t : pool)
    t.join();
  CHECK(wrong == 0);
  CHECK(refused == clients * each / 5);
  auto stored = [&](const char* sql) -> int64_t {
    if (dir.on_postgres())
      return std::stoll(dir.query(sql));
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir.path() / "memory.db").c_str(), &db)
            == SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
    auto n = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return n;
  };
  CHECK(stored("SELECT count(*) FROM memories;") == clients * each * 4 / 5);
  CHECK(stored("SELECT count(*) FROM memories WHERE content LIKE '%boom%';")
        == 0);
}

TEST_CASE("storage: turns journaled and not yet folded survive a restart, "
          "clears included, and the next start folds them") {
  test::test_store dir;
  auto opts = durable(dir);
  opts.storage.fold_every = 1000000; // nothing folds while it runs
  {
    runtime rt{opts};
    for (int i = 0; i < 5; ++i) {
      REQUIRE(rt.add_turn("kept", make_user_turn(name("k", i))));
      REQUIRE(rt.add_turn("cleared", make_user_turn(name("c", i))));
    }
    REQUIRE(rt.clear_thread("cleared") == uint64_t{5});
    REQUIRE(rt.add_turn("cleared", make_user_turn("after the clear")));
  }
  // Every acknowledged turn is stored; those after the last load (which
  // folds first) are still in the journal.
  CHECK(rows_in(dir, "turn_journal") + rows_in(dir, "turns") == 6);
  CHECK(rows_in(dir, "turn_journal") >= 4);
  {
    runtime rt{opts};
    // The start folded the journal into the table.
    CHECK(rows_in(dir, "turn_journal") == 0);
    CHECK(rows_in(dir, "turns") == 6);
    auto kept = rt.history("kept", 100);
    REQUIRE(kept);
    CHECK(contents(*kept)
          == std::vector<std::string>{"k0", "k1", "k2", "k3", "k4"});
    auto cleared = rt.history("cleared", 100);
    REQUIRE(cleared);
    CHECK(contents(*cleared) == std::vector<std::string>{"after the clear"});
    REQUIRE(rt.add_turn("kept", make_user_turn("k5")));
  }
  runtime rt{opts};
  auto kept = rt.history("kept", 100);
  REQUIRE(kept);
  CHECK(kept->size() == 6);
  CHECK(kept->back().content == "k5");
}

TEST_CASE("storage: a load folds the journal only when the journal holds "
          "the loaded thread's turns, and every history stays exact") {
  test::test_store dir;
  auto opts = durable(dir, 2); // at most 2 threads resident
  opts.conversation.memory = false;
  opts.storage.fold_every = 1000000; // only loads fold
  runtime rt{opts};
  for (int i = 0; i < 3; ++i)
    REQUIRE(rt.add_turn("a", make_user_turn(name("a", static_cast<size_t>(i)))));
  CHECK(rows_in(dir, "turn_journal") == 3);
  // New threads and a new context window are loaded without a fold: none
  // of their rows can be in the journal.
  for (int t = 0; t < 4; ++t)
    REQUIRE(rt.add_turn(name("n", static_cast<size_t>(t)),
                            make_user_turn(name("m", static_cast<size_t>(t)))));
  REQUIRE(rt.add_context("w", context_type::text, "an item"));
  CHECK(rows_in(dir, "turn_journal") == 7);
  // "a" was passivated (the cap is 2); loading it again folds first.
  auto stats = rt.thread_stats();
  for (int i = 0; i < 300 && stats && stats->resident > 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
    stats = rt.thread_stats();
  }
  REQUIRE(stats);
  REQUIRE(stats->passivations >= 3);
  auto a = rt.history("a", 100);
  REQUIRE(a);
  CHECK(contents(*a) == std::vector<std::string>{"a0", "a1", "a2"});
  if (test::postgres_run()) {
    // Other nodes may append to a shared database's journal: a load reads
    // both tables and never folds (docs/cluster.md).
    CHECK(rows_in(dir, "turn_journal") == 7);
  } else {
    CHECK(rows_in(dir, "turn_journal") == 0);
    CHECK(rows_in(dir, "turns") == 7);
  }
  for (int t = 0; t < 4; ++t) {
    auto h = rt.history(name("n", static_cast<size_t>(t)), 100);
    REQUIRE(h);
    CHECK(contents(*h) == std::vector<std::string>{name("m", static_cast<size_t>(t))});
  }
}

TEST_CASE("storage: the store counts every committed write once, in fewer "
          "commits when writers are concurrent, and the turns each fold "
          "moved") {
  for (size_t clients : {1, 4, 16}) {
    for (bool group : {true, false}) {
      CAPTURE(clients, group);
      test::test_store dir;
      auto opts = durable(dir);
      opts.conversation.memory = false;
      opts.storage.group_commit = group;
      opts.storage.fold_every = 1000000; // only loads fold
      runtime rt{opts};
      const size_t turns = 40;
      auto write = [&](size_t c, size_t i) {
        return static_cast<bool>(
          rt.add_turn(name("w", c), make_user_turn(name("t", i))));
      };
      REQUIRE(concurrently(clients, turns, write, [] {}) == 0);
      auto stats = rt.store_stats();
      // One write creates each thread, one stores each turn.
      CHECK(stats.writes == clients * (turns + 1));
      CHECK(stats.failed_writes == 0);
      CHECK(stats.commits >= 1);
      if (!group || clients == 1)
        CHECK(stats.commits == stats.writes); // one write in flight
      else
        CHECK(stats.commits <= stats.writes);
      CHECK(stats.commit_seconds > 0);
      CHECK(stats.folds == 1); // the start's, of an empty journal
      CHECK(stats.folded_turns == 0);
      CHECK(rows_in(dir, "turn_journal")
            == static_cast<int64_t>(clients * turns));
    }
  }
  // Folds: every 7 writes, each counting the turns it moved.
  test::test_store dir;
  auto opts = durable(dir);
  opts.conversation.memory = false;
  opts.storage.fold_every = 7;
  runtime rt{opts};
  for (size_t i = 0; i < 30; ++i)
    REQUIRE(rt.add_turn("f", make_user_turn(name("t", i))));
  auto stats = rt.store_stats();
  CHECK(stats.writes == 31);
  CHECK(stats.folds >= 1 + 30 / 7);
  CHECK(stats.fold_seconds > 0);
  CHECK(static_cast<int64_t>(stats.folded_turns)
        == rows_in(dir, "turns"));
  CHECK(rows_in(dir, "turns") + rows_in(dir, "turn_journal") == 30);
  // In memory there is no store to count.
  runtime_options in_memory;
  in_memory.storage.data_dir = ":memory:";
  in_memory.conversation.memory = false;
  runtime mem{in_memory};
  REQUIRE(mem.add_turn("m", make_user_turn("x")));
  CHECK(mem.store_stats().writes == 0);
  CHECK(mem.store_stats().commits == 0);
}

TEST_CASE("storage: after a small commit the store lingers for the next "
          "write, or not at all when told not to, and every write is "
          "answered and stored as before") {
  for (auto linger : {std::chrono::microseconds{50000},
                      std::chrono::microseconds{0}}) {
    CAPTURE(linger.count());
    test::test_store dir;
    auto opts = durable(dir);
    opts.conversation.memory = false;
    opts.storage.linger = linger;
    std::vector<std::string> written;
    {
      runtime rt{opts};
      // One caller, one write in flight: every commit carries one write,
      // and the next one arrives well within 50 ms of its answer.
      for (size_t i = 0; i < 40; ++i) {
        written.push_back(name("t", i));
        REQUIRE(rt.add_turn("solo", make_user_turn(written.back())));
      }
      auto stats = rt.store_stats();
      CHECK(stats.commits == 41); // the thread's creation, then each turn
      if (linger.count() > 0) {
        // The linger after the last commit may still be running.
        CHECK(stats.lingers + 1 >= stats.commits);
        CHECK(stats.lingers <= stats.commits);
        CHECK(stats.linger_hits + 1 >= stats.lingers);
        CHECK(stats.linger_hits <= stats.lingers);
        CHECK(stats.linger_seconds > 0);
      } else {
        CHECK(stats.lingers == 0);
        CHECK(stats.linger_hits == 0);
        CHECK(stats.linger_seconds == 0);
      }
      auto h = rt.history("solo", 100);
      REQUIRE(h);
      CHECK(contents(*h) == written);
    }
    runtime again{opts};
    auto h = again.history("solo", 100);
    REQUIRE(h);
    CHECK(contents(*h) == written);
  }
}

TEST_CASE("storage: the journal folds every few writes while threads are "
          "written and activated, and every history stays exact") {
  test::test_store dir;
  auto opts = durable(dir, 4); // at most 4 resident: loads interleave
  opts.storage.fold_every = 7;
  {
    runtime rt{opts};
    for (int round = 0; round < 6; ++round)
      for (int t = 0; t < 10; ++t)
        REQUIRE(rt.add_turn(name("f", static_cast<size_t>(t)),
                            make_user_turn(name("r", static_cast<size_t>(
                                                       round)))));
    for (int t = 0; t < 10; ++t) {
      auto h = rt.history(name("f", static_cast<size_t>(t)), 100);
      REQUIRE(h);
      CHECK(contents(*h)
            == std::vector<std::string>{"r0", "r1", "r2", "r3", "r4", "r5"});
    }
  }
  CHECK(rows_in(dir, "turns") + rows_in(dir, "turn_journal") == 60);
  CHECK(rows_in(dir, "turns") >= 56); // folds ran along the way
}

namespace {

// Sends every request `send(self, i)` for i < n from `self` without
// waiting, then collects the answers in the order they were sent.
template <class Send>
std::vector<caf::expected<uint64_t>>
pipeline(caf::scoped_actor& self, size_t n, Send send) {
  std::vector<decltype(send(self, size_t{0}))> handles;
  handles.reserve(n);
  for (size_t i = 0; i < n; ++i)
    handles.push_back(send(self, i));
  std::vector<caf::expected<uint64_t>> out;
  for (auto& h : handles)
    h.receive([&](uint64_t x) { out.emplace_back(x); },
              [&](caf::error& err) { out.emplace_back(std::move(err)); });
  return out;
}

} // namespace

TEST_CASE("storage: appends pipelined into one thread by many clients are "
          "answered with their own position and stored in the order each "
          "client sent them, around a refused one") {
  for (size_t clients : {1, 4, 16}) {
    CAPTURE(clients);
    test::test_store dir;
    auto opts = refusing(dir, "turn_journal", "NEW.content = 'boom'");
    const size_t depth = 64;
    auto sent = [&](size_t c, size_t i) {
      // Client 0 sends one refused turn in the middle of its pipeline.
      return c == 0 && i == depth / 2 ? std::string{"boom"}
                                      : name("c", c) + "-" + name("t", i);
    };
    std::vector<std::vector<caf::expected<uint64_t>>> answers(clients);
    {
      runtime rt{opts};
      auto registry = rt.thread_registry();
      std::vector<std::thread> pool;
      for (size_t c = 0; c < clients; ++c)
        pool.emplace_back([&, c] {
          caf::scoped_actor client{rt.system()};
          answers[c] = pipeline(client, depth, [&](auto& self, size_t i) {
            return self->request(registry, 30s, caf::add_atom::value,
                                 std::string{"shared"},
                                 make_user_turn(sent(c, i)));
          });
        });
      for (auto& t : pool)
        t.join();
      auto h = rt.history("shared", 100000);
      REQUIRE(h);
      auto stored = contents(*h);
      REQUIRE(stored.size() == clients * depth - 1);
      std::set<uint64_t> positions;
      for (size_t c = 0; c < clients; ++c) {
        REQUIRE(answers[c].size() == depth);
        uint64_t last = 0;
        for (size_t i = 0; i < depth; ++i) {
          auto& a = answers[c][i];
          if (sent(c, i) == "boom") {
            REQUIRE_FALSE(a);
            CHECK(classify(a.error()) == errc::storage_failure);
            continue;
          }
          REQUIRE(a);
          // The answer is the turn count right after this turn: the turn
          // sits at that position, and a client's answers only grow.
          REQUIRE(*a >= 1);
          REQUIRE(*a <= stored.size());
          CHECK(stored[*a - 1] == sent(c, i));
          CHECK(*a > last);
          last = *a;
          CHECK(positions.insert(*a).second);
        }
      }
      CHECK(positions.size() == stored.size());
    }
    // What was answered is what is stored, in the same order.
    runtime rt{opts};
    auto h = rt.history("shared", 100000);
    REQUIRE(h);
    auto stored = contents(*h);
    REQUIRE(stored.size() == clients * depth - 1);
    for (size_t c = 0; c < clients; ++c)
      for (size_t i = 0; i < depth; ++i)
        if (answers[c][i])
          CHECK(stored[*answers[c][i] - 1] == sent(c, i));
  }
}

TEST_CASE("storage: a clear and an exchange sent behind appends still in "
          "flight see every one of them") {
  test::test_store dir;
  auto opts = durable(dir);
  opts.conversation.memory = false;
  {
    runtime rt{opts};
    REQUIRE(rt.add_turn("busy", make_user_turn("first")));
    auto ref = rt.call<thread_ref>(rt.thread_registry(), 5s,
                                   caf::get_atom::value, std::string{"busy"});
    REQUIRE(ref);
    auto handle = ref->handle;
    // 10 appends, a clear, 5 appends, an exchange's start (queued behind
    // the clear): all sent at once, answered in that order.
    caf::scoped_actor client{rt.system()}; // holds the exchange
    auto answers = pipeline(client, 17, [&](auto& self, size_t i) {
      if (i == 10)
        return self->request(handle, 30s, caf::reset_atom::value);
      if (i == 16)
        return self->request(handle, 30s, exchange_begin_atom::value,
                             conflict_policy::queue);
      return self->request(handle, 30s, caf::add_atom::value,
                           make_user_turn(name("t", i)));
    });
    REQUIRE(answers.size() == 17);
    for (size_t i = 0; i < 10; ++i) {
      REQUIRE(answers[i]);
      CHECK(*answers[i] == i + 2);
    }
    REQUIRE(answers[10]);
    CHECK(*answers[10] == 11); // the clear removed every appended turn
    for (size_t i = 11; i < 16; ++i) {
      REQUIRE(answers[i]);
      CHECK(*answers[i] == i - 10);
    }
    REQUIRE(answers[16]); // granted: the lease
    // The store counted the thread's creation, 16 turns and the clear; a
    // barrier is no write of its own.
    CHECK(rt.store_stats().writes == 18);
    CHECK(rt.store_stats().failed_writes == 0);
    auto snap = rt.snapshot("busy");
    REQUIRE(snap);
    CHECK(snap->in_exchange);
    CHECK(snap->committed == 5); // the exchange starts from all five
    CHECK(snap->epoch == 1);
    client->request(handle, 5s, exchange_end_atom::value, *answers[16])
      .receive([](uint64_t n) { CHECK(n == 5); },
               [](caf::error& err) { FAIL(describe(err)); });
    // A barrier alone: answered with nothing changed, and no transaction.
    auto before = rt.store_stats();
    client->request(rt.state_store(), 5s, store_atom::value, sql_write{})
      .receive([](uint64_t n) { CHECK(n == 0); },
               [](caf::error& err) { FAIL(describe(err)); });
    CHECK(rt.store_stats().commits == before.commits);
    CHECK(rt.store_stats().writes == before.writes);
  }
  runtime rt{opts};
  auto h = rt.history("busy", 100);
  REQUIRE(h);
  CHECK(contents(*h)
        == std::vector<std::string>{"t11", "t12", "t13", "t14", "t15"});
  CHECK(rt.snapshot("busy")->epoch == 1);
}
