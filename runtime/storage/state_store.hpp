#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/id_allocator.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/runtime/storage.hpp"

// The state store and the counter store the runtime opens
// (docs/storage.md): their files' paths, the actors, and the counters the
// store keeps for `runtime::store_stats`.

namespace spindle {

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
