#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace spindle {

/// How hard a commit presses data to disk (SQLite's `synchronous`).
/// `full`: a commit survives power loss. `normal`: in WAL mode a commit
/// survives a crash of the process (kill -9), and the last commits may be
/// lost on power loss.
enum class sync_mode : uint8_t { full, normal };

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

} // namespace spindle
