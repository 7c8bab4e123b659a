#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/context_item.hpp"
#include "spindle/messages/context_window.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/messages/threads.hpp"

// How each actor's state maps to the state store's tables (schema in
// runtime/storage/sqlite/database.cpp, migration 3). Pure functions: each builds the
// statements of one change, or decodes the rows of one load. Keeping the
// SQL here keeps it beside the actors whose state it is, and out of the
// domain-agnostic store.

namespace spindle::records {

// -- decoding helpers, shared by every area's records ---------------------------

/// `storage_failure`: the store holds `what`, which this build cannot read.
caf::error unreadable(const std::string& what);

/// Column `i` of `row` exists and is an integer / a text.
bool is_int(const std::vector<sql_value>& row, size_t i);
bool is_text(const std::vector<sql_value>& row, size_t i);

// -- threads --------------------------------------------------------------------

/// A thread as stored: its turns in order, how many clears it has seen, and
/// the sequence number its next turn takes.
struct stored_thread {
  std::vector<turn> turns;
  thread_metadata metadata;
  uint64_t epoch = 0;
  uint64_t next_seq = 0;
  thread_summary summary;
  /// In a cluster: the epoch of the thread's lease this actor writes
  /// under (every write is fenced with it); 0: not in a cluster.
  uint64_t lease_epoch = 0;
};

/// The query loading one thread (the thread row joined with its turns).
sql_statement load_thread(const std::string& thread_id);

/// Decodes `load_thread`'s rows: none when the thread is not stored.
/// Errors: `storage_failure` for rows this build cannot read.
caf::expected<std::optional<stored_thread>>
decode_thread(const sql_rows& rows);

/// Creates a thread (a no-op if it exists) holding `turns` as 0, 1, ...
/// and `metadata`, with a new version.
sql_write create_thread(const std::string& thread_id,
                        const std::vector<turn>& turns, int64_t now_ms,
                        const thread_metadata& metadata = {},
                        const thread_summary& summary = {});

/// Keeps `summary` as the thread's, if the thread is still at `epoch`
/// when the write commits (a clear in between leaves it out).
sql_write put_summary(const std::string& thread_id, uint64_t epoch,
                      const thread_summary& summary);

/// Appends one turn with sequence number `seq` (to the turn journal: a
/// commit then writes the pages at the journal's end, whatever threads it
/// touched).
sql_write append_turn(const std::string& thread_id, uint64_t seq,
                      const turn& t);

/// Adds what an exchange spent to its tenant's counters for the hour of
/// `at_ms` (docs/usage.md): one row per tenant, hour, thread ("" for a
/// call without one), user and source. `append_turn` adds it for a turn
/// that carries usage.
sql_statement count_usage(const std::string& tenant,
                          const std::string& thread_id,
                          const turn_usage& usage, int64_t at_ms);

/// Appends `turns` from sequence number `first_seq` in one write (a batch:
/// all of them or none).
sql_write append_turns(const std::string& thread_id, uint64_t first_seq,
                       const std::vector<turn>& turns);

/// Removes every turn and counts the clear.
sql_write clear_thread(const std::string& thread_id);

// Every change of a thread (a turn, a clear, its metadata) gives it a new
// version (sql_value::kind::version) and keeps the one it replaces while a
// walk's snapshot may need it (docs/threads.md, "Listing").

/// Replaces the thread's metadata.
sql_write set_thread_metadata(const std::string& thread_id,
                              const thread_metadata& metadata);

/// Removes the thread, its turns, its versions and its context window.
sql_write delete_thread(const std::string& thread_id);

/// The largest version stored (the store's versions go on from it).
sql_statement thread_version_floor();

// -- cluster leases (PostgreSQL only; docs/cluster.md) ---------------------------

/// Takes the lease of `thread_id` for node `node` of `incarnation`, if it
/// is free, already this node's, or held by a node whose own lease has
/// run out; the epoch rises by one. One row: the new epoch (NULL when the
/// lease stays with another node), then the holder's name and advertised
/// URL as they were (NULL, NULL for a lease never taken).
sql_statement acquire_thread_lease(const std::string& thread_id,
                                   const std::string& node,
                                   uint64_t incarnation, int64_t now_ms);

/// Decodes `acquire_thread_lease`'s row.
struct lease_answer {
  /// The epoch taken; 0 when another node holds the lease.
  uint64_t epoch = 0;
  std::string holder;
  std::string holder_url;
};
caf::expected<lease_answer> decode_lease(const sql_rows& rows);

/// Lets the lease go if it is still held under `epoch`.
sql_write release_thread_lease(const std::string& thread_id, uint64_t epoch);

/// The statement that opens every write of a thread held under `epoch`:
/// it fails with `not_owner` once the epoch is not current or the node's
/// own lease ran out, and holds the lease until the write commits.
sql_statement fence_thread(const std::string& thread_id, uint64_t epoch);

/// `write` behind `fence_thread(thread_id, epoch)`; unchanged when `epoch`
/// is 0 (no cluster) or `write` is empty (a barrier writes nothing).
sql_write fenced(const std::string& thread_id, uint64_t epoch,
                 sql_write write);

/// Drops the kept versions replaced before `horizon`.
sql_statement prune_thread_versions(uint64_t horizon);

/// The thread as a resource; decoded: none when it is not stored.
sql_statement load_thread_info(const std::string& thread_id);
caf::expected<std::optional<thread_info>>
decode_thread_info(const sql_rows& rows);

/// One page of a walk (`limit + 1` rows: the last tells whether more
/// follow); decoded with the request's limit and snapshot.
sql_statement list_threads_page(const thread_list_request& request);
caf::expected<thread_page> decode_threads_page(const sql_rows& rows,
                                               uint64_t limit,
                                               uint64_t snapshot);

/// Moves the turn journal into `turns`, sorted by thread, in one write:
/// each thread's pages are written once per fold instead of once per
/// commit. The state store runs it (see `turn_journal`). `shared`: other
/// processes append to the journal meanwhile (PostgreSQL, a cluster's
/// nodes): the rows moved are exactly those deleted, in one statement
/// that only PostgreSQL runs.
sql_write fold_turn_journal(bool shared = false);

/// The turn journal as the state store sees it: its fold, the statement of
/// `append_turn` and the query of `load_thread`, both keyed by thread ID.
sql_journal turn_journal(bool shared = false);

/// Every stored thread ID, sorted; and how many there are.
sql_statement list_threads();
sql_statement count_threads();

// -- context windows --------------------------------------------------------------

/// A window as stored: its bounds, counters and items in window order.
struct stored_window {
  window_options bounds;
  uint64_t added = 0;
  uint64_t evicted = 0;
  uint64_t removed = 0;
  uint64_t cleared = 0;
  std::vector<context_item> items;
  /// The position the next item takes.
  uint64_t next_position = 0;
};

/// The window row of a thread; and its items in window order.
sql_statement load_window(const std::string& thread_id);
sql_statement load_window_items(const std::string& thread_id);

/// Decodes both loads: none when no window is stored.
/// Errors: `storage_failure` for rows or items this build cannot read.
caf::expected<std::optional<stored_window>>
decode_window(const sql_rows& window_rows, const sql_rows& item_rows);

/// Inserts or updates the window row (bounds and counters).
sql_statement put_window(const std::string& thread_id,
                         const window_options& bounds, uint64_t added,
                         uint64_t evicted, uint64_t removed, uint64_t cleared);

/// Stores an item at `position` of the window of `thread_id`.
sql_statement insert_item(const std::string& thread_id, uint64_t position,
                          const context_item& item);

/// Removes one item (by the number of its ID); every item of a window.
sql_statement delete_item(uint64_t sequence);
sql_statement delete_items(const std::string& thread_id);

/// The thread holding item number `sequence`, if any (D4 across restarts).
sql_statement find_item_owner(uint64_t sequence);

} // namespace spindle::records
