#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/memory.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/runtime/storage.hpp"

// Long-term memory as an embedder opens it: the actors behind one
// `memory_actor` handle (docs/memory.md). The index under them is
// internal (runtime/memory/memory_index.hpp).

namespace spindle {

/// How many entries of a scope, at most, each term's list keeps: the
/// newest ones containing the term. A retrieval considers no other entry.
inline constexpr size_t memory_recent_per_term = 64;

/// How many candidates, at most, a retrieval ranks into its result (and
/// counts as `matched`).
inline constexpr size_t memory_max_ranked = 64;

/// How the memory actors serve (docs/memory.md, "Readers and the writer").
struct memory_options {
  /// Readers beside the writer, with a data directory; 0: one per core.
  size_t readers = 0;
  /// How long an actor polls its mailbox after answering a retrieval
  /// before its thread sleeps; 0: never.
  std::chrono::microseconds linger{20};
  /// Counts each snippet's tokens (`memory_snippet::tokens`) from counts
  /// kept with the entries it has read; null: snippets are not counted.
  std::shared_ptr<const token_counter> tokens;
};

/// Long-term memory as `spawn_memory` opens it.
struct memory_service {
  /// Every request goes here.
  memory_actor actor;
  /// Retrievals a caller may answer on its own thread first, from what the
  /// readers keep (with a data directory; empty in memory, where the one
  /// actor orders retrievals after the stores sent before them).
  kept_memory_retrieval kept;
};

/// Opens the long-term memory (D8) and spawns the actors behind one
/// `memory_actor` handle (detached: the databases block). A durable
/// configuration gets one writer for stores and `serving.readers` readers
/// for retrievals, each on its own connection to
/// `memory_database_path(options)`, or with a PostgreSQL store
/// (`options.on_postgres()`) to that database, so stores and retrievals
/// never queue behind each other (WAL, or PostgreSQL's snapshots, let
/// readers read while the writer commits). An in-memory configuration
/// opens one private ":memory:" database served by one actor (separate
/// connections could not share it). Entries stored before the index
/// existed are indexed here, before the handle is returned. On PostgreSQL
/// it also listens, on a connection of its own, for the changes other
/// processes' memories commit to the same database, so that its readers
/// never keep serving what those changed (docs/memory.md, "On
/// PostgreSQL").
/// Errors: `storage_failure` naming the file or the redacted URL and the
/// cause.
caf::expected<memory_service> spawn_memory(caf::actor_system& sys,
                                           const storage_options& options,
                                           const memory_options& serving
                                           = {});

} // namespace spindle
