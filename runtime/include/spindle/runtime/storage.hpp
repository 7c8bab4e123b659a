#pragma once

#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/id_allocator.hpp"
#include "spindle/runtime/database.hpp"

namespace spindle {

/// Where and how the runtime keeps durable state.
struct storage_options {
  /// Directory of the database (created if missing). Empty or ":memory:"
  /// keeps everything in memory: nothing survives the process.
  std::string data_dir;
  /// How hard commits press data to disk.
  sync_mode sync = sync_mode::full;

  bool in_memory() const noexcept {
    return data_dir.empty() || data_dir == ":memory:";
  }
};

/// The database file inside a data directory.
std::string database_path(const storage_options& options);

/// Opens the durable store and spawns the actor that serves counters from
/// it (detached: SQLite blocks). For an in-memory configuration it spawns a
/// store that keeps marks in a map. Errors: `storage_failure` naming the
/// directory or file and the cause, before anything is spawned.
caf::expected<counter_store_actor>
spawn_counter_store(caf::actor_system& sys, const storage_options& options);

} // namespace spindle
