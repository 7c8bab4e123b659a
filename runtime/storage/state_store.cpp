#include "storage/state_store.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>
#include <sqlite3.h>

#include "spindle/actors/records.hpp"
#include "spindle/actors/thread_catalog.hpp"
#include "spindle/messages/error.hpp"
#include "storage/postgres/postgres.hpp"
#include "storage/sql_connection.hpp"
#include "storage/database.hpp"

namespace spindle {

namespace {

struct memory_counter_state {
  static inline const char* name = "spindle.counter_store.memory";
  std::unordered_map<std::string, uint64_t> marks;
};

counter_store_actor::behavior_type memory_counter_store(
  counter_store_actor::stateful_pointer<memory_counter_state> self) {
  return {
    [self](load_atom, counter_atom, const std::string& key) -> uint64_t {
      auto i = self->state.marks.find(key);
      return i == self->state.marks.end() ? 0 : i->second;
    },
    [self](store_atom, counter_atom, const std::string& key,
           uint64_t mark) -> uint64_t {
      auto& stored = self->state.marks[key];
      stored = std::max(stored, mark);
      return stored;
    },
    [self](next_atom, counter_atom, const std::string& key, uint64_t k,
           uint64_t floor, uint64_t limit) -> caf::result<uint64_t> {
      auto& stored = self->state.marks[key];
      auto base = std::max(stored, floor);
      if (k > limit || base > limit - k)
        return counter_exhausted(key, k, limit);
      stored = base + k;
      return stored;
    },
  };
}

struct durable_counter_state {
  static inline const char* name = "spindle.counter_store.durable";
  std::shared_ptr<sql_connection> db;
  std::unique_ptr<sql_query> load;
  std::unique_ptr<sql_query> store;
  std::unique_ptr<sql_query> next;
};

// The statements, prepared on first use (SQL both backends run).
caf::expected<sql_query*> counter_query(durable_counter_state& st,
                                        std::unique_ptr<sql_query>& slot,
                                        const char* sql) {
  if (!slot) {
    auto q = st.db->prepare(sql);
    if (!q)
      return q.error();
    slot = std::move(*q);
  }
  return slot.get();
}

counter_store_actor::behavior_type durable_counter_store(
  counter_store_actor::stateful_pointer<durable_counter_state> self,
  std::shared_ptr<sql_connection> db) {
  self->state.db = std::move(db);
  return {
    [self](load_atom, counter_atom,
           const std::string& key) -> caf::result<uint64_t> {
      auto& st = self->state;
      auto q = counter_query(st, st.load,
                             "SELECT high_water FROM counters WHERE key = ?1;");
      if (!q)
        return q.error();
      auto& stmt = **q;
      stmt.bind(1, sql_value::of(key));
      auto row = stmt.step();
      uint64_t mark = 0;
      if (row && *row) {
        auto v = stmt.column(0);
        mark = v.integer > 0 ? static_cast<uint64_t>(v.integer) : 0;
      }
      stmt.reset();
      if (!row)
        return row.error();
      return mark;
    },
    [self](store_atom, counter_atom, const std::string& key,
           uint64_t mark) -> caf::result<uint64_t> {
      auto& st = self->state;
      // A mark never goes down: the larger of the stored and the new.
      auto q = counter_query(
        st, st.store,
        "INSERT INTO counters(key, high_water) VALUES(?1, ?2) "
        "ON CONFLICT(key) DO UPDATE SET high_water = CASE "
        "WHEN excluded.high_water > counters.high_water "
        "THEN excluded.high_water ELSE counters.high_water END;");
      if (!q)
        return q.error();
      (*q)->bind(1, sql_value::of(key));
      (*q)->bind(2, sql_value::of(static_cast<int64_t>(mark)));
      if (auto err = (*q)->run())
        return err;
      return mark;
    },
    [self](next_atom, counter_atom, const std::string& key, uint64_t k,
           uint64_t floor, uint64_t limit) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (k > limit || floor > limit - k)
        return counter_exhausted(key, k, limit);
      // One statement in its own transaction: the row's lock orders the
      // nodes, and the new mark comes back only once it is committed.
      // Without a row the counter starts at floor + k (at most `limit`,
      // checked above); with one, the row is left alone when the step
      // would pass `limit`, and no row comes back.
      auto q = counter_query(
        st, st.next,
        "INSERT INTO counters(key, high_water) VALUES(?1, ?2 + ?3) "
        "ON CONFLICT(key) DO UPDATE SET high_water = CASE "
        "WHEN counters.high_water > ?2 THEN counters.high_water ELSE ?2 END "
        "+ ?3 "
        "WHERE CASE WHEN counters.high_water > ?2 THEN counters.high_water "
        "ELSE ?2 END <= ?4 - ?3 "
        "RETURNING high_water;");
      if (!q)
        return q.error();
      auto& stmt = **q;
      stmt.bind(1, sql_value::of(key));
      stmt.bind(2, sql_value::of(static_cast<int64_t>(floor)));
      stmt.bind(3, sql_value::of(static_cast<int64_t>(k)));
      stmt.bind(4, sql_value::of(static_cast<int64_t>(limit)));
      auto row = stmt.step();
      int64_t mark = -1;
      if (row && *row) {
        mark = stmt.column(0).integer;
        // Run to the end: SQLite commits the statement there.
        row = stmt.step();
      }
      stmt.reset();
      if (!row)
        return row.error();
      if (mark < 0)
        return counter_exhausted(key, k, limit);
      return static_cast<uint64_t>(mark);
    },
  };
}

// -- the checkpointer -------------------------------------------------------------

// In WAL mode with synchronous=NORMAL a commit appends to the log and never
// waits for the disk; the checkpoint, which copies the log into the
// database, does (an fsync of each). Run by SQLite after a commit, it would
// hold every write of the batch behind those fsyncs. The state store runs
// none itself: past `checkpoint_pages` it asks the checkpointer, which
// checkpoints on its own connection while the store goes on committing.

/// Log pages after which the store asks for a checkpoint (SQLite's own
/// autocheckpoint threshold), and again every half of it while it grows.
constexpr int checkpoint_pages = 1000;

/// Log pages at which a checkpoint also waits for the writer, so that the
/// log restarts: it bounds the log when passive checkpoints never catch up
/// with a busy writer (64 MiB with 4 KiB pages).
constexpr int wal_restart_pages = 16 * checkpoint_pages;

caf::behavior checkpointer(caf::event_based_actor*,
                           std::shared_ptr<std::unique_ptr<database>> db) {
  std::shared_ptr<database> conn{std::move(*db)};
  return {
    [conn](flush_atom) {
      int log = 0;
      int copied = 0;
      auto* h = conn->handle();
      auto rc = sqlite3_wal_checkpoint_v2(h, nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                          &log, &copied);
      if (rc == SQLITE_OK && log >= wal_restart_pages)
        rc = sqlite3_wal_checkpoint_v2(h, nullptr, SQLITE_CHECKPOINT_RESTART,
                                       &log, &copied);
      if (rc != SQLITE_OK && rc != SQLITE_BUSY)
        spdlog::warn("storage: checkpoint of '{}' failed: {}", conn->path(),
                     sqlite3_errmsg(h));
    },
  };
}

// -- the state store ------------------------------------------------------------

struct state_store_state {
  static inline const char* name = "spindle.state_store";

  struct pending_write {
    sql_write write;
    caf::typed_response_promise<uint64_t> promise;
    /// Run before the answer (null: answer with the rows changed).
    write_hook_ptr hook;

    void answer(uint64_t changes) {
      if (hook)
        promise.deliver(hook->committed(changes));
      else
        promise.deliver(changes);
    }
    void answer(caf::error err) {
      if (hook)
        promise.deliver(hook->failed(std::move(err)));
      else
        promise.deliver(std::move(err));
    }
  };

  std::unique_ptr<sql_connection> db;
  bool group_commit = true;
  /// Prepared statements by SQL text: each area sends a handful of
  /// distinct statements, prepared once.
  std::unordered_map<std::string, std::unique_ptr<sql_query>> cache;
  std::vector<pending_write> pending;
  bool flush_scheduled = false;
  /// Runs the checkpoints; invalid: SQLite checkpoints after commits.
  caf::actor checkpointer;
  int next_checkpoint = checkpoint_pages;
  /// The append-only journal folded into its table (records::
  /// turn_journal) after `fold_every` writes, and before a read that
  /// would find some of its rows there.
  sql_journal journal;
  uint64_t fold_every = 0;
  uint64_t unfolded = 0;
  std::chrono::microseconds linger{0};
  /// Keys with rows in the journal (appended since the last fold that
  /// succeeded), or every key while `journal_unknown`: what an earlier
  /// process left could not be folded at the start.
  std::unordered_set<std::string> journaled;
  bool journal_unknown = false;
  std::shared_ptr<storage_counters> counters;
  /// Versions (sql_value::kind::version): the last one handed out, the
  /// current write's, and the latest a reader took as its snapshot.
  uint64_t last_version = 0;
  uint64_t write_version = 0;
  uint64_t pin = 0;
};

// SQLite's WAL hook: after each commit, with the log's size in pages.
int on_wal_commit(void* ctx, sqlite3*, const char*, int pages) {
  auto& st = *static_cast<state_store_state*>(ctx);
  if (pages < st.next_checkpoint - checkpoint_pages / 2)
    st.next_checkpoint = checkpoint_pages; // the log restarted
  if (pages >= st.next_checkpoint) {
    caf::anon_send(st.checkpointer, flush_atom::value);
    st.next_checkpoint = pages + checkpoint_pages / 2;
  }
  return SQLITE_OK;
}

using state_store_pointer
  = storage_actor::extend<caf::reacts_to<flush_atom>>::stateful_pointer<
    state_store_state>;

caf::expected<sql_query*> prepared(state_store_state& st,
                                   const std::string& sql) {
  auto i = st.cache.find(sql);
  if (i == st.cache.end()) {
    auto stmt = st.db->prepare(sql);
    if (!stmt)
      return stmt.error();
    i = st.cache.emplace(sql, std::move(*stmt)).first;
  }
  return i->second.get();
}

// The prepared statement of `x` with its parameters bound, versions
// included.
caf::expected<sql_query*> bound(state_store_state& st, const sql_statement& x) {
  auto stmt = prepared(st, x.sql);
  if (!stmt)
    return stmt.error();
  for (size_t i = 0; i < x.params.size(); ++i) {
    auto index = static_cast<int>(i + 1);
    switch (x.params[i].type) {
      case sql_value::kind::version:
        (*stmt)->bind(index,
                      sql_value::of(static_cast<int64_t>(st.write_version)));
        break;
      case sql_value::kind::pin:
        // A new walk sees every version up to now (versions are the
        // clock's microseconds, next_thread_version), not only up to this
        // node's last write: what other nodes of a cluster changed since
        // is in it. This node's later writes get versions above it.
        st.pin = std::max({st.pin, st.last_version, next_thread_version(0)});
        [[fallthrough]];
      case sql_value::kind::pinned:
        (*stmt)->bind(index, sql_value::of(static_cast<int64_t>(st.pin)));
        break;
      default:
        (*stmt)->bind(index, x.params[i]);
    }
  }
  return stmt;
}

// Gives `write` its version if a statement of it asks for one.
void assign_version(state_store_state& st, const sql_write& write) {
  for (auto& x : write)
    for (auto& p : x.params)
      if (p.type == sql_value::kind::version) {
        st.write_version = st.last_version
          = next_thread_version(std::max(st.last_version, st.pin));
        return;
      }
}

caf::error run(state_store_state& st, const sql_statement& x,
               uint64_t* changes) {
  auto stmt = bound(st, x);
  if (!stmt)
    return stmt.error();
  auto& s = **stmt;
  if (auto err = s.run())
    return err;
  if (changes != nullptr)
    *changes += static_cast<uint64_t>(st.db->changes());
  return caf::none;
}

caf::error run(state_store_state& st, const char* sql) {
  return run(st, sql_statement{sql, {}}, nullptr);
}

void fold(state_store_state& st);

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now()
                                       - start)
    .count();
}

// Notes the key of a row `x` appends to the journal.
void note_journaled(state_store_state& st, const sql_statement& x) {
  if (x.sql == st.journal.append_sql && !x.params.empty()
      && x.params.front().type == sql_value::kind::text)
    st.journaled.insert(x.params.front().text);
}

// The keyed read's key, if `query` is the journal's keyed read.
const std::string* journal_key(const state_store_state& st,
                               const sql_statement& query) {
  if (query.sql == st.journal.keyed_read_sql && !query.params.empty()
      && query.params.front().type == sql_value::kind::text)
    return &query.params.front().text;
  return nullptr;
}

// Before `query` runs: folds the journal if the query would find rows
// there. Returns the statement to run: the keyed read's home-table twin
// when the journal holds none of its key's rows.
// The statement a read runs: `query` itself, or its home-table twin made
// in `twin` (a keyed read of the journal whose key it does not hold).
// Returned by reference, so that the usual read copies no SQL text and no
// parameter.
const sql_statement& prepare_read(state_store_state& st,
                                  const sql_statement& query,
                                  sql_statement& twin) {
  if (auto key = journal_key(st, query)) {
    // A database other processes write to (PostgreSQL: the other nodes of
    // a cluster) may hold journal rows this store did not append: the
    // keyed read reads both tables, always (docs/storage.md, "The turn
    // journal").
    if (st.db->backend() == sql_backend::postgres)
      return query;
    if (st.journal_unknown || st.journaled.count(*key) > 0) {
      fold(st);
      return query;
    }
    twin = sql_statement{st.journal.keyed_home_read_sql, query.params};
    return twin;
  }
  if (!st.journal.table.empty()
      && query.sql.find(st.journal.table) != std::string::npos)
    fold(st);
  return query;
}

/// Statements a pipelined batch sends before it reads what they came to,
/// so that the answers the server holds meanwhile stay far below what a
/// socket buffers (neither side then waits for the other to read).
constexpr size_t pipeline_statements = 256;

// On a database that pipelines (PostgreSQL): opens the transaction and runs
// every write of `batch` in it without a savepoint, each statement sent
// without waiting for the one before, their outcomes read once per
// `pipeline_statements` (one round trip for a usual batch, where one
// statement at a time costs one per statement and two more per write for
// its savepoint). Fills `results`, one per write, and leaves the
// transaction open for the commit. On any failure the transaction is
// rolled back and the error returned: nothing of the batch is stored.
caf::error run_pipelined(state_store_state& st,
                         std::vector<state_store_state::pending_write>& batch,
                         std::vector<caf::expected<uint64_t>>& results) {
  if (auto err = st.db->begin_pipelined())
    return err;
  std::vector<int64_t> changes;
  size_t queued = 0;
  auto sync = [&] {
    auto out = st.db->sync();
    changes.insert(changes.end(), out.changes.begin(), out.changes.end());
    queued = 0;
    return std::move(out.error);
  };
  auto failed = [&](caf::error err) {
    st.db->rollback();
    return err;
  };
  for (auto& w : batch) {
    assign_version(st, w.write);
    for (auto& x : w.write) {
      auto stmt = bound(st, x);
      if (!stmt)
        return failed(std::move(stmt.error()));
      if (auto err = (*stmt)->send())
        return failed(std::move(err));
      ++queued;
    }
    if (queued >= pipeline_statements)
      if (auto err = sync())
        return failed(std::move(err));
  }
  if (queued > 0)
    if (auto err = sync())
      return failed(std::move(err));
  size_t at = 0;
  for (auto& w : batch) {
    uint64_t sum = 0;
    for (size_t k = 0; k < w.write.size() && at < changes.size(); ++k)
      sum += static_cast<uint64_t>(changes[at++]);
    results.emplace_back(sum);
  }
  if (at != changes.size())
    return failed(make_error(errc::storage_failure,
                             st.db->where()
                               + ": a pipelined batch lost count of its "
                                 "statements"));
  return caf::none;
}

// Runs every write of `batch` in the open transaction, one statement at a
// time, and fills `results`, one per write. SQLite undoes a failing
// statement alone; PostgreSQL spoils the whole transaction with it, so
// there every write has its savepoint. Returns the writes that failed.
uint64_t run_each(state_store_state& st,
                  std::vector<state_store_state::pending_write>& batch,
                  std::vector<caf::expected<uint64_t>>& results) {
  bool savepoint_each = st.db->failure_spoils_transaction();
  uint64_t failed_writes = 0;
  for (auto& w : batch) {
    uint64_t changes = 0;
    assign_version(st, w.write);
    if (w.write.empty() || (w.write.size() == 1 && !savepoint_each)) {
      // One statement is atomic by itself: SQLite undoes a failing
      // statement, not the transaction around it.
      caf::error err;
      if (!w.write.empty())
        err = run(st, w.write.front(), &changes);
      if (err) {
        ++failed_writes;
        results.emplace_back(std::move(err));
      } else {
        results.emplace_back(changes);
      }
      continue;
    }
    caf::error failed = run(st, "SAVEPOINT write;");
    for (auto& x : w.write) {
      if (failed)
        break;
      failed = run(st, x, &changes);
    }
    if (failed) {
      run(st, "ROLLBACK TO write;");
      run(st, "RELEASE write;");
      ++failed_writes;
      results.emplace_back(std::move(failed));
    } else {
      run(st, "RELEASE write;");
      results.emplace_back(changes);
    }
  }
  return failed_writes;
}

// Commits every pending write in one transaction, then answers them all in
// arrival order (running their hooks). On PostgreSQL the batch is first
// pipelined without savepoints (run_pipelined); if that fails, and the
// database can be reached, it runs again as on SQLite, one write at a
// time, each write in its own savepoint where a failing statement would
// spoil the transaction, so a write the database refuses fails alone and
// its batch neighbours commit. Empty writes (barriers) take no part in the
// transaction, and a batch of barriers alone commits nothing. Returns the
// writes the batch carried.
uint64_t flush(state_store_state& st) {
  if (st.pending.empty())
    return 0;
  auto started = std::chrono::steady_clock::now();
  auto batch = std::move(st.pending);
  st.pending.clear();
  auto writes = static_cast<uint64_t>(
    std::count_if(batch.begin(), batch.end(),
                  [](const auto& w) { return !w.write.empty(); }));
  if (writes == 0) {
    for (auto& w : batch)
      w.answer(uint64_t{0});
    return 0;
  }
  auto fail_all = [&](const caf::error& err) {
    if (st.counters)
      st.counters->committed(0, writes, 0);
    for (auto& w : batch)
      if (w.write.empty())
        w.answer(uint64_t{0});
      else
        w.answer(err);
  };
  std::vector<caf::expected<uint64_t>> results;
  results.reserve(batch.size());
  uint64_t failed_writes = 0;
  bool pipelined = false;
  if (st.db->pipelines()) {
    auto err = run_pipelined(st, batch, results);
    pipelined = !err;
    if (err && classify(err) == errc::storage_unavailable) {
      fail_all(err);
      return writes;
    }
    if (err) {
      results.clear();
      spdlog::debug("storage: a pipelined batch of {} writes failed ({}); "
                    "it runs again, one savepoint per write",
                    writes, describe(err));
    }
  }
  if (!pipelined) {
    if (auto err = st.db->begin()) {
      fail_all(err);
      return writes;
    }
    failed_writes = run_each(st, batch, results);
  }
  if (auto err = st.db->commit()) {
    st.db->rollback();
    fail_all(err);
    return writes;
  }
  if (st.counters)
    st.counters->committed(writes - failed_writes, failed_writes,
                           seconds_since(started));
  for (size_t i = 0; i < batch.size(); ++i) {
    if (results[i])
      batch[i].answer(*results[i]);
    else
      batch[i].answer(std::move(results[i].error()));
  }
  st.unfolded += writes;
  if (st.unfolded >= st.fold_every)
    fold(st); // after the answers: no write waits for it
  return writes;
}

// Runs the fold in a transaction of its own. A failure is logged and the
// journal stays: reads see both tables, so nothing is lost.
void fold(state_store_state& st) {
  if (st.journal.fold.empty() || (st.unfolded == 0 && !st.journal_unknown))
    return;
  st.unfolded = 0;
  auto started = std::chrono::steady_clock::now();
  uint64_t moved = 0;
  caf::error failed = st.db->begin();
  for (auto& x : st.journal.fold) {
    if (failed)
      break;
    // The first statement moves the rows; the others clean up.
    failed = run(st, x, &x == &st.journal.fold.front() ? &moved : nullptr);
  }
  if (!failed)
    failed = st.db->commit();
  if (failed) {
    st.db->rollback();
    spdlog::error("storage: folding the journal failed: {}", describe(failed));
    return;
  }
  st.journaled.clear();
  st.journal_unknown = false;
  if (st.counters)
    st.counters->folded(moved, seconds_since(started));
}

// Queues a write for the next commit, which runs behind every write
// already in the mailbox (they commit together), or at once without group
// commit.
caf::typed_response_promise<uint64_t>
enqueue_write(state_store_pointer self, sql_write write, write_hook_ptr hook) {
  auto& s = self->state;
  auto rp = self->make_response_promise<uint64_t>();
  for (auto& x : write)
    note_journaled(s, x);
  s.pending.push_back({std::move(write), rp, std::move(hook)});
  if (!s.group_commit) {
    flush(s);
  } else if (!s.flush_scheduled) {
    s.flush_scheduled = true;
    self->send(self, flush_atom::value);
  }
  return rp;
}

// After a commit of at most `linger_writes` writes the store polls its
// mailbox for up to `linger_time` before its thread goes to sleep, yielding
// the core to any thread that wants it meanwhile. Under a light load the
// next write is usually a caller's next call, due a few tens of
// microseconds after the answer, and waking a sleeping store costs about
// as much again (docs/storage.md, "The store lingers"). Under a heavy load
// writes queue up during each commit, the mailbox is not empty when the
// commit ends, and the store does not linger; larger batches are the sign
// of such a load.
constexpr uint64_t linger_writes = 8;

void linger(state_store_pointer self, uint64_t committed) {
  auto& st = self->state;
  if (committed == 0 || committed > linger_writes || st.linger.count() <= 0)
    return;
  auto started = std::chrono::steady_clock::now();
  auto deadline = started + st.linger;
  bool hit = !self->mailbox().empty();
  while (!hit && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    hit = !self->mailbox().empty();
  }
  if (st.counters)
    st.counters->lingered(hit, seconds_since(started));
}

storage_actor::extend<caf::reacts_to<flush_atom>>::behavior_type
state_store(state_store_pointer self,
            std::shared_ptr<std::unique_ptr<sql_connection>> db,
            bool group_commit,
            caf::actor checkpointer, sql_journal journal, uint64_t fold_every,
            std::chrono::microseconds linger_time,
            std::shared_ptr<storage_counters> counters,
            sql_statement version_floor) {
  auto& st = self->state;
  // The actor is the connection's only user; the shared_ptr only carries
  // it through spawn (CAF copies spawn arguments).
  st.db = std::move(*db);
  st.group_commit = group_commit;
  st.journal = std::move(journal);
  st.counters = std::move(counters);
  st.fold_every = std::max<uint64_t>(1, fold_every);
  st.linger = linger_time;
  // What an earlier process journaled and did not fold; if that fails,
  // every keyed read folds first until a fold succeeds.
  st.journal_unknown = true;
  fold(st);
  // Versions go on from the largest stored; any of them may be a snapshot
  // an earlier process handed out.
  if (!version_floor.sql.empty()) {
    if (auto stmt = bound(st, version_floor)) {
      if (auto row = (*stmt)->step(); row && *row) {
        auto v = (*stmt)->column(0);
        if (v.type == sql_value::kind::integer && v.integer > 0)
          st.last_version = st.pin = static_cast<uint64_t>(v.integer);
      }
      (*stmt)->reset();
    }
  }
  if (checkpointer) {
    st.checkpointer = checkpointer;
    // Replaces SQLite's autocheckpoint on this connection.
    if (auto* lite = st.db->sqlite())
      sqlite3_wal_hook(lite->handle(), &on_wal_commit, &st);
    self->attach_functor([checkpointer](const caf::error&) {
      caf::anon_send_exit(checkpointer, caf::exit_reason::user_shutdown);
    });
  }
  // Writes already queued are committed and answered before it stops.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    flush(self->state);
    self->quit(msg.reason);
  });
  return {
    [self](store_atom, sql_write& write) -> caf::result<uint64_t> {
      return enqueue_write(self, std::move(write), nullptr);
    },
    [self](store_atom, sql_write& write,
           write_hook_ptr& hook) -> caf::result<uint64_t> {
      return enqueue_write(self, std::move(write), std::move(hook));
    },
    [self](flush_atom) {
      self->state.flush_scheduled = false;
      linger(self, flush(self->state));
    },
    [self](load_atom, const sql_statement& query) -> caf::result<sql_rows> {
      auto& s = self->state;
      flush(s); // a read sees every write that arrived before it
      sql_statement twin;
      auto stmt = bound(s, prepare_read(s, query, twin));
      if (!stmt)
        return stmt.error();
      auto rows = (*stmt)->rows();
      if (!rows)
        return rows.error();
      return std::move(*rows);
    },
  };
}

} // namespace

caf::error create_data_dir(const storage_options& options) {
  if (options.files_in_memory())
    return caf::none;
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec)
    return make_error(errc::storage_failure,
                      "cannot create data directory '" + options.data_dir
                        + "': " + ec.message());
  return caf::none;
}

caf::expected<storage_actor>
spawn_state_store(caf::actor_system& sys, const storage_options& options,
                  std::shared_ptr<storage_counters> counters) {
  if (options.on_postgres()) {
    auto conn = open_postgres(options.store);
    if (!conn)
      return conn.error();
    auto shared
      = std::make_shared<std::unique_ptr<sql_connection>>(std::move(*conn));
    auto handle = sys.spawn<caf::detached>(
      state_store, std::move(shared), options.group_commit, caf::actor{},
      records::turn_journal(/*shared=*/true), options.fold_every,
      options.linger,
      std::move(counters), records::thread_version_floor());
    return caf::actor_cast<storage_actor>(handle);
  }
  if (options.in_memory())
    return storage_actor{};
  if (auto err = create_data_dir(options))
    return err;
  auto db = database::open(database_path(options), options.sync);
  if (!db)
    return db.error();
  // A second connection for the checkpoints; without it SQLite checkpoints
  // on the store's own connection, as it does by default.
  caf::actor checkpoints;
  if (auto cdb = database::open(database_path(options), options.sync)) {
    auto carried = std::make_shared<std::unique_ptr<database>>(std::move(*cdb));
    checkpoints = sys.spawn<caf::detached>(checkpointer, std::move(carried));
  } else {
    spdlog::warn("storage: no checkpoint connection ({}); checkpoints run "
                 "after commits",
                 describe(cdb.error()));
  }
  auto shared = std::make_shared<std::unique_ptr<sql_connection>>(
    sqlite_connection(std::move(*db)));
  auto handle = sys.spawn<caf::detached>(state_store, std::move(shared),
                                         options.group_commit,
                                         std::move(checkpoints),
                                         records::turn_journal(),
                                         options.fold_every,
                                         options.linger,
                                         std::move(counters),
                                         records::thread_version_floor());
  return caf::actor_cast<storage_actor>(handle);
}

storage_stats storage_counters::read() const noexcept {
  storage_stats out;
  out.commits = commits_.load(std::memory_order_relaxed);
  out.writes = writes_.load(std::memory_order_relaxed);
  out.failed_writes = failed_writes_.load(std::memory_order_relaxed);
  out.folds = folds_.load(std::memory_order_relaxed);
  out.folded_turns = folded_turns_.load(std::memory_order_relaxed);
  out.commit_seconds
    = static_cast<double>(commit_ns_.load(std::memory_order_relaxed)) / 1e9;
  out.fold_seconds
    = static_cast<double>(fold_ns_.load(std::memory_order_relaxed)) / 1e9;
  out.lingers = lingers_.load(std::memory_order_relaxed);
  out.linger_hits = linger_hits_.load(std::memory_order_relaxed);
  out.linger_seconds
    = static_cast<double>(linger_ns_.load(std::memory_order_relaxed)) / 1e9;
  return out;
}

namespace {

uint64_t nanoseconds(double seconds) {
  return static_cast<uint64_t>(seconds * 1e9);
}

} // namespace

void storage_counters::committed(uint64_t writes, uint64_t failed,
                                 double seconds) noexcept {
  if (writes > 0)
    commits_.fetch_add(1, std::memory_order_relaxed);
  writes_.fetch_add(writes, std::memory_order_relaxed);
  failed_writes_.fetch_add(failed, std::memory_order_relaxed);
  commit_ns_.fetch_add(nanoseconds(seconds), std::memory_order_relaxed);
}

void storage_counters::folded(uint64_t turns, double seconds) noexcept {
  folds_.fetch_add(1, std::memory_order_relaxed);
  folded_turns_.fetch_add(turns, std::memory_order_relaxed);
  fold_ns_.fetch_add(nanoseconds(seconds), std::memory_order_relaxed);
}

void storage_counters::lingered(bool hit, double seconds) noexcept {
  lingers_.fetch_add(1, std::memory_order_relaxed);
  if (hit)
    linger_hits_.fetch_add(1, std::memory_order_relaxed);
  linger_ns_.fetch_add(nanoseconds(seconds), std::memory_order_relaxed);
}

std::string database_path(const storage_options& options) {
  if (options.files_in_memory())
    return ":memory:";
  return (std::filesystem::path{options.data_dir} / "spindle.db").string();
}

std::string memory_database_path(const storage_options& options) {
  if (options.files_in_memory())
    return ":memory:";
  return (std::filesystem::path{options.data_dir} / "memory.db").string();
}

std::string idempotency_database_path(const storage_options& options) {
  if (options.files_in_memory())
    return ":memory:";
  return (std::filesystem::path{options.data_dir} / "idempotency.db")
    .string();
}

caf::expected<counter_store_actor>
spawn_counter_store(caf::actor_system& sys, const storage_options& options) {
  if (options.on_postgres()) {
    auto conn = open_postgres(options.store);
    if (!conn)
      return conn.error();
    std::shared_ptr<sql_connection> shared{std::move(*conn)};
    return sys.spawn<caf::detached>(durable_counter_store, std::move(shared));
  }
  if (options.in_memory())
    return sys.spawn(memory_counter_store);
  if (auto err = create_data_dir(options))
    return err;
  auto db = database::open(database_path(options), options.sync);
  if (!db)
    return db.error();
  std::shared_ptr<sql_connection> shared{sqlite_connection(std::move(*db))};
  return sys.spawn<caf::detached>(durable_counter_store, std::move(shared));
}

} // namespace spindle
