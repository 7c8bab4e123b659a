#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "spindle/messages/orchestration.hpp"
#include "spindle/messages/storage.hpp"
#include "spindle/messages/task_id.hpp"

// How orchestrations and tasks map to the state store's `tasks` table
// (schema in runtime/src/database.cpp, migration 3): one row per task, the
// orchestration's own row included (its parent is ''). Pure functions: each
// builds the statements of one change, or decodes the rows of one load.
// Only the facts are stored (state, payload, outcome, worker); children and
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
};

/// One orchestration as stored: its tasks in preorder by value, the
/// orchestration's own task first.
struct stored_orchestration {
  task_id root;
  std::vector<stored_task> tasks;
};

/// A new orchestration holding only its own task, pending with `payload`.
stored_orchestration new_orchestration(task_id root, std::string payload);

/// The tasks of `x` that are executable (pending, every child completed),
/// in no particular order.
std::vector<task_id> executable_tasks(const stored_orchestration& x);

/// How many tasks of `x` are in each state (`orchestrations` is 1).
task_counts count_states(const stored_orchestration& x);

// -- loads -------------------------------------------------------------------------

/// Every stored task (the restart of the scheduler).
sql_statement load_tasks();

/// The tasks of one orchestration (the reload of one orchestrator).
sql_statement load_orchestration(const task_id& root);

/// Decodes the rows of `load_tasks` or `load_orchestration` into
/// orchestrations ordered by value. Errors: `storage_failure` for rows this
/// build cannot read: an ID that does not parse, an unknown state, a task
/// whose parent or orchestration is not stored.
caf::expected<std::vector<stored_orchestration>>
decode_tasks(const sql_rows& rows);

// -- changes ------------------------------------------------------------------------

/// Stores a new task, pending with `payload` (an orchestration when `id` is
/// one).
sql_statement insert_task(const task_id& id, const std::string& payload);

/// Stores the state, outcome and worker of an existing task.
sql_statement update_task(const task_id& id, task_state state,
                          const std::string& outcome,
                          const std::string& worker);

/// Turns every running task into a stale one (their workers belonged to a
/// previous process); the rows it changes are the tasks it made stale.
sql_statement stale_running_tasks();

} // namespace spindle::records
