#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/memory.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/runtime/memory.hpp"
#include "storage/database.hpp"

// Long-term memory's storage: the entries and the bounded retrieval index
// over them (docs/memory.md, "Retrieval"), which the memory actors
// (memory.cpp) serve.

namespace spindle {

class sql_connection;

/// An entry to store: its content and its scope (as `parse_memory_tags`
/// makes it).
struct memory_entry {
  std::string content;
  memory_scope scope;
};

/// How the readers of a process learn that a scope's entries changed: one
/// counter per slot of scopes (a scope's slot is a hash of its user and
/// thread IDs, the same in every process), raised after every commit that
/// stored into the scope or deleted from it, by the process's own writer
/// and, on PostgreSQL, by the process's listener for the commits of other
/// processes (docs/memory.md, "On PostgreSQL"). A reader keeps what it
/// read of a scope while the scope's counter stands still and the
/// counters are complete. This class is thread-safe.
class memory_changes {
public:
  static constexpr size_t slots = 1024;

  memory_changes();

  /// The slot of a scope (as `memory_scope` names it): a hash that every
  /// process computes alike, so that a slot number can name a change to
  /// another process.
  static size_t slot(std::string_view user_id,
                     std::string_view thread_id) noexcept;

  /// The counter of a scope; a read after it sees every commit it counts.
  uint64_t seen(std::string_view user_id,
                std::string_view thread_id) const noexcept;

  /// Raises the counter of a scope, after a commit that stored into it or
  /// deleted from it.
  void changed(std::string_view user_id, std::string_view thread_id) noexcept;

  /// Raises the counter of a slot (a change another process committed).
  void changed_slot(size_t slot) noexcept;

  /// Raises every counter: changes may have been missed.
  void changed_all() noexcept;

  /// Whether the counters count every change that concerns this process's
  /// readers: true on its own (one process), and on PostgreSQL while the
  /// listener hears the other processes' commits. While false a reader
  /// reads each scope row again on every retrieval.
  bool complete() const noexcept;

  /// Sets `complete`; the listener's to call (false when its connection
  /// is lost, true once it listens again and has raised every counter).
  void set_complete(bool value) noexcept;

  /// A number naming this process's changes in the notes its writer
  /// sends to other processes, so that its listener skips its own.
  uint64_t origin() const noexcept {
    return origin_;
  }

private:
  std::array<std::atomic<uint64_t>, slots> counters_{};
  std::atomic<bool> complete_{true};
  uint64_t origin_;
};

/// Stores entries and keeps the retrieval index over them, on a database
/// it does not own. Not thread-safe: one owner (the memory writer actor,
/// or a program seeding a database before a runtime opens it).
class memory_writer {
public:
  /// Prepares the statements; after each commit the writer raises the
  /// counters of the scopes it stored into in `changes` (if given). On
  /// PostgreSQL several writers, in several processes, may share one
  /// database: each batch takes its IDs from the database, changes a
  /// scope only under its row's lock, and notifies the other processes'
  /// listeners of the scopes it changed as it commits.
  /// Errors: `storage_failure`.
  static caf::expected<std::unique_ptr<memory_writer>>
  open(database& db, std::shared_ptr<memory_changes> changes = nullptr);

  /// The same on a connection: SQLite's, or PostgreSQL's (open_postgres),
  /// whose schema holds memory's tables.
  static caf::expected<std::unique_ptr<memory_writer>>
  open(sql_connection& conn,
       std::shared_ptr<memory_changes> changes = nullptr);

  /// Stores one entry with its container tags in one transaction and
  /// returns its ID. Errors: `invalid_argument` (empty content, bad tags),
  /// `invalid_id`, `too_large`, `storage_failure` (nothing is stored).
  caf::expected<int64_t> store(const std::string& content,
                               const std::vector<std::string>& tags);

  /// Stores entries in one transaction, indexing them together: the path
  /// of `store`, with each term's list written once per call. Returns
  /// their IDs in order. Errors as `store`; one bad entry stores none.
  caf::expected<std::vector<int64_t>>
  store_all(const std::vector<memory_entry>& entries);

  /// What `store_all` refuses `entry` for, without touching the database:
  /// `invalid_argument` (empty content, no scope), `invalid_id`,
  /// `too_large`; none for an entry it would store.
  static caf::error check(const memory_entry& entry);

  /// `check`, and on PostgreSQL also `invalid_argument` for content with
  /// a NUL character, which a PostgreSQL text cannot hold.
  caf::error accepts(const memory_entry& entry) const;

  /// Indexes the entries the index does not hold yet (those of a database
  /// upgraded from schema version 4, or inserted by other means), in
  /// transactions of at most `batch` entries. Returns how many.
  caf::expected<uint64_t> catch_up(size_t batch = 4096);

  /// Deletes every entry of a scope (a user's when `user_id` is set, else
  /// the anonymous entries of `thread_id`) with its index, in one
  /// transaction; returns how many went. Errors: `storage_failure`
  /// (nothing is deleted).
  caf::expected<uint64_t> delete_scope(const std::string& user_id,
                                       const std::string& thread_id);

  /// The scopes (user, thread) holding entries of the tenant whose IDs
  /// start with `prefix` ("TENANT~"). Reads every entry: for deleting a
  /// tenant, not for requests. Errors: `storage_failure`.
  caf::expected<std::vector<std::pair<std::string, std::string>>>
  tenant_scopes(const std::string& prefix);

  /// Deletes one entry and takes it out of its scope's counts and term
  /// lists, in one transaction; returns 1, or 0 when there is none with
  /// `id`. A term's list then holds one entry fewer until stores fill it
  /// again. Errors: `storage_failure` (nothing is deleted).
  /// Deletes entry `id` when it belongs to `tenant`: "*" any tenant, ""
  /// the default tenant, else a tenant's ID prefix ("TENANT~"). 0 when
  /// there is no such entry (of that tenant).
  caf::expected<uint64_t> delete_entry(int64_t id, const std::string& tenant);

  ~memory_writer();

private:
  struct impl;
  explicit memory_writer(std::unique_ptr<impl> p);
  // On `lite`, or else on `pg`.
  static caf::expected<std::unique_ptr<memory_writer>>
  open_on(database* lite, sql_connection* pg,
          std::shared_ptr<memory_changes> changes);
  std::unique_ptr<impl> impl_;
};

/// What one retrieval read, for tests and benchmarks: each is bounded by
/// a constant, whatever the number of stored entries.
struct memory_retrieval_cost {
  /// Term lists with entries used (at most `max_memory_query_terms`).
  uint64_t terms = 0;
  /// Entries in those lists (at most `memory_recent_per_term` each).
  uint64_t postings = 0;
  /// Term lists read from the database (at most
  /// `max_memory_query_terms`); a reader keeps the lists it read while
  /// their scope does not change.
  uint64_t lists_read = 0;
  /// Statements run (scope counts, term lists, entries).
  uint64_t statements = 0;
  /// Distinct entries scored.
  uint64_t candidates = 0;
  /// Entries read from the database (at most `memory_max_ranked`); an
  /// entry the reader has read before comes from its cache instead.
  uint64_t contents = 0;
};

/// Answers retrievals from a database it does not own, keeping the
/// entries and term lists it has read (docs/memory.md, "Readers and the
/// writer"). Not thread-safe: one owner (a memory reader actor).
class memory_reader {
public:
  /// Bytes of entries and term lists a reader keeps by default.
  static constexpr size_t default_cache_bytes = size_t{12} << 20;

  /// Prepares the statements. The reader keeps entries and term lists it
  /// has read, up to `cache_bytes` (0: none; every retrieval reads all it
  /// needs from the database); a scope's counts too, if `changes` is the
  /// writer's. Errors: `storage_failure`.
  static caf::expected<std::unique_ptr<memory_reader>>
  open(database& db, std::shared_ptr<const memory_changes> changes = nullptr,
       size_t cache_bytes = default_cache_bytes);

  /// The same on a connection: SQLite's, or PostgreSQL's (open_postgres).
  static caf::expected<std::unique_ptr<memory_reader>>
  open(sql_connection& conn,
       std::shared_ptr<const memory_changes> changes = nullptr,
       size_t cache_bytes = default_cache_bytes);

  /// Counts every snippet's tokens from now on (`memory_snippet::tokens`),
  /// each entry once while it is kept (null: not counted).
  void count_tokens(std::shared_ptr<const token_counter> counter);

  /// The snippet for `q` (D8 scoping; ranking as docs/memory.md says).
  /// Errors: as `validate_memory_query`, `storage_failure`.
  caf::expected<memory_snippet> retrieve(const memory_query& q);

  /// The snippet for `q` as `retrieve` makes it, from what the reader
  /// keeps alone: none when it would have to run a statement (a scope
  /// changed since it was read, a list or an entry not kept). Never
  /// touches the database, so a caller that must not block can try it.
  std::optional<caf::expected<memory_snippet>>
  retrieve_kept(const memory_query& q);

  /// What the last `retrieve` or `retrieve_kept` read.
  const memory_retrieval_cost& last_cost() const noexcept;

  /// A page of a scope's entries, newest first. Errors: as
  /// `validate_memory_list_request`, `storage_failure`.
  caf::expected<memory_listing> list(const memory_list_request& r);

  ~memory_reader();

private:
  struct impl;
  explicit memory_reader(std::unique_ptr<impl> p);
  // On `lite`, or else on `pg`.
  static caf::expected<std::unique_ptr<memory_reader>>
  open_on(database* lite, sql_connection* pg,
          std::shared_ptr<const memory_changes> changes, size_t cache_bytes);
  std::unique_ptr<impl> impl_;
};

} // namespace spindle
