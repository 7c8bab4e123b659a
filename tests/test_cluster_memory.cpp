// Long-term memory of several processes on one PostgreSQL database
// (docs/memory.md, "On PostgreSQL"): each node here is a memory of its own
// (spawn_memory: its writer, readers, change counters and listener), all
// on one database, as several `spindle serve` processes would be. Entry
// IDs are unique and increase in commit order across nodes, no store or
// deletion is lost to another node's at the same time, and a node's
// readers never keep serving what another node changed past the
// notification's delay, nor after its listener lost its connection; a
// transaction PostgreSQL aborts for a deadlock is run again. Runs only on
// the PostgreSQL run (tests/CMakeLists.txt).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "spindle/messages/error.hpp"
#include "spindle/runtime/actor_pool.hpp"
#include "spindle/runtime/config.hpp"
#include "spindle/runtime/memory.hpp"
#include "storage/postgres/postgres.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

template <class Result, class... Ts>
caf::expected<Result> call(caf::actor_system& sys, const memory_actor& memory,
                           Ts&&... xs) {
  caf::scoped_actor self{sys};
  caf::expected<Result> out = caf::make_error(caf::sec::request_timeout);
  self->request(memory, std::chrono::seconds(30), std::forward<Ts>(xs)...)
    .receive([&](Result& r) { out = std::move(r); },
             [&](caf::error& err) { out = std::move(err); });
  return out;
}

// A node: a memory of its own on the test's database.
struct node {
  node(caf::actor_system& system, const test::test_store& store,
       size_t readers)
    : sys(system) {
    storage_options options;
    store.apply(options);
    memory_options serving;
    serving.readers = readers;
    auto spawned = spawn_memory(sys, options, serving);
    REQUIRE(spawned);
    mem = std::move(*spawned);
  }
  ~node() {
    stop_actor_pool(sys, caf::actor_cast<caf::actor>(mem.actor));
  }

  caf::expected<int64_t> store(const std::string& content,
                               const std::string& user,
                               const std::string& thread) {
    return call<int64_t>(sys, mem.actor, caf::put_atom::value,
                         memory_atom::value, content,
                         memory_tags(user, thread));
  }
  caf::expected<memory_snippet> retrieve(const std::string& user,
                                         const std::string& thread,
                                         const std::string& query) {
    // A request names its thread; a user's scope holds all of its threads.
    return call<memory_snippet>(sys, mem.actor, caf::get_atom::value,
                                memory_atom::value,
                                memory_query{user,
                                             thread.empty() ? "tq" : thread,
                                             query});
  }
  caf::expected<uint64_t> delete_scope(const std::string& user,
                                       const std::string& thread) {
    return call<uint64_t>(sys, mem.actor, caf::delete_atom::value,
                          memory_atom::value, user, thread);
  }
  caf::expected<uint64_t> delete_entry(int64_t id) {
    return call<uint64_t>(sys, mem.actor, caf::delete_atom::value,
                          memory_atom::value, id, std::string{"*"});
  }

  caf::actor_system& sys;
  memory_service mem;
};

// One fresh database for the nodes of a test, and the actor system they
// run in.
struct cluster {
  cluster() {
    REQUIRE(store.on_postgres());
  }
  test::test_store store;
  spindle::config cfg;
  caf::actor_system sys{cfg};
};

// Whether a snippet shows the entry `id`.
auto showing(int64_t id) {
  return [id](const memory_snippet& got) {
    return std::find(got.ids.begin(), got.ids.end(), id) != got.ids.end();
  };
}

// How long a retrieval on one node may take to see another node's change
// here: the notification's delay, pinned generously (docs/memory.md
// gives the measured figures).
constexpr auto visibility_bound = 2s;

// Retrieves on `n` until `seen` says the result shows the change, or the
// bound passed; returns how long it took, or nothing.
template <class Seen>
std::optional<std::chrono::microseconds>
until_seen(node& n, const std::string& user, const std::string& thread,
           const std::string& query, Seen seen) {
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto got = n.retrieve(user, thread, query);
    auto now = std::chrono::steady_clock::now();
    if (got && seen(*got))
      return std::chrono::duration_cast<std::chrono::microseconds>(now
                                                                   - start);
    if (now - start > visibility_bound)
      return std::nullopt;
    std::this_thread::sleep_for(200us);
  }
}


// Retrieves `q` on `n` until one of its readers keeps all it needs (a note
// of another node's change arriving meanwhile sends them to the database
// again), at most the visibility bound; whether one does.
bool keep(node& n, const memory_query& q) {
  auto until = std::chrono::steady_clock::now() + visibility_bound;
  do
    REQUIRE(n.retrieve(q.user_id, q.thread_id, q.query));
  while (!n.mem.kept(q).has_value()
         && std::chrono::steady_clock::now() < until);
  return n.mem.kept(q).has_value();
}

} // namespace

TEST_CASE_METHOD(cluster,
                 "cluster memory: stores from many threads through three "
                 "nodes into shared and distinct scopes are each stored once "
                 "with a unique ID increasing in commit order, lose no update "
                 "of a scope or a term, and every node finds every "
                 "acknowledged entry",
                 "[postgres]") {
  std::vector<std::unique_ptr<node>> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(std::make_unique<node>(sys, store, 2));
  // Every node's readers keep the shared scopes before the stores, so that
  // a reader trusting what it kept would miss the other nodes' entries.
  for (auto& n : nodes) {
    REQUIRE(n->store("Seed of the orchard ledger.", "shared", ""));
    REQUIRE(n->store("Seed of the orchard ledger.", "", "tshared"));
  }
  for (auto& n : nodes)
    for (int again = 0; again < 4; ++again) {
      REQUIRE(n->retrieve("shared", "", "orchard ledger"));
      REQUIRE(n->retrieve("", "tshared", "orchard ledger"));
    }
  constexpr int per_node = 4, stores = 30;
  struct stored {
    int64_t id;
    std::string user, thread, marker;
  };
  std::mutex lock;
  std::vector<stored> all;
  std::atomic<int64_t> highest_acknowledged{0};
  std::atomic<size_t> errors{0}, out_of_order{0};
  std::vector<std::thread> pool;
  for (size_t k = 0; k < nodes.size(); ++k)
    for (int t = 0; t < per_node; ++t)
      pool.emplace_back([&, k, t] {
        auto& n = *nodes[k];
        for (int i = 0; i < stores; ++i) {
          auto marker = "m" + std::to_string(k) + "x" + std::to_string(t)
                        + "x" + std::to_string(i);
          // Shared scopes (a user's, a thread's anonymous entries) and one
          // of this thread's own.
          std::string user, thread;
          switch (i % 3) {
          case 0:
            user = "shared";
            break;
          case 1:
            thread = "tshared";
            break;
          default:
            user = "own" + std::to_string(k) + "x" + std::to_string(t);
          }
          // Every store before this one was acknowledged has committed:
          // this one's ID must be above all of theirs.
          auto before = highest_acknowledged.load();
          auto id = n.store("The orchard ledger notes " + marker
                              + " beside the common words.",
                            user, thread);
          if (!id) {
            ++errors;
            continue;
          }
          if (*id <= before)
            ++out_of_order;
          auto seen = highest_acknowledged.load();
          while (seen < *id
                 && !highest_acknowledged.compare_exchange_weak(seen, *id)) {
          }
          std::lock_guard<std::mutex> guard{lock};
          all.push_back(stored{*id, user, thread, marker});
        }
      });
  for (auto& t : pool)
    t.join();
  CHECK(errors == 0);
  CHECK(out_of_order == 0);
  REQUIRE(all.size() == nodes.size() * per_node * stores);
  std::set<int64_t> ids;
  for (auto& s : all)
    ids.insert(s.id);
  CHECK(ids.size() == all.size());
  // In the database: each entry once, and the index's counts exact (a lost
  // update of a scope row or a term's row would leave them short).
  auto seeds = nodes.size() * 2;
  CHECK(store.query("SELECT count(*) FROM memories;")
        == std::to_string(all.size() + seeds));
  CHECK(store.query("SELECT count(DISTINCT id) FROM memories;")
        == std::to_string(all.size() + seeds));
  CHECK(store.query("SELECT count(*) FROM memory_scopes s WHERE entries <> "
                    "(SELECT count(*) FROM memories m WHERE (s.user_id <> '' "
                    "AND m.user_id = s.user_id) OR (s.user_id = '' AND "
                    "m.user_id = '' AND m.thread_id = s.thread_id));")
        == "0");
  // Every entry holds "orchard": its df in each scope is the scope's count.
  CHECK(store.query("SELECT count(*) FROM memory_scopes s JOIN memory_terms t "
                    "ON t.scope = s.id AND t.term = 'orchard' "
                    "WHERE t.df <> s.entries;")
        == "0");
  CHECK(store.query("SELECT count(*) FROM memory_scopes WHERE entries > 0;")
        == std::to_string(2 + nodes.size() * per_node));
  // Every node finds every acknowledged entry (by its marker, a term only
  // it holds), within the visibility bound.
  size_t unseen = 0;
  for (auto& n : nodes)
    for (auto& s : all)
      if (!until_seen(*n, s.user, s.thread, "orchard " + s.marker,
                      showing(s.id)))
        ++unseen;
  CHECK(unseen == 0);
}

TEST_CASE_METHOD(cluster,
                 "cluster memory: a retrieval on one node sees a store or a "
                 "deletion acknowledged on another within the notification's "
                 "delay, though its readers kept the scope",
                 "[postgres]") {
  node a{sys, store, 2}, b{sys, store, 2};
  for (int i = 0; i < 20; ++i)
    REQUIRE(a.store("Note " + std::to_string(i) + " about the harbour crane.",
                    "u1", "t1"));
  constexpr int rounds = 40;
  std::vector<std::chrono::microseconds> delays;
  size_t first_try = 0, unseen = 0, stale_kept = 0, ghosts = 0;
  memory_query q{"u1", "t1", "the harbour crane"};
  for (int r = 0; r < rounds; ++r) {
    // B's readers keep the scope, and a build on B would answer from them
    // (once the notes of A's last changes came: each one sends B's readers
    // to the database again).
    REQUIRE(keep(b, q));
    auto marker = "r" + std::to_string(r);
    auto id = a.store("The harbour crane moved " + marker + ".", "u1", "t1");
    REQUIRE(id);
    auto sees = showing(*id);
    // Asked with the terms whose lists B kept (a term new to B, such as
    // the marker, would be read from the database anyway).
    if (auto now = b.retrieve("u1", "t1", "the harbour crane");
        now && sees(*now))
      ++first_try;
    auto delay = until_seen(b, "u1", "t1", "the harbour crane", sees);
    if (!delay) {
      ++unseen;
      continue;
    }
    delays.push_back(*delay);
    // What B keeps answers with it too, once B's listener took the note
    // in (another of B's readers may have read the change before that).
    auto kept_by = std::chrono::steady_clock::now() + visibility_bound;
    for (;;) {
      auto kept = b.mem.kept(q);
      if (!kept || !*kept || sees(**kept))
        break;
      if (std::chrono::steady_clock::now() > kept_by) {
        ++stale_kept;
        break;
      }
      std::this_thread::sleep_for(200us);
    }
    // Deleted on A, with B's lists kept again: B stops showing it within
    // the same delay.
    for (int again = 0; again < 4; ++again)
      REQUIRE(b.retrieve("u1", "t1", "the harbour crane"));
    auto gone = a.delete_entry(*id);
    REQUIRE(gone);
    REQUIRE(*gone == 1);
    if (!until_seen(b, "u1", "t1", "the harbour crane",
                    [&](const memory_snippet& got) { return !sees(got); }))
      ++ghosts;
  }
  CHECK(unseen == 0);
  CHECK(stale_kept == 0);
  CHECK(ghosts == 0);
  REQUIRE_FALSE(delays.empty());
  std::sort(delays.begin(), delays.end());
  WARN("cross-node visibility after an acknowledged store: "
       << first_try << " of " << rounds << " seen at the first retrieval; "
       << "p50 " << delays[delays.size() / 2].count() << " us, max "
       << delays.back().count() << " us");
  // A whole scope deleted on B: A's readers stop showing any of it.
  REQUIRE(a.retrieve("u1", "t1", "the harbour crane"));
  auto deleted = b.delete_scope("u1", "");
  REQUIRE(deleted);
  CHECK(*deleted == 20);
  CHECK(until_seen(a, "u1", "t1", "the harbour crane",
                   [](const memory_snippet& got) { return got.ids.empty(); }));
  CHECK(store.query("SELECT entries FROM memory_scopes WHERE user_id = 'u1';")
        == "0");
}

TEST_CASE_METHOD(cluster,
                 "cluster memory: nodes deleting and storing into the same "
                 "scopes at once delete each entry once and keep every count "
                 "exact",
                 "[postgres]") {
  node a{sys, store, 1}, b{sys, store, 1};
  constexpr int first = 300, later = 150; // later: per node
  std::vector<int64_t> ids;
  for (int i = 0; i < first; ++i) {
    auto id = (i % 2 == 0 ? a : b)
                .store("Entry " + std::to_string(i) + " of the mill pond.",
                       "u" + std::to_string(i % 3), "");
    REQUIRE(id);
    ids.push_back(*id);
  }
  // Both nodes delete every entry at once while both store more into the
  // same scopes: each entry is deleted by exactly one of them, and no
  // deletion's rewrite of a term's row undoes a store's, or the reverse.
  std::atomic<uint64_t> deleted{0};
  std::atomic<size_t> errors{0}, added{0};
  std::vector<std::thread> pool;
  for (auto* n : {&a, &b}) {
    pool.emplace_back([&, n] {
      for (auto id : ids) {
        auto got = n->delete_entry(id);
        if (!got)
          ++errors;
        else
          deleted += *got;
      }
    });
    pool.emplace_back([&, n] {
      for (int i = 0; i < later; ++i) {
        if (n->store("Later entry of the mill pond, " + std::to_string(i)
                       + ".",
                     "u" + std::to_string(i % 3), ""))
          ++added;
        else
          ++errors;
      }
    });
  }
  for (auto& t : pool)
    t.join();
  CHECK(errors == 0);
  CHECK(deleted == ids.size());
  CHECK(added == 2 * later);
  CHECK(store.query("SELECT count(*) FROM memories;")
        == std::to_string(2 * later));
  CHECK(store.query("SELECT sum(entries) FROM memory_scopes;")
        == std::to_string(2 * later));
  for (auto term : {"mill", "pond", "entry"})
    CHECK(store.query(std::string{"SELECT count(*) FROM memory_scopes s "
                                  "JOIN memory_terms t ON t.scope = s.id "
                                  "AND t.term = '"}
                      + term + "' WHERE t.df <> s.entries;")
          == "0");
  // A scope deleted on both nodes at once goes once; nothing of it stays.
  std::atomic<uint64_t> scope_deleted{0};
  std::thread other{[&] {
    auto got = b.delete_scope("u0", "");
    if (got)
      scope_deleted += *got;
  }};
  auto got = a.delete_scope("u0", "");
  REQUIRE(got);
  scope_deleted += *got;
  other.join();
  CHECK(scope_deleted == 2 * later / 3);
  CHECK(store.query("SELECT count(*) FROM memories WHERE user_id = 'u0';")
        == "0");
  CHECK(store.query("SELECT count(*) FROM memory_terms t JOIN memory_scopes s "
                    "ON t.scope = s.id WHERE s.user_id = 'u0';")
        == "0");
  for (auto* n : {&a, &b}) {
    auto s = n->retrieve("u0", "", "the mill pond");
    REQUIRE(s);
    CHECK(s->ids.empty());
  }
}

TEST_CASE_METHOD(cluster,
                 "cluster memory: while a node's listener has lost its "
                 "connection its readers read every scope again, and it "
                 "listens again",
                 "[postgres]") {
  node a{sys, store, 1}, b{sys, store, 1};
  REQUIRE(a.store("The bell tower chimes at noon.", "u1", ""));
  memory_query q{"u1", "tq", "the bell tower"};
  REQUIRE(keep(b, q));
  // Both listeners' connections are cut (their sessions listen).
  store.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
             "datname = current_database() AND pid <> pg_backend_pid() AND "
             "query IN ('LISTEN spindle_memory;', 'SELECT 1;');");
  // Until B notices and listens again, nothing kept is trusted; once it
  // does, what its readers read again is kept again.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  bool untrusted = false, trusted_again = false;
  while (std::chrono::steady_clock::now() < deadline && !trusted_again) {
    REQUIRE(b.retrieve("u1", "", "the bell tower"));
    auto kept = b.mem.kept(q);
    if (!kept)
      untrusted = true;
    else if (untrusted)
      trusted_again = true;
    std::this_thread::sleep_for(5ms);
  }
  CHECK(untrusted);
  CHECK(trusted_again);
  // And it hears A's changes again.
  REQUIRE(b.mem.kept(q).has_value());
  auto id = a.store("The bell tower was painted blue.", "u1", "");
  REQUIRE(id);
  CHECK(until_seen(b, "u1", "", "the bell tower blue", showing(*id)));
}

TEST_CASE_METHOD(cluster,
                 "cluster memory: a batch PostgreSQL aborts for a deadlock is "
                 "run again and its stores are acknowledged",
                 "[postgres]") {
  // The store's sessions check for a deadlock 2 s after they begin to
  // wait, the other session only after 60 s: the store's check is the one
  // that finds it, and aborts the store's transaction.
  store.exec("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET "
             "deadlock_timeout = %L', current_database(), '2s'); END $$;");
  node a{sys, store, 1};
  REQUIRE(a.store("The ferry leaves at dawn.", "u1", ""));
  // Another session locks the scope's row, then, while the store waits
  // for it holding the index state's row, asks for that row: a deadlock,
  // which PostgreSQL breaks by aborting the store's transaction (it began
  // to wait first).
  auto other = open_postgres(store.url(), false);
  REQUIRE(other);
  auto& conn = **other;
  REQUIRE_FALSE(conn.exec("SET deadlock_timeout = '60s';"));
  REQUIRE_FALSE(conn.begin());
  REQUIRE_FALSE(conn.exec("SELECT id FROM memory_scopes WHERE user_id = 'u1' "
                          "FOR UPDATE;"));
  caf::expected<int64_t> stored = caf::make_error(caf::sec::request_timeout);
  auto start = std::chrono::steady_clock::now();
  std::thread storing{[&] {
    stored = a.store("The ferry leaves at dusk too.", "u1", "");
  }};
  // Once the store waits for the scope's row (so that its deadlock check,
  // deadlock_timeout after it began to wait, comes first).
  auto watching = open_postgres(store.url(), false);
  REQUIRE(watching);
  auto waiters = (*watching)->prepare(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
    "current_database() AND wait_event_type = 'Lock';");
  REQUIRE(waiters);
  auto waiting = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto row = (*waiters)->step();
    REQUIRE(row);
    auto n = *row ? (*waiters)->column(0).integer : 0;
    (*waiters)->reset();
    if (n == 1 || std::chrono::steady_clock::now() > waiting)
      break;
    std::this_thread::sleep_for(5ms);
  }
  auto err = conn.exec("UPDATE memory_index_state SET indexed_through = "
                       "indexed_through WHERE id = 0;");
  if (err)
    conn.rollback();
  else
    err = conn.commit();
  storing.join();
  INFO(describe(err));
  CHECK_FALSE(err);
  // It waited for PostgreSQL's deadlock check (deadlock_timeout, 2 s).
  CHECK(std::chrono::steady_clock::now() - start > 1800ms);
  REQUIRE(stored);
  auto got = a.retrieve("u1", "", "the ferry dusk");
  REQUIRE(got);
  CHECK(showing(*stored)(*got));
  CHECK(store.query("SELECT entries FROM memory_scopes WHERE user_id = 'u1';")
        == "2");
}
