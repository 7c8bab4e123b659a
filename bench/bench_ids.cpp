// IDs per second: the ID allocator beside the framework's ceiling (a no-op
// CAF echo actor driven the same way) and the hardware's (a std::mutex
// counter, a std::atomic); with SPINDLE_BENCH_PG (the URL of a PostgreSQL
// database, e.g. from `.ci/postgres start`) the allocator's cluster mode
// there beside its block reservation on SQLite, in the same run; then
// `spindle id next` processes beside the seed's bash protocol.
//
// Usage: [SPINDLE_BENCH_PG=URL] bench_ids [--quick] [--json PATH]

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <caf/all.hpp>

#include "report.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace spindle::bench;
namespace fs = std::filesystem;

namespace {

using echo_actor
  = caf::typed_actor<caf::replies_to<next_atom, std::string, uint64_t>::with<
    id_range>>;

echo_actor::behavior_type echo(echo_actor::pointer) {
  return {[](next_atom, const std::string& key, uint64_t count) {
    return id_range{key, 1, count};
  }};
}

// Runs `threads` clients, each doing `per_thread` operations; returns ops/s.
template <class F>
double run_clients(size_t threads, size_t per_thread, F make_client) {
  std::vector<std::thread> workers;
  std::atomic<size_t> ready{0};
  std::atomic<bool> go{false};
  clock::time_point start;
  for (size_t t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      auto op = make_client();
      ++ready;
      while (!go)
        std::this_thread::yield();
      for (size_t i = 0; i < per_thread; ++i)
        op();
    });
  while (ready < threads)
    std::this_thread::yield();
  start = clock::now();
  go = true;
  for (auto& w : workers)
    w.join();
  return static_cast<double>(threads * per_thread) / seconds_since(start);
}

// A client that keeps one scoped_actor (one mailbox) for all its requests.
template <class Handle>
auto persistent_client(caf::actor_system& sys, Handle h) {
  return [&sys, h] {
    auto self = std::make_shared<caf::scoped_actor>(sys);
    return [self, h] {
      (*self)
        ->request(h, std::chrono::seconds(10), next_atom::value,
                  std::string{"ctx"}, uint64_t{1})
        .receive([](id_range&) {},
                 [](caf::error& err) {
                   std::cerr << describe(err) << "\n";
                   std::abort();
                 });
    };
  };
}

std::string shell_quote(const std::string& s) {
  return "'" + s + "'";
}

// Runs `procs` shell loops at once, each running `cmd` `per_proc` times;
// returns {claims/s, duplicates}.
std::pair<double, size_t> run_processes(const std::string& loop_body,
                                        size_t procs,
                                        const fs::path& out_dir) {
  std::vector<std::thread> workers;
  auto start = clock::now();
  for (size_t p = 0; p < procs; ++p)
    workers.emplace_back([&, p] {
      auto out = (out_dir / ("out." + std::to_string(p))).string();
      auto cmd = "bash -c " + shell_quote(loop_body + " > " + out);
      if (std::system(cmd.c_str()) != 0)
        std::cerr << "a claimer failed: " << cmd << "\n";
    });
  for (auto& w : workers)
    w.join();
  auto elapsed = seconds_since(start);
  std::multiset<std::string> ids;
  for (size_t p = 0; p < procs; ++p) {
    std::ifstream in{out_dir / ("out." + std::to_string(p))};
    std::string line;
    while (std::getline(in, line))
      ids.insert(line);
  }
  std::set<std::string> unique(ids.begin(), ids.end());
  return {static_cast<double>(ids.size()) / elapsed, ids.size() - unique.size()};
}

// The allocator on the durable stores, in one run: SQLite's block
// reservation (IDs from memory, one write per 4096) beside PostgreSQL's
// cluster mode (every request a committed increment, the requests that
// arrive meanwhile batched), on one node and on two nodes sharing the
// database (docs/ids.md, "Clusters"). Skipped without SPINDLE_BENCH_PG.
void durable_stores(report& rep, bool quick) {
  const char* url = std::getenv("SPINDLE_BENCH_PG");
  if (url == nullptr || *url == 0) {
    std::cerr << "ids on PostgreSQL: skipped (no SPINDLE_BENCH_PG)\n";
    return;
  }
  auto dir = fs::temp_directory_path()
             / ("spindle-bench-ids-pg-" + std::to_string(::getpid()));
  auto options = [&](const std::string& name, const std::string& store) {
    runtime_options opts;
    opts.storage.data_dir = (dir / name).string();
    opts.storage.store = store;
    opts.conversation.memory = false;
    return opts;
  };
  {
    runtime sqlite{options("sqlite", "")};
    runtime node_a{options("pg-a", url)};
    runtime node_b{options("pg-b", url)};
    size_t sqlite_ops = quick ? 20000 : 200000;
    size_t pg_ops = quick ? 2000 : 20000;
    table t;
    t.title = "IDs per second on the durable stores: SQLite's blocks beside "
              "PostgreSQL's cluster mode";
    t.columns = {"clients", "SQLite, blocks", "PostgreSQL, 1 node",
                 "1 node / SQLite", "PostgreSQL, 2 nodes",
                 "2 nodes / SQLite", "PostgreSQL mean latency (us)"};
    auto on_sqlite = persistent_client(sqlite.system(),
                                       sqlite.id_allocator());
    auto on_a = persistent_client(node_a.system(), node_a.id_allocator());
    auto on_b = persistent_client(node_b.system(), node_b.id_allocator());
    // The median of three rounds, the three stores taking turns, so that
    // a moment of a busy machine does not decide a ratio.
    auto median = [](std::vector<double> rounds) {
      return percentile(rounds, 50);
    };
    for (size_t threads : {1, 2, 4, 8}) {
      std::vector<double> blocks, one, two;
      for (int round = 0; round < 3; ++round) {
        blocks.push_back(run_clients(threads, sqlite_ops / threads,
                                     on_sqlite));
        one.push_back(run_clients(threads, pg_ops / threads, on_a));
        // Clients alternate between the nodes.
        std::atomic<size_t> next_client{0};
        two.push_back(run_clients(threads, pg_ops / threads, [&] {
          return next_client++ % 2 == 0 ? on_a() : on_b();
        }));
      }
      auto median_blocks = median(blocks);
      auto median_one = median(one);
      auto median_two = median(two);
      t.add_row(threads, median_blocks, median_one,
                fmt(median_one / median_blocks, 3) + "x", median_two,
                fmt(median_two / median_blocks, 3) + "x",
                fmt(1e6 * static_cast<double>(threads) / median_one, 0));
    }
    t.notes = {
      "Measured in one run: a runtime on SQLite in a temporary directory "
      "and two runtimes on the PostgreSQL database SPINDLE_BENCH_PG names "
      "(on the same machine, over loopback), each client thread with one "
      "scoped_actor doing request(...).receive(...) for one ctx ID in a "
      "loop; each figure the median of three rounds, the stores taking "
      "turns.",
      "SQLite, blocks: IDs come from memory, the store is written once per "
      "4096. PostgreSQL: every request waits for a committed UPDATE ... "
      "RETURNING of the counter's row; requests arriving while one is in "
      "flight go together in the next, so more clients share a round trip. "
      "2 nodes: the clients split between two runtimes whose increments "
      "queue on the same row lock. Mean latency: clients / IDs per second "
      "on one node."};
    rep.add(std::move(t));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  report rep{"ids"};
  size_t per_thread = quick ? 20000 : 200000;

  {
    runtime rt;
    auto echo_handle = rt.system().spawn(echo);
    table t;
    t.title = "IDs per second, blocking request/reply from client threads";
    t.columns = {"clients", "id_allocator", "CAF echo actor",
                 "allocator / echo", "facade call (new mailbox per call)",
                 "std::mutex counter", "std::atomic counter"};
    for (size_t threads : {1, 2, 4, 8}) {
      auto n = per_thread / threads;
      auto alloc = run_clients(threads, n,
                               persistent_client(rt.system(),
                                                 rt.id_allocator()));
      auto ech = run_clients(threads, n,
                             persistent_client(rt.system(), echo_handle));
      auto facade = run_clients(threads, n / 4, [&] {
        return [&] {
          if (!rt.next_ids("ctx", 1))
            std::abort();
        };
      });
      std::mutex mx;
      uint64_t plain = 0;
      auto mut = run_clients(threads, n * 10, [&] {
        return [&] {
          std::lock_guard<std::mutex> guard{mx};
          ++plain;
        };
      });
      std::atomic<uint64_t> counter{0};
      auto atom = run_clients(threads, n * 10, [&] {
        return [&] { counter.fetch_add(1, std::memory_order_relaxed); };
      });
      t.add_row(threads, alloc, ech, fmt(alloc / ech, 2) + "x", facade, mut,
                atom);
    }
    t.notes = {"Target: the allocator within 10% of the echo actor (ratio "
               ">= 0.90). Both are driven the same way: each client thread "
               "keeps one scoped_actor and does request(...).receive(...) "
               "in a loop. 'facade call' is runtime::next_ids, which creates "
               "a fresh blocking actor per call so any thread may call it "
               "without setup. mutex and atomic are the hardware ceiling "
               "(no message passing at all)."};
    caf::anon_send_exit(echo_handle, caf::exit_reason::user_shutdown);
    rep.add(std::move(t));
  }

  durable_stores(rep, quick);

  {
    size_t procs = 4;
    size_t per_proc = quick ? 50 : 250;
    size_t seed_per_proc = quick ? 10 : 40;
    auto dir = fs::temp_directory_path()
               / ("spindle-bench-ids-" + std::to_string(::getpid()));
    fs::create_directories(dir / "spindle");
    fs::create_directories(dir / "seed" / "ai_comms" / "counters");
    std::ofstream counter_file(dir / "seed" / "ai_comms" / "counters"
                               / "global.NextId");
    counter_file << "0001\n";
    counter_file.close();
    auto spindle_loop = "for i in $(seq " + std::to_string(per_proc) + "); do "
                        + shell_quote(SPINDLE_BINARY) + " id next --root "
                        + shell_quote((dir / "spindle").string())
                        + "; done";
    auto seed_script = fs::absolute(fs::path{argv[0]}).parent_path().parent_path()
                         .parent_path() / "bench" / "seed_claim.sh";
    if (!fs::exists(seed_script))
      seed_script = fs::path{"bench"} / "seed_claim.sh";
    auto seed_loop = "bash " + shell_quote(seed_script.string()) + " "
                     + shell_quote((dir / "seed").string()) + " global "
                     + std::to_string(seed_per_proc);
    fs::create_directories(dir / "out-spindle");
    fs::create_directories(dir / "out-seed");
    auto [sp_rate, sp_dups] = run_processes(spindle_loop, procs,
                                            dir / "out-spindle");
    fs::create_directories(dir / "spindle-count");
    fs::create_directories(dir / "out-count");
    auto count_loop = shell_quote(SPINDLE_BINARY) + " id next --count "
                      + std::to_string(per_proc * 10) + " --root "
                      + shell_quote((dir / "spindle-count").string());
    auto [count_rate, count_dups] = run_processes(count_loop, procs,
                                                  dir / "out-count");
    auto [seed_rate, seed_dups] = run_processes(seed_loop, procs,
                                                dir / "out-seed");
    table t;
    t.title = "File-counter claims per second, 4 concurrent processes";
    t.columns = {"claimer", "claims", "claims/s", "duplicates",
                 "vs seed"};
    t.add_row("spindle id next --count N (one process claiming in a loop)",
              procs * per_proc * 10, count_rate, count_dups,
              fmt(count_rate / seed_rate, 1) + "x");
    t.add_row("seed bash protocol (one bash process claiming in a loop)",
              procs * seed_per_proc, seed_rate, seed_dups, "1.0x");
    t.add_row("spindle id next (a new process per claim)", procs * per_proc,
              sp_rate, sp_dups, fmt(sp_rate / seed_rate, 1) + "x");
    t.notes = {"Target: at least 20x the seed's protocol with 0 duplicates, "
               "like for like: each of the 4 processes claims in a loop, as "
               "the seed's claim_next_id does inside one bash process. Every "
               "claim is a full rename-claim-release on the shared counter. "
               "The last row starts a whole `spindle id next` process per "
               "claim; there, process start-up (fork, exec, loading CAF's "
               "shared library) dominates."};
    rep.add(std::move(t));
    fs::remove_all(dir);
  }
  rep.write(report::json_path(argc, argv, "ids"));
  return 0;
}
