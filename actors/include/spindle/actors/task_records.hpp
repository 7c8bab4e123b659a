#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/messages/task_id.hpp"

// How orchestrations and tasks map to the state store's `tasks` table
// (schema in runtime/storage/sqlite/database.cpp, migration 3): one row per task, the
// orchestration's own row included (its parent is ''). Pure functions: each
// builds the statements of one change, or decodes the rows of one load.
// Only the facts are stored (state, payload, outcome, worker, attempts and
// the retry settings, when a retry is due); children and
// the count of incomplete children follow from the IDs and are rebuilt on
// load.

namespace spindle::records {

/// One task as stored.
struct stored_task {
  task_id id;
  task_state state = task_state::pending;
  std::string payload;
  std::string outcome;
  std::string worker;
  uint32_t attempts = 0;
  task_retry retry;
  /// When a retried task becomes executable (ms since the epoch); 0: not
  /// waiting.
  int64_t retry_at_ms = 0;
};

/// One orchestration as stored: its tasks in preorder by value, the
/// orchestration's own task first.
struct stored_orchestration {
  task_id root;
  std::vector<stored_task> tasks;
};

/// A new orchestration holding only its own task, pending with `payload`.
stored_orchestration new_orchestration(task_id root, std::string payload,
                                       task_retry retry = {});

/// The tasks of `x` that are executable at `now_ms` (pending, every child
/// completed, no retry backoff running), in no particular order.
std::vector<task_id> executable_tasks(const stored_orchestration& x,
                                      int64_t now_ms);

/// What becomes of running task `t` whose worker is gone (with `why` as its
/// outcome) at `now_ms`: pending again, after its backoff, when it has
/// attempts left; else stale. True if it is retried.
bool lose_worker(stored_task& t, std::string why, int64_t now_ms);

/// How many tasks of `x` are in each state (`orchestrations` is 1).
task_counts count_states(const stored_orchestration& x);

// -- loads -------------------------------------------------------------------------

/// Every stored task of `tenant`'s orchestrations (the restart of its
/// scheduler; "" the default tenant: docs/tenants.md).
sql_statement load_tasks(const std::string& tenant = {});

/// The tasks of one orchestration of `tenant` (the reload of one
/// orchestrator): none when it is another tenant's.
sql_statement load_orchestration(const task_id& root,
                                 const std::string& tenant = {});

/// The ID of every stored orchestration of `tenant` (one row each, its
/// root's ID).
sql_statement list_orchestrations(const std::string& tenant = {});

/// The tenants that hold orchestrations, the default one ("") among them
/// when it does.
sql_statement list_task_tenants();

/// True when every task of `x` is completed or failed: nothing changes
/// unless a failed task is requeued, and the orchestration may leave
/// memory (docs/orchestration.md, "Retirement").
bool finished(const stored_orchestration& x);

/// Decodes the rows of `load_tasks` or `load_orchestration` into
/// orchestrations ordered by value. Errors: `storage_failure` for rows this
/// build cannot read: an ID that does not parse, an unknown state, a task
/// whose parent or orchestration is not stored.
caf::expected<std::vector<stored_orchestration>>
decode_tasks(const sql_rows& rows);

// -- changes ------------------------------------------------------------------------

/// Stores a new task, pending with `payload` (an orchestration when `id` is
/// one, of `tenant`), which may be tried `retry.max_attempts` times.
sql_statement insert_task(const task_id& id, const std::string& payload,
                          const task_retry& retry = {},
                          const std::string& tenant = {});

/// Stores the state, outcome, worker, attempts and retry time of an
/// existing task.
sql_statement update_task(const task_id& id, task_state state,
                          const std::string& outcome,
                          const std::string& worker, uint32_t attempts,
                          int64_t retry_at_ms);

/// `update_task` of what `t` holds.
sql_statement update_task(const stored_task& t);

} // namespace spindle::records
