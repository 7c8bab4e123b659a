// The scheduler seat (docs/cluster.md, "One scheduler"), in this process:
// two runtimes on one PostgreSQL database, each a cluster node, as two
// `spindle serve` nodes are. Exactly one runs the scheduler; the other's
// orchestration calls name the holder; a holder whose seat moved has its
// writes refused by the fence and gives the seat up. Runs only on the
// PostgreSQL run (tests/CMakeLists.txt); the HTTP side, with forwarding
// and failover of real processes, is tests/test_cluster_tasks.cpp.

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "spindle/actors/fenced_store.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/runtime/cluster.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<runtime> start_node(const test::test_store& store,
                                    const test::temp_dir& dir,
                                    const std::string& name) {
  if (!store.on_postgres())
    throw std::runtime_error("a node needs PostgreSQL: run on the "
                             "PostgreSQL run (SPINDLE_TEST_PG_DIR)");
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  opts.storage.store = store.url();
  opts.conversation.memory = false;
  opts.cluster.node_name = name;
  opts.cluster.advertise = "http://127.0.0.1:9"; // no HTTP served here
  opts.cluster.lease = 3000ms;
  opts.cluster.heartbeat = 500ms;
  opts.cluster.margin = 600ms;
  return std::make_unique<runtime>(opts);
}

// Waits up to `limit` for `ready`.
template <class F>
bool eventually(F ready, std::chrono::milliseconds limit = 10s) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (ready())
      return true;
    std::this_thread::sleep_for(20ms);
  }
  return ready();
}

// Two nodes on a fresh database: `a` started first.
struct two_nodes {
  test::test_store store;
  test::temp_dir da, db;
  std::unique_ptr<runtime> a = start_node(store, da, "seat-a");
  std::unique_ptr<runtime> b = start_node(store, db, "seat-b");
};

} // namespace

TEST_CASE_METHOD(two_nodes,
                 "scheduler seat: the first node runs the scheduler, the "
                 "second answers orchestration calls not_owner naming it, "
                 "and a clean stop hands the seat over with every stored "
                 "task",
                 "[postgres]") {
  REQUIRE(a->scheduler());
  CHECK(a->locate_scheduler().local);
  CHECK_FALSE(b->scheduler());
  auto where = b->locate_scheduler();
  CHECK_FALSE(where.local);
  CHECK(where.node == "seat-a");
  CHECK(where.url == "http://127.0.0.1:9");

  auto root = a->create_orchestration("root");
  REQUIRE(root);
  REQUIRE(a->spawn_subtask(*root, "leaf"));
  auto refused = b->create_orchestration("elsewhere");
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == errc::not_owner);
  CHECK(describe(refused.error()).find("seat-a") != std::string::npos);
  CHECK_FALSE(b->claim_task("w"));

  // The seat's row names a, once.
  CHECK(store.query("SELECT node FROM thread_leases "
                    "WHERE thread_id = '#scheduler';")
        == "seat-a");

  a->stop();
  // b's next heartbeat takes the seat and loads what a stored.
  REQUIRE(eventually([&] { return static_cast<bool>(b->scheduler()); }));
  CHECK(b->locate_scheduler().local);
  auto tree = b->orchestration_tree(*root);
  REQUIRE(tree);
  CHECK(tree->tasks.size() == 2);
  auto claimed = b->claim_task("w");
  REQUIRE(claimed);
  REQUIRE(*claimed);
  CHECK((*claimed)->id == *root + "_t1");
}

TEST_CASE_METHOD(two_nodes,
                 "scheduler seat: a holder whose seat was taken has its "
                 "writes refused by the fence, changes nothing, and gives "
                 "the seat up",
                 "[postgres]") {
  auto old_scheduler = a->scheduler();
  REQUIRE(old_scheduler);
  auto root = a->create_orchestration("root");
  REQUIRE(root);
  auto old_epoch = static_cast<uint64_t>(std::stoll(store.query(
    "SELECT epoch FROM thread_leases WHERE thread_id = '#scheduler';")));
  // As if a's lease had run out on the database's clock while a still
  // trusted it (clocks disagreeing beyond the margin): b takes the seat.
  store.query("UPDATE thread_leases SET node = NULL "
              "WHERE thread_id = '#scheduler';");
  REQUIRE(b->cluster()->contend_for_scheduler());
  REQUIRE(eventually([&] { return static_cast<bool>(b->scheduler()); }));
  CHECK(b->cluster()->scheduler_seat().epoch > old_epoch);

  // A write through a store fenced with the old epoch is refused
  // (not_owner) and stores nothing.
  {
    auto fence = a->system().spawn(fenced_store, a->state_store(),
                                   std::string{"#scheduler"}, old_epoch);
    auto late = a->call<uint64_t>(
      fence, 10s, store_atom::value,
      sql_write{make_sql("INSERT INTO counters (key, high_water) "
                         "VALUES ('fenced-out', 1);")});
    REQUIRE_FALSE(late);
    CHECK(classify(late.error()) == errc::not_owner);
    caf::anon_send_exit(fence, caf::exit_reason::user_shutdown);
    CHECK(store.query("SELECT count(*) FROM counters "
                      "WHERE key = 'fenced-out';")
          == "0");
  }
  // a's own scheduler, asked before its heartbeat noticed (or after: then
  // it has stopped), stores no subtask.
  auto late = a->call<std::vector<std::string>>(
    old_scheduler, 10s, caf::spawn_atom::value, *root,
    std::vector<std::string>{"late"});
  CHECK_FALSE(late);
  // Then a gives the seat up and names b.
  REQUIRE(eventually([&] { return !a->scheduler(); }));
  CHECK(a->locate_scheduler().node == "seat-b");
  auto tree = b->orchestration_tree(*root);
  REQUIRE(tree);
  CHECK(tree->tasks.size() == 1);
  CHECK(store.query("SELECT count(*) FROM tasks WHERE id LIKE '" + *root
                    + "_t%';")
        == "0");
  // b serves on.
  REQUIRE(b->spawn_subtask(*root, "leaf"));
}
