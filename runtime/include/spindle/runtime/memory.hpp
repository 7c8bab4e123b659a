#pragma once

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/memory.hpp"
#include "spindle/runtime/storage.hpp"

namespace spindle {

/// Opens the long-term memory (D8) and spawns its actor (detached: SQLite
/// blocks). An in-memory configuration opens a private ":memory:" database;
/// a durable one opens its own connection to `database_path(options)`
/// (WAL lets it share the file with the other stores). Entries are ranked
/// with SQLite FTS5's bm25 against the current message; see docs/memory.md.
/// Errors: `storage_failure` naming the file and the cause.
caf::expected<memory_actor> spawn_memory(caf::actor_system& sys,
                                         const storage_options& options);

} // namespace spindle
