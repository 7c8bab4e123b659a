// Durable storage: what acknowledged-means-durable costs, and what resident
// memory stays at with a million stored conversations.
//
// 1. add_turn per second with 1, 8 and 64 clients, in the same run:
//    in-memory mode; the state store with group commit (sync normal and
//    sync full); and one transaction per write (sync full), the baseline
//    group commit improves on. Clients are blocking facade callers (one
//    write in flight each; their calls' latency percentiles in a table of
//    their own), then pipelined event-based drivers, each beside what the
//    SQLite work of its turns costs alone (the ceiling of one store
//    thread); then what the turn journal's folds cost at three values of
//    fold_every.
// 2. With SPINDLE_BENCH_PG (the URL of a PostgreSQL database, e.g. from
//    `.ci/postgres start`; its database is only the admin connection): the
//    same add_turn drivers at 1, 8 and 64 clients on PostgreSQL, each point
//    on a database of its own (CREATE DATABASE), beside SQLite's group
//    commit (sync normal and full) and beside pgbench -N and -S at the same
//    client counts on the same server (its own ceiling on this machine).
// 3. RSS of a process whose store holds 1M threads of 4 turns while 10k are
//    resident, after touching many more than 10k of them (they are loaded
//    and passivated again), in a fresh child process.
//
// Usage: [SPINDLE_BENCH_PG=URL] bench_storage [--quick] [--json PATH]
//                                             [--only throughput|postgres|rss]

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <unistd.h>

#include <caf/event_based_actor.hpp>

#include "report.hpp"
#include "spindle/actors/records.hpp"
#include "storage/database.hpp"
#include "storage/postgres/postgres.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace spindle::bench;
using namespace std::chrono_literals;

namespace {

struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    path = std::filesystem::temp_directory_path()
           / ("spindle-bench-storage-" + std::to_string(getpid()) + "-"
              + std::to_string(counter++));
    std::filesystem::remove_all(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  static inline int counter = 0;
};

enum class mode {
  memory,
  group_normal,
  group_full,
  per_write_full,
  /// group_normal with a store that sleeps as soon as its mailbox is empty.
  group_normal_no_linger,
  /// Group commit on the PostgreSQL database `store` names.
  postgres,
};

runtime_options options_for(mode m, const std::string& dir,
                            uint64_t fold_every = 0,
                            const std::string& store = {}) {
  runtime_options opts;
  opts.conversation.memory = false;
  if (m == mode::postgres) {
    opts.storage.data_dir = dir;
    opts.storage.store = store;
    return opts;
  }
  if (m == mode::memory) {
    opts.storage.data_dir = ":memory:";
    return opts;
  }
  opts.storage.data_dir = dir;
  opts.storage.sync = m == mode::group_normal
                          || m == mode::group_normal_no_linger
                        ? sync_mode::normal
                        : sync_mode::full;
  opts.storage.group_commit = m != mode::per_write_full;
  if (m == mode::group_normal_no_linger)
    opts.storage.linger = std::chrono::microseconds{0};
  if (fold_every > 0)
    opts.storage.fold_every = fold_every;
  return opts;
}

// What a run measured: add_turn calls per second, and how many writes the
// state store committed per transaction (0 in memory).
struct rate {
  double per_second = 0;
  double writes_per_commit = 0;
  /// Blocking callers only: each call's latency in microseconds.
  std::vector<double> latencies_us;
  /// What the state store counted over the run (zero in memory).
  storage_stats store;
};

double writes_per_commit(const runtime& rt) {
  auto stats = rt.store_stats();
  return stats.commits == 0 ? 0.0
                            : std::round(static_cast<double>(stats.writes)
                                         / static_cast<double>(stats.commits)
                                         * 10)
                                / 10;
}

// add_turn calls per second with `clients` threads, each writing to its own
// conversation threads (8 each), for `secs` seconds. `store`: the
// PostgreSQL database of mode::postgres.
rate add_turn_rate(mode m, size_t clients, double secs,
                   const std::string& store = {}) {
  scratch_dir dir;
  runtime rt{options_for(m, dir.path.string(), 0, store)};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> errors{0};
  std::vector<std::thread> pool;
  std::vector<std::vector<double>> latencies(clients);
  auto start = clock::now();
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      uint64_t n = 0;
      auto& mine = latencies[c];
      mine.reserve(1 << 16);
      while (!stop.load(std::memory_order_relaxed)) {
        auto thread = "c" + std::to_string(c) + "-" + std::to_string(n % 8);
        auto called = clock::now();
        if (!rt.add_turn(thread, make_user_turn("a turn of about forty-five "
                                                "bytes of content")))
          ++errors;
        mine.push_back(seconds_since(called) * 1e6);
        ++n;
      }
      done += n;
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  stop = true;
  for (auto& t : pool)
    t.join();
  auto elapsed = seconds_since(start);
  if (errors > 0)
    std::cerr << "bench_storage: " << errors << " failed add_turn calls\n";
  rate out{static_cast<double>(done.load()) / elapsed, writes_per_commit(rt),
           {}, rt.store_stats()};
  for (auto& l : latencies)
    out.latencies_us.insert(out.latencies_us.end(), l.begin(), l.end());
  return out;
}

// add_turn calls per second from `clients` event-based drivers, each
// keeping one add_turn in flight on each of its 8 threads (through the
// registry, as the facade does), for `secs` seconds. `fold_every` 0 keeps
// the default; `store`: the PostgreSQL database of mode::postgres.
rate pipelined_rate(mode m, size_t clients, double secs,
                    uint64_t fold_every = 0, const std::string& store = {}) {
  scratch_dir dir;
  runtime rt{options_for(m, dir.path.string(), fold_every, store)};
  auto registry = rt.thread_registry();
  std::atomic<uint64_t> errors{0};
  std::vector<std::promise<uint64_t>> done(clients);
  auto start = clock::now();
  auto deadline = start + std::chrono::duration_cast<clock::duration>(
                            std::chrono::duration<double>(secs));
  for (size_t c = 0; c < clients; ++c)
    rt.system().spawn([&, c](caf::event_based_actor* self) {
      auto ops = std::make_shared<uint64_t>(0);
      auto inflight = std::make_shared<size_t>(0);
      auto next = std::make_shared<std::function<void(size_t)>>();
      *next = [=, &errors, &done](size_t k) {
        if (clock::now() >= deadline) {
          if (*inflight == 0) {
            done[c].set_value(*ops);
            self->quit();
          }
          return;
        }
        ++*inflight;
        auto thread = "c" + std::to_string(c) + "-" + std::to_string(k);
        self
          ->request(registry, std::chrono::seconds(30), caf::add_atom::value,
                    thread,
                    make_user_turn("a turn of about forty-five bytes of "
                                   "content"))
          .then(
            [=](uint64_t) {
              --*inflight;
              ++*ops;
              (*next)(k);
            },
            [=, &errors](caf::error&) {
              --*inflight;
              ++errors;
              (*next)(k);
            });
      };
      for (size_t k = 0; k < 8; ++k)
        (*next)(k);
    });
  uint64_t total = 0;
  for (auto& d : done)
    total += d.get_future().get();
  auto elapsed = seconds_since(start);
  if (errors > 0)
    std::cerr << "bench_storage: " << errors << " failed add_turn calls\n";
  return {static_cast<double>(total) / elapsed, writes_per_commit(rt), {},
          rt.store_stats()};
}

// What SQLite alone spends per turn (sqlite_alone).
struct sqlite_cost {
  double insert_us = 0; // per turn: its journal row, its share of a commit
  double fold_us = 0;   // per turn: its share of the journal's folds
};

// Appends journal rows for `threads` threads in transactions of `batch`
// rows and folds every 16,384 rows, `folds` times, on a scratch database
// opened as the store opens it; returns the cost per turn.
sqlite_cost sqlite_alone(size_t threads, size_t batch, int folds) {
  scratch_dir dir;
  std::filesystem::create_directories(dir.path);
  auto db = database::open((dir.path / "spindle.db").string(),
                           sync_mode::normal);
  if (!db) {
    std::cerr << "bench_storage: " << describe(db.error()) << "\n";
    return {};
  }
  auto& conn = **db;
  auto journal = records::turn_journal();
  auto append = conn.prepare(journal.append_sql);
  if (!append) {
    std::cerr << "bench_storage: " << describe(append.error()) << "\n";
    return {};
  }
  const size_t every = 16384;
  auto t = make_user_turn("a turn of about forty-five bytes of content");
  std::vector<uint64_t> seqs(threads, 0);
  std::vector<std::string> ids;
  for (size_t i = 0; i < threads; ++i)
    ids.push_back("c" + std::to_string(i / 8) + "-" + std::to_string(i % 8));
  size_t errors = 0;
  auto check = [&](const caf::error& err) {
    if (err && errors++ == 0)
      std::cerr << "bench_storage: " << describe(err) << "\n";
  };
  double insert_s = 0;
  double fold_s = 0;
  size_t n = 0;
  for (int f = 0; f < folds; ++f) {
    auto started = clock::now();
    for (size_t done = 0; done < every;) {
      check(conn.exec("BEGIN IMMEDIATE;"));
      for (size_t k = 0; k < batch && done < every; ++k, ++done, ++n) {
        auto i = n % threads;
        t.timestamp_ms = static_cast<int64_t>(n);
        for (auto& x : records::append_turn(ids[i], seqs[i]++, t))
          for (size_t p = 0; p < x.params.size(); ++p)
            append->bind(static_cast<int>(p + 1), x.params[p]);
        check(append->run());
      }
      check(conn.exec("COMMIT;"));
    }
    insert_s += seconds_since(started);
    started = clock::now();
    check(conn.exec("BEGIN IMMEDIATE;"));
    for (auto& x : journal.fold)
      check(conn.exec(x.sql));
    check(conn.exec("COMMIT;"));
    fold_s += seconds_since(started);
  }
  auto turns = static_cast<double>(n);
  return {insert_s * 1e6 / turns, fold_s * 1e6 / turns};
}

// Microseconds per unit of `seconds` spread over `n`, to one decimal.
double us_each(double seconds, uint64_t n) {
  return n == 0 ? 0.0 : std::round(seconds * 1e6 / static_cast<double>(n)
                                   * 10)
                          / 10;
}

// x / y to two decimals.
double ratio(double x, double y) {
  return std::round(x / y * 100) / 100;
}

double ratio(const rate& x, const rate& y) {
  return ratio(x.per_second, y.per_second);
}

// n / of to two decimals; 0 when there is nothing to divide by.
double share(uint64_t n, uint64_t of) {
  return of == 0 ? 0.0
                 : ratio(static_cast<double>(n), static_cast<double>(of));
}

void throughput(report& rep, bool quick) {
  const double secs = quick ? 0.3 : 3.0;
  const std::vector<size_t> client_counts{1, 8, 64};
  table t;
  t.title = "add_turn per second, blocking callers: in memory, durable with "
            "group commit, one transaction per write";
  t.columns = {"clients",
               "in-memory",
               "group commit, sync normal",
               "group commit, sync full",
               "one txn per write, sync full",
               "group normal / in-memory",
               "group full / one txn per write",
               "writes per commit, group normal / full",
               "us per commit, group normal"};
  table lat;
  lat.title = "add_turn latency, blocking callers: in memory and durable "
              "with group commit";
  lat.columns = {"clients", "mode", "p50 us", "p99 us", "p99.9 us", "max us"};
  auto add_latency = [&lat](size_t clients, const char* what, rate& r) {
    auto& l = r.latencies_us;
    if (l.empty())
      return;
    lat.add_row(clients, what, std::round(percentile(l, 50)),
                std::round(percentile(l, 99)),
                std::round(percentile(l, 99.9)),
                std::round(percentile(l, 100)));
  };
  for (size_t clients : client_counts) {
    auto mem = add_turn_rate(mode::memory, clients, secs);
    auto normal = add_turn_rate(mode::group_normal, clients, secs);
    auto full = add_turn_rate(mode::group_full, clients, secs);
    auto per_write = add_turn_rate(mode::per_write_full, clients, secs);
    add_latency(clients, "in memory", mem);
    add_latency(clients, "group commit, sync normal", normal);
    add_latency(clients, "group commit, sync full", full);
    t.add_row(clients, std::round(mem.per_second),
              std::round(normal.per_second), std::round(full.per_second),
              std::round(per_write.per_second), ratio(normal, mem),
              ratio(full, per_write),
              bench::fmt(normal.writes_per_commit, 1) + " / "
                + bench::fmt(full.writes_per_commit, 1),
              us_each(normal.store.commit_seconds, normal.store.commits));
  }
  t.notes = {
    "One operation = runtime::add_turn (a blocking facade call) of a "
    "45-byte user turn; each client thread writes round-robin to 8 threads "
    "of its own. A durable add_turn is answered only after its transaction "
    "committed.",
    "group commit: the state store commits every write that arrived while "
    "the previous commit ran in one transaction; checkpoints run on their "
    "own connection (docs/storage.md). sync full: each commit is fsynced "
    "(survives power loss); sync normal: WAL without fsync per commit "
    "(survives kill -9).",
    "writes per commit: the store's own count (runtime::store_stats) of "
    "the writes each transaction carried, thread creations included; us "
    "per commit: its time from BEGIN to COMMIT, statements included.",
    "Target: group commit at least 0.5x in-memory mode."};
  rep.add(std::move(t));
  lat.notes = {
    "Each blocking add_turn of the table above, timed by its caller. A "
    "durable call waits for its commit; every fold_every writes (16,384) "
    "the store folds the turn journal in one transaction and the writes "
    "arriving meanwhile wait for it (docs/storage.md), which shows in "
    "p99.9 and max."};
  rep.add(std::move(lat));

  table p;
  p.title = "add_turn per second, pipelined callers: in memory and durable "
            "with group commit";
  p.columns = {"clients",
               "in-memory",
               "group commit, sync normal",
               "group commit, sync full",
               "group normal / in-memory",
               "group full / in-memory",
               "writes per commit, group normal / full"};
  // The SQLite work of a turn alone, at the batch size group commit
  // reached, against the in-memory rate of the same run.
  table q;
  q.title = "SQLite alone: the rows of a pipelined turn without the actors, "
            "sync normal";
  q.columns = {"clients",
               "in-memory add_turn/s (above)",
               "0.5x in-memory",
               "turns per transaction (all in flight)",
               "us per turn: journal row and commit",
               "us per turn: fold",
               "one core's ceiling, turns/s",
               "ceiling / in-memory"};
  for (size_t clients : client_counts) {
    auto mem = pipelined_rate(mode::memory, clients, secs);
    auto normal = pipelined_rate(mode::group_normal, clients, secs);
    auto full = pipelined_rate(mode::group_full, clients, secs);
    p.add_row(clients, std::round(mem.per_second),
              std::round(normal.per_second), std::round(full.per_second),
              ratio(normal, mem), ratio(full, mem),
              bench::fmt(normal.writes_per_commit, 1) + " / "
                + bench::fmt(full.writes_per_commit, 1));
    // Every add_turn in flight in one transaction: the most group commit
    // can batch, so the cheapest a turn's rows can be.
    auto batch = 8 * clients;
    auto rows = sqlite_alone(8 * clients, batch, quick ? 1 : 4);
    auto ceiling = 1e6 / (rows.insert_us + rows.fold_us);
    q.add_row(clients, std::round(mem.per_second),
              std::round(mem.per_second / 2), batch,
              bench::fmt(rows.insert_us, 2), bench::fmt(rows.fold_us, 2),
              std::round(ceiling), ratio(ceiling, mem.per_second));
  }
  p.notes = {
    "Each client is an event-based actor keeping one add_turn in flight on "
    "each of its 8 threads (requests to the thread registry, as the facade "
    "sends them), so a commit carries many clients' writes.",
    "The 0.5x target is checked by the blocking table above (in memory, "
    "group commit and one transaction per write side by side); pipelined "
    "callers are held to the same yardstick here, and docs/storage.md "
    "(\"Where durable throughput stands\") says where they stand and why."};
  rep.add(std::move(p));
  q.notes = {
    "What the state store's thread spends in SQLite per turn, measured "
    "without actors on a scratch database of the same schema and "
    "statements (database::open, records::append_turn, records::"
    "turn_journal): journal rows of 8 threads per client appended in "
    "transactions of every add_turn the clients keep in flight (the most "
    "group commit can batch; the durable runs above reached the writes per "
    "commit they print), folded every 16,384 rows as the store does. All "
    "of it runs on the store's one thread (SQLite has one writer), so 1e6 "
    "/ (the two columns) bounds the turns per second any arrangement of "
    "actors around this schema can make durable on this machine, before "
    "a single message is sent or answered.",
    "A ceiling / in-memory below 0.5 means the target needs a cheaper "
    "storage layout per turn, not cheaper actors (docs/storage.md, \"Where "
    "durable throughput stands\")."};
  rep.add(std::move(q));

  // What the store's linger buys, each pair run back to back.
  table g;
  g.title = "The state store's linger: group commit, sync normal, with "
            "and without it";
  g.columns = {"callers",
               "clients",
               "with linger",
               "without",
               "with / without",
               "lingers per commit",
               "share of lingers a write ended"};
  for (bool pipelined : {false, true})
    for (size_t clients : client_counts) {
      auto measure = [&](mode m) {
        return pipelined ? pipelined_rate(m, clients, secs)
                         : add_turn_rate(m, clients, secs);
      };
      auto with = measure(mode::group_normal);
      auto without = measure(mode::group_normal_no_linger);
      auto& s = with.store;
      g.add_row(pipelined ? "pipelined" : "blocking", clients,
                std::round(with.per_second), std::round(without.per_second),
                ratio(with, without), share(s.lingers, s.commits),
                share(s.linger_hits, s.lingers));
    }
  g.notes = {
    "add_turn per second, as in the tables above. With linger (the "
    "default, 100 us): after a commit of at most 8 writes the store polls "
    "its mailbox, yielding its core, until a write arrives or the time is "
    "up; without: its thread sleeps as soon as the mailbox is empty, and "
    "the next write wakes it (docs/storage.md, \"The store lingers\").",
    "lingers per commit and the share a write ended: the store's own "
    "counts (runtime::store_stats) in the run with linger."};
  rep.add(std::move(g));

  // What the journal's folds cost, and how long each holds up the writers.
  table f;
  f.title = "Journal folds by fold_every: pipelined callers, 64 clients, "
            "group commit, sync normal";
  f.columns = {"fold_every",      "add_turn per second",
               "writes per commit", "us per commit",
               "folds",           "us per folded turn",
               "ms per fold"};
  for (uint64_t every : {uint64_t{4096}, uint64_t{16384}, uint64_t{65536}}) {
    auto r = pipelined_rate(mode::group_normal, 64, secs, every);
    auto during = r.store.folds > 0 ? r.store.folds - 1 : 0; // not the start's
    f.add_row(every, std::round(r.per_second), r.writes_per_commit,
              us_each(r.store.commit_seconds, r.store.commits),
              during, us_each(r.store.fold_seconds, r.store.folded_turns),
              us_each(r.store.fold_seconds, during) / 1000);
  }
  f.notes = {
    "The state store's own counts (runtime::store_stats) over each run: "
    "every fold_every writes it folds the turn journal into the turns "
    "table in one transaction, and the writes that arrive meanwhile wait "
    "for it (docs/storage.md, \"The turn journal\"). folds: those during "
    "the run, not the one at start (of an empty journal).",
    "Default: 16,384."};
  rep.add(std::move(f));
}

// -- PostgreSQL ---------------------------------------------------------------

// `url` with its database replaced by `name` (its parameters kept).
std::string with_database(const std::string& url, const std::string& name) {
  auto scheme = url.find("://");
  auto start = scheme == std::string::npos ? 0 : scheme + 3;
  auto query = url.find('?', start);
  auto slash = url.find('/', start);
  if (slash != std::string::npos && query != std::string::npos
      && slash > query)
    slash = std::string::npos;
  auto end = slash != std::string::npos ? slash : query;
  auto head = url.substr(0, end);
  auto tail = query != std::string::npos ? url.substr(query) : std::string{};
  return head + "/" + name + tail;
}

// The server behind SPINDLE_BENCH_PG: a connection to the URL's own
// database, which only creates and drops the databases of the points.
class pg_server {
public:
  explicit pg_server(std::string url) : url_(std::move(url)) {
    auto conn = open_postgres(url_, false);
    if (!conn) {
      std::cerr << "bench_storage: " << describe(conn.error()) << "\n";
      return;
    }
    admin_ = std::move(*conn);
  }

  explicit operator bool() const noexcept {
    return admin_ != nullptr;
  }

  /// A new, empty database; its URL, or empty when it could not be made.
  std::string create(const std::string& name) {
    if (auto err = admin_->exec("DROP DATABASE IF EXISTS " + name
                                + " WITH (FORCE);");
        err
        || (err = admin_->exec("CREATE DATABASE " + name + ";"))) {
      std::cerr << "bench_storage: " << describe(err) << "\n";
      return {};
    }
    return with_database(url_, name);
  }

  void drop(const std::string& name) {
    if (auto err = admin_->exec("DROP DATABASE IF EXISTS " + name
                                + " WITH (FORCE);"))
      std::cerr << "bench_storage: " << describe(err) << "\n";
  }

  /// A setting of the server (SHOW), or "?".
  std::string setting(const std::string& name) {
    auto q = admin_->prepare("SHOW " + name + ";");
    if (!q)
      return "?";
    auto row = (*q)->step();
    std::string out = row && *row ? (*q)->column(0).text : "?";
    (*q)->reset();
    return out;
  }

  const std::string& url() const noexcept {
    return url_;
  }

private:
  std::string url_;
  std::unique_ptr<sql_connection> admin_;
};

// A database of its own for one point, dropped after it.
class scratch_database {
public:
  scratch_database(pg_server& server, const std::string& what)
    : server_(server),
      name_("spindle_bench_" + what + "_" + std::to_string(getpid()) + "_"
            + std::to_string(counter++)),
      url_(server.create(name_)) {
  }
  ~scratch_database() {
    if (!url_.empty())
      server_.drop(name_);
  }
  scratch_database(const scratch_database&) = delete;
  scratch_database& operator=(const scratch_database&) = delete;

  const std::string& url() const noexcept {
    return url_;
  }

private:
  pg_server& server_;
  std::string name_;
  std::string url_;
  static inline int counter = 0;
};

// `text` as one shell word.
std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text)
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  return out + "'";
}

// Runs `command` through the shell; its output (stdout and stderr), and
// whether it exited with 0.
std::pair<std::string, bool> shell(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr)
    return {"popen failed", false};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;)
    out.append(buf, n);
  int rc = ::pclose(p);
  return {out, rc == 0};
}

// pgbench's scale: 1M rows in pgbench_accounts, so that 64 clients of
// pgbench -N rarely update the same row.
constexpr int pgbench_scale = 10;

// Fills the database at `url` for pgbench (-i). Errors on stderr.
bool pgbench_init(const std::string& url) {
  auto [out, ok] = shell("pgbench -i -q -s " + std::to_string(pgbench_scale)
                         + " " + shell_quoted(url));
  if (!ok)
    std::cerr << "bench_storage: pgbench -i failed on " << redact_url(url)
              << ":\n"
              << out;
  return ok;
}

// pgbench's transactions per second ("tps = ...") with `clients`
// connections for `secs` seconds: `-S` (select only) or `-N` (simple
// update), prepared statements as spindle uses them; 0 when it failed.
double pgbench_tps(const std::string& url, const std::string& script,
                   size_t clients, int secs) {
  auto threads = std::min<size_t>(clients, 2);
  auto [out, ok] = shell("pgbench -n " + script + " -M prepared -c "
                         + std::to_string(clients) + " -j "
                         + std::to_string(threads) + " -T "
                         + std::to_string(secs) + " " + shell_quoted(url));
  auto at = out.find("tps = ");
  if (!ok || at == std::string::npos) {
    std::cerr << "bench_storage: pgbench " << script << " -c " << clients
              << " failed on " << redact_url(url) << ":\n"
              << out;
    return 0;
  }
  return std::strtod(out.c_str() + at + 6, nullptr);
}

// add_turn per second on PostgreSQL beside SQLite and pgbench, all on this
// machine in the same run. Skipped without SPINDLE_BENCH_PG.
void on_postgres(report& rep, bool quick) {
  const char* env = std::getenv("SPINDLE_BENCH_PG");
  if (env == nullptr || *env == 0) {
    std::cerr << "storage on PostgreSQL: skipped (no SPINDLE_BENCH_PG)\n";
    return;
  }
  pg_server server{env};
  if (!server)
    return;
  bool have_pgbench = shell("pgbench --version").second;
  if (!have_pgbench)
    std::cerr << "bench_storage: pgbench not found; its columns are 0\n";
  const double secs = quick ? 0.3 : 3.0;
  const int pgbench_secs = quick ? 1 : 3;
  table t;
  t.title = "add_turn per second on PostgreSQL (durable, group commit) "
            "beside SQLite's group commit and pgbench on the same server";
  t.columns = {"clients",
               "PostgreSQL, blocking",
               "PostgreSQL, pipelined",
               "SQLite sync normal, blocking",
               "SQLite sync normal, pipelined",
               "SQLite sync full, blocking",
               "SQLite sync full, pipelined",
               "pgbench -N tps",
               "pgbench -S tps",
               "PG blocking / pgbench -N",
               "PG pipelined / pgbench -N",
               "writes per commit, PG blocking / pipelined",
               "us per commit, PG blocking / pipelined"};
  // Each point in `rounds` rounds, the eight measurements of a client
  // count one right after the other in an order that rotates from round
  // to round: the machine's load drifts over seconds, so a figure is its
  // median round and a ratio the median of the rounds' ratios.
  const int rounds = quick ? 1 : 3;
  double blocking_64 = 0;  // PG blocking / pgbench -N at 64 clients
  double pipelined_64 = 0; // PG pipelined / pgbench -N at 64 clients
  for (size_t clients : {1, 8, 64}) {
    enum { pg_b, pg_p, normal_b, normal_p, full_b, full_p, n_points };
    std::vector<std::vector<rate>> runs(n_points);
    std::vector<double> tps_n, tps_s, ratio_b, ratio_p;
    for (int round = 0; round < rounds; ++round) {
      std::vector<rate> got(n_points);
      double n = 0;
      double s = 0;
      std::vector<std::function<void()>> steps;
      // pgbench on a database of its own filled for it: -S reads, then
      // -N writes.
      steps.emplace_back([&] {
        if (!have_pgbench)
          return;
        scratch_database db{server, "pgbench"};
        if (!db.url().empty() && pgbench_init(db.url())) {
          s = pgbench_tps(db.url(), "-S", clients, pgbench_secs);
          n = pgbench_tps(db.url(), "-N", clients, pgbench_secs);
        }
      });
      for (bool pipelined : {false, true})
        steps.emplace_back([&, pipelined] {
          scratch_database db{server, "add_turn"};
          if (db.url().empty())
            return;
          got[pipelined ? pg_p : pg_b]
            = pipelined
                ? pipelined_rate(mode::postgres, clients, secs, 0, db.url())
                : add_turn_rate(mode::postgres, clients, secs, db.url());
        });
      for (auto m : {mode::group_normal, mode::group_full})
        for (bool pipelined : {false, true})
          steps.emplace_back([&, m, pipelined] {
            auto at = (m == mode::group_normal ? normal_b : full_b)
                      + (pipelined ? 1 : 0);
            got[at] = pipelined ? pipelined_rate(m, clients, secs)
                                : add_turn_rate(m, clients, secs);
          });
      for (size_t k = 0; k < steps.size(); ++k)
        steps[(k + static_cast<size_t>(round)) % steps.size()]();
      for (int i = 0; i < n_points; ++i)
        runs[i].push_back(std::move(got[i]));
      tps_n.push_back(n);
      tps_s.push_back(s);
      ratio_b.push_back(n > 0 ? runs[pg_b].back().per_second / n : 0);
      ratio_p.push_back(n > 0 ? runs[pg_p].back().per_second / n : 0);
    }
    // The median round of each measurement (by its add_turn/s).
    auto median_of = [](std::vector<rate>& r) -> const rate& {
      std::sort(r.begin(), r.end(), [](const rate& x, const rate& y) {
        return x.per_second < y.per_second;
      });
      return r[r.size() / 2];
    };
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto& pg_blocking = median_of(runs[pg_b]);
    auto& pg_pipelined = median_of(runs[pg_p]);
    auto per_commit = [](const rate& r) {
      return bench::fmt(us_each(r.store.commit_seconds, r.store.commits), 1);
    };
    auto b = std::round(median(ratio_b) * 100) / 100;
    auto p = std::round(median(ratio_p) * 100) / 100;
    t.add_row(clients, std::round(pg_blocking.per_second),
              std::round(pg_pipelined.per_second),
              std::round(median_of(runs[normal_b]).per_second),
              std::round(median_of(runs[normal_p]).per_second),
              std::round(median_of(runs[full_b]).per_second),
              std::round(median_of(runs[full_p]).per_second),
              std::round(median(tps_n)), std::round(median(tps_s)), b, p,
              bench::fmt(pg_blocking.writes_per_commit, 1) + " / "
                + bench::fmt(pg_pipelined.writes_per_commit, 1),
              per_commit(pg_blocking) + " / " + per_commit(pg_pipelined));
    if (clients == 64) {
      blocking_64 = b;
      pipelined_64 = p;
    }
  }
  auto verdict = std::string{"Target: durable add_turn on PostgreSQL at "
                             "least 0.5x pgbench -N at 64 clients: "};
  if (blocking_64 <= 0)
    verdict += "not judged (no pgbench -N figure).";
  else
    verdict += std::string{blocking_64 >= 0.5 ? "met" : "missed"}
               + " by blocking callers (" + bench::fmt(blocking_64, 2)
               + "x), " + (pipelined_64 >= 0.5 ? "met" : "missed")
               + " by pipelined ones (" + bench::fmt(pipelined_64, 2)
               + "x).";
  t.notes = {
    "One operation = add_turn of a 45-byte user turn, answered after its "
    "commit, with the drivers of the tables above: blocking callers (one "
    "runtime::add_turn in flight per client thread, round-robin over 8 "
    "threads of its own) and pipelined ones (an event-based client keeping "
    "one add_turn in flight on each of its 8 threads). PostgreSQL: the "
    "runtime with storage_options::store on the server SPINDLE_BENCH_PG "
    "names (PostgreSQL " + server.setting("server_version")
      + " over loopback on this machine; fsync=" + server.setting("fsync")
      + ", synchronous_commit=" + server.setting("synchronous_commit")
      + ", full_page_writes=" + server.setting("full_page_writes")
      + "), every point on a new database (CREATE DATABASE, dropped "
        "after it). SQLite: group commit in a new data directory per "
        "point.",
    "Durability: spindle answers a write after PostgreSQL's COMMIT "
    "returned, so it keeps what the server keeps. With fsync off and "
    "synchronous_commit on (.ci/postgres) a commit survives the crash of "
    "any process, the server's included, but not of the machine: SQLite "
    "sync normal promises the same (and after a machine's crash keeps a "
    "whole database, which a server without fsync need not); sync full "
    "survives power loss (docs/storage.md, \"Choosing a backend\").",
    "pgbench on the same server, each client count on a new database "
    "(pgbench -i -s " + std::to_string(pgbench_scale)
      + "): -N (simple update: per transaction an UPDATE of "
        "pgbench_accounts, a SELECT and an INSERT into pgbench_history) and "
        "-S (one SELECT by primary key), -M prepared, -c clients, -j "
        "min(clients, 2), -T "
      + std::to_string(pgbench_secs)
      + ". Its tps is the database's own ceiling on this machine: every "
        "client a connection and a server process of its own, where "
        "spindle writes through one connection (the state store's) and "
        "batches.",
    "Each figure is the median of " + std::to_string(rounds)
      + " round(s); in a round the eight measurements of a client count "
        "run one right after the other, in an order that rotates from "
        "round to round. PG / pgbench -N: the median of the rounds' "
        "ratios. writes per commit and us per commit (BEGIN to COMMIT): "
        "the state store's counts (runtime::store_stats) in the median "
        "round.",
    verdict};
  rep.add(std::move(t));
}

// Writes `threads` threads of 4 turns straight into the store's tables, as
// spindle would have.
void fill(const std::string& dir, size_t threads) {
  {
    runtime_options opts;
    opts.storage.data_dir = dir;
    opts.conversation.memory = false;
    runtime rt{opts}; // creates the schema
  }
  sqlite3* db = nullptr;
  sqlite3_open((std::filesystem::path{dir} / "spindle.db").c_str(), &db);
  sqlite3_exec(db, "PRAGMA synchronous=OFF; BEGIN;", nullptr, nullptr,
               nullptr);
  sqlite3_stmt* thread_row = nullptr;
  sqlite3_stmt* turn_row = nullptr;
  sqlite3_prepare_v2(db,
                     "INSERT INTO threads(thread_id, epoch, created_ms) "
                     "VALUES(?1, 0, 0);",
                     -1, &thread_row, nullptr);
  sqlite3_prepare_v2(db,
                     "INSERT INTO turns(thread_id, seq, role, content, "
                     "timestamp_ms, tool_call_id, interrupted) "
                     "VALUES(?1, ?2, ?3, ?4, 1, '', 0);",
                     -1, &turn_row, nullptr);
  std::string content(64, 'x');
  for (size_t i = 0; i < threads; ++i) {
    auto id = "t" + std::to_string(i);
    sqlite3_bind_text(thread_row, 1, id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_step(thread_row);
    sqlite3_reset(thread_row);
    for (int k = 0; k < 4; ++k) {
      sqlite3_bind_text(turn_row, 1, id.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(turn_row, 2, k);
      sqlite3_bind_int(turn_row, 3, k % 2 == 0 ? 1 : 2);
      sqlite3_bind_text(turn_row, 4, content.c_str(), -1, SQLITE_STATIC);
      sqlite3_step(turn_row);
      sqlite3_reset(turn_row);
    }
  }
  sqlite3_finalize(thread_row);
  sqlite3_finalize(turn_row);
  sqlite3_exec(db, "COMMIT;", nullptr, nullptr, nullptr);
  sqlite3_close(db);
}

void resident_memory(report& rep, bool quick) {
  const size_t stored = quick ? 20000 : 1000000;
  const uint64_t cap = quick ? 1000 : 10000;
  const size_t touched = quick ? 5000 : 50000;
  scratch_dir dir;
  fill(dir.path.string(), stored);
  auto db_bytes = std::filesystem::file_size(dir.path / "spindle.db");
  uint64_t baseline = 0;
  uint64_t after = 0;
  uint64_t resident = 0;
  // Each figure in a fresh process: RSS before starting, after touching.
  auto measure = [&](bool touch) {
    return in_child([&]() -> uint64_t {
      runtime_options opts;
      opts.storage.data_dir = dir.path.string();
      opts.conversation.memory = false;
      opts.conversation.registry.activation.max_resident = cap;
      runtime rt{opts};
      if (touch) {
        std::mt19937_64 rng{42};
        for (size_t i = 0; i < touched; ++i) {
          auto id = "t" + std::to_string(rng() % stored);
          auto h = rt.history(id, 4);
          if (!h || h->size() != 4)
            return 0;
        }
        std::this_thread::sleep_for(200ms); // passivations settle
        auto stats = rt.thread_stats();
        if (!stats || stats->resident > cap)
          return 0;
      }
      return rss_bytes();
    });
  };
  baseline = measure(false);
  after = measure(true);
  resident = cap;
  table t;
  t.title = "Resident memory with " + bench::fmt(static_cast<double>(stored))
            + " stored threads of 4 turns, at most " + bench::fmt(resident)
            + " resident";
  t.columns = {"state", "RSS MiB", "database MiB"};
  t.add_row("runtime started, nothing touched",
            std::round(static_cast<double>(baseline) / (1 << 20) * 10) / 10,
            std::round(static_cast<double>(db_bytes) / (1 << 20) * 10) / 10);
  t.add_row("after reading " + bench::fmt(static_cast<double>(touched))
              + " random threads",
            std::round(static_cast<double>(after) / (1 << 20) * 10) / 10,
            std::round(static_cast<double>(db_bytes) / (1 << 20) * 10) / 10);
  t.notes = {
    "RSS of a fresh process. Reading a thread activates it from the store; "
    "beyond the resident cap the least recently used threads are "
    "passivated, so memory depends on the cap, not on how many threads are "
    "stored. 0 means a check failed (a history was wrong or more than the "
    "cap stayed resident).",
    "Compare bench_threads' resident-memory table: 100k threads of 10 "
    "turns kept in memory."};
  rep.add(std::move(t));
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  report rep{"storage"};
  if (report::selected(argc, argv, "throughput"))
    throughput(rep, quick);
  if (report::selected(argc, argv, "postgres"))
    on_postgres(rep, quick);
  // Forks children; every runtime of this process has stopped by now.
  if (report::selected(argc, argv, "rss"))
    resident_memory(rep, quick);
  rep.write(report::json_path(argc, argv, "storage"));
  return 0;
}
