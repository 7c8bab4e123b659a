#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/runtime/database.hpp"

namespace spindle {

/// Where and how the runtime keeps durable state.
struct storage_options {
  /// Directory of the database (created if missing). Empty or ":memory:"
  /// keeps everything in memory: nothing survives the process.
  std::string data_dir;
  /// A PostgreSQL database's URL (`postgres://user@host:port/db`): the
  /// counters, threads, context windows, tasks and long-term memory live
  /// there instead of `data_dir`'s spindle.db and memory.db
  /// (docs/storage.md, "Backends"). Empty: SQLite.
  std::string store;
  /// How hard commits press data to disk.
  sync_mode sync = sync_mode::full;
  /// Commit the writes that arrive while a commit runs together (group
  /// commit). Off: one transaction per write (a baseline for benchmarks).
  bool group_commit = true;
  /// The state store folds the turn journal into the turns table after
  /// this many writes (and before a load of a thread with turns in it).
  uint64_t fold_every = 16384;
  /// After a commit of a few writes, the state store polls its mailbox for
  /// this long before its thread sleeps, so a caller's next write finds it
  /// awake (docs/storage.md, "The store lingers"). Zero: never.
  std::chrono::microseconds linger{100};

  /// Nothing durable: no PostgreSQL and no data directory.
  bool in_memory() const noexcept {
    return !on_postgres() && (data_dir.empty() || data_dir == ":memory:");
  }
  /// Whether the files beside the store (memory.db, idempotency.db) are
  /// in memory: no data directory. With a PostgreSQL store long-term
  /// memory lives there instead; the idempotency keys stay in their file
  /// until they have their PostgreSQL home (docs/storage.md, "Backends").
  bool files_in_memory() const noexcept {
    return data_dir.empty() || data_dir == ":memory:";
  }
  /// Whether the state lives in PostgreSQL.
  bool on_postgres() const noexcept {
    return !store.empty();
  }
};

/// What the state store did since it started: how well group commit
/// batches, and what the journal's folds cost (docs/storage.md).
struct storage_stats {
  /// Transactions that committed writes, and the writes they carried.
  uint64_t commits = 0;
  uint64_t writes = 0;
  /// Writes answered with `storage_failure` (their batch neighbours
  /// committed).
  uint64_t failed_writes = 0;
  /// Folds of the turn journal that committed, and the turns they moved.
  uint64_t folds = 0;
  uint64_t folded_turns = 0;
  /// Time spent from BEGIN to COMMIT, in commits and in folds.
  double commit_seconds = 0;
  double fold_seconds = 0;
  /// Lingers after a commit, those a write ended (the rest timed out), and
  /// the time spent in all of them.
  uint64_t lingers = 0;
  uint64_t linger_hits = 0;
  double linger_seconds = 0;
};

/// The state store's counters: written by the store alone, read by anyone
/// at any time without asking it (so a scrape never waits for a commit).
class storage_counters {
public:
  storage_stats read() const noexcept;

  /// A transaction ended: `writes` committed in it (none: it failed as a
  /// whole), `failed` were answered with an error.
  void committed(uint64_t writes, uint64_t failed, double seconds) noexcept;
  void folded(uint64_t turns, double seconds) noexcept;
  /// A linger ended, by a write arriving (`hit`) or by its time running out.
  void lingered(bool hit, double seconds) noexcept;

private:
  std::atomic<uint64_t> commits_{0};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> failed_writes_{0};
  std::atomic<uint64_t> folds_{0};
  std::atomic<uint64_t> folded_turns_{0};
  std::atomic<uint64_t> commit_ns_{0};
  std::atomic<uint64_t> fold_ns_{0};
  std::atomic<uint64_t> lingers_{0};
  std::atomic<uint64_t> linger_hits_{0};
  std::atomic<uint64_t> linger_ns_{0};
};

/// The database file inside a data directory.
std::string database_path(const storage_options& options);

/// The long-term memory's database file inside a data directory
/// (`memory.db`, beside `database_path`; ":memory:" for an in-memory
/// configuration). Memory has a file of its own so that its writer never
/// holds the lock the state store's commits need (docs/storage.md).
std::string memory_database_path(const storage_options& options);

/// The answers kept for idempotent retries (`idempotency.db`, beside
/// `database_path`; ":memory:" for an in-memory configuration): a file of
/// its own, so that recording an answer never waits for the state store.
std::string idempotency_database_path(const storage_options& options);

/// Opens the durable store and spawns the actor that serves counters from
/// it (detached: SQLite blocks). For an in-memory configuration it spawns a
/// store that keeps marks in a map. Errors: `storage_failure` naming the
/// directory or file and the cause, before anything is spawned.
caf::expected<counter_store_actor>
spawn_counter_store(caf::actor_system& sys, const storage_options& options);

/// Opens the state store of threads, context windows and tasks
/// (messages/storage.hpp) and spawns its actor (detached: SQLite blocks),
/// with its own connection to `database_path(options)`. For an in-memory
/// configuration there is nothing to make durable: the result is an
/// invalid handle, and the actors keep their state in memory only.
/// The store counts what it does in `counters` (if given).
/// Errors: `storage_failure` naming the directory or file and the cause.
caf::expected<storage_actor>
spawn_state_store(caf::actor_system& sys, const storage_options& options,
                  std::shared_ptr<storage_counters> counters = nullptr);

/// Creates the data directory of `options` if missing (a no-op in memory).
/// Errors: `storage_failure` naming the directory and the cause.
caf::error create_data_dir(const storage_options& options);

} // namespace spindle
