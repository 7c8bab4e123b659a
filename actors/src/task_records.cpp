#include "spindle/actors/task_records.hpp"

#include <algorithm>

#include "spindle/actors/records.hpp"
#include "spindle/messages/error.hpp"

namespace spindle::records {

namespace {

bool by_id(const stored_task& x, const stored_task& y) {
  return x.id < y.id;
}

// The position of `id` in `tasks` (sorted by value), or tasks.size().
size_t find(const std::vector<stored_task>& tasks, const task_id& id) {
  auto i = std::lower_bound(tasks.begin(), tasks.end(), id,
                            [](const stored_task& x, const task_id& y) {
                              return x.id < y;
                            });
  if (i == tasks.end() || i->id != id)
    return tasks.size();
  return static_cast<size_t>(i - tasks.begin());
}

// The columns every load selects, in this order.
constexpr const char* task_columns = "SELECT id, state, payload, outcome, "
                                     "worker, attempts, max_attempts, "
                                     "backoff_ms, retry_at FROM tasks";

} // namespace

stored_orchestration new_orchestration(task_id root, std::string payload,
                                       task_retry retry) {
  stored_orchestration out;
  out.root = root;
  stored_task t;
  t.id = std::move(root);
  t.payload = std::move(payload);
  t.retry = retry;
  out.tasks.push_back(std::move(t));
  return out;
}

std::vector<task_id> executable_tasks(const stored_orchestration& x,
                                      int64_t now_ms) {
  auto& tasks = x.tasks;
  std::vector<uint64_t> incomplete(tasks.size(), 0);
  for (auto& t : tasks) {
    if (t.state == task_state::completed)
      continue;
    if (auto parent = t.id.parent()) {
      auto p = find(tasks, *parent);
      if (p < tasks.size())
        ++incomplete[p];
    }
  }
  std::vector<task_id> out;
  for (size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i].state == task_state::pending && incomplete[i] == 0
        && tasks[i].retry_at_ms <= now_ms)
      out.push_back(tasks[i].id);
  return out;
}

bool lose_worker(stored_task& t, std::string why, int64_t now_ms) {
  t.outcome = std::move(why);
  if (t.attempts >= t.retry.max_attempts) {
    t.state = task_state::stale;
    return false;
  }
  t.state = task_state::pending;
  t.retry_at_ms = now_ms
                  + static_cast<int64_t>(
                    retry_delay_ms(t.retry.backoff_ms, t.attempts));
  return true;
}

task_counts count_states(const stored_orchestration& x) {
  task_counts out;
  out.orchestrations = 1;
  for (auto& t : x.tasks)
    ++out.of(t.state);
  return out;
}

// An orchestration's tenant is on its root's row: the filter is part of
// every load (docs/tenants.md).
sql_statement load_tasks(const std::string& tenant) {
  return make_sql(std::string{task_columns}
                    + " WHERE orchestration IN (SELECT id FROM tasks WHERE "
                      "parent = '' AND tenant = ?1);",
                  tenant);
}

sql_statement load_orchestration(const task_id& root,
                                 const std::string& tenant) {
  return make_sql(std::string{task_columns}
                    + " WHERE orchestration = ?1 AND EXISTS (SELECT 1 FROM "
                      "tasks r WHERE r.id = ?1 AND r.tenant = ?2);",
                  root.to_string(), tenant);
}

sql_statement list_orchestrations(const std::string& tenant) {
  return make_sql("SELECT id FROM tasks WHERE parent = '' AND tenant = ?1;",
                  tenant);
}

sql_statement list_task_tenants() {
  return make_sql("SELECT DISTINCT tenant FROM tasks WHERE parent = '';");
}

bool finished(const stored_orchestration& x) {
  return std::all_of(x.tasks.begin(), x.tasks.end(), [](const stored_task& t) {
    return t.state == task_state::completed || t.state == task_state::failed;
  });
}

caf::expected<std::vector<stored_orchestration>>
decode_tasks(const sql_rows& rows) {
  std::vector<stored_task> all;
  all.reserve(rows.size());
  for (auto& row : rows) {
    if (!is_text(row, 0) || !is_int(row, 1) || !is_text(row, 2)
        || !is_text(row, 3) || !is_text(row, 4) || !is_int(row, 5)
        || !is_int(row, 6) || !is_int(row, 7) || !is_int(row, 8))
      return unreadable("a task row");
    auto id = task_id::parse(row[0].text);
    if (!id)
      return unreadable("a task ID '" + row[0].text + "'");
    if (row[1].integer < 0
        || row[1].integer > static_cast<int64_t>(task_state::stale))
      return unreadable("task " + row[0].text + " in a state "
                        + std::to_string(row[1].integer));
    stored_task t;
    t.id = std::move(*id);
    t.state = static_cast<task_state>(row[1].integer);
    t.payload = row[2].text;
    t.outcome = row[3].text;
    t.worker = row[4].text;
    t.attempts = static_cast<uint32_t>(std::max<int64_t>(row[5].integer, 0));
    t.retry.max_attempts = static_cast<uint32_t>(
      std::clamp<int64_t>(row[6].integer, 1, max_task_attempts));
    t.retry.backoff_ms = static_cast<uint64_t>(
      std::clamp<int64_t>(row[7].integer, 0, max_backoff_ms));
    t.retry_at_ms = row[8].integer;
    all.push_back(std::move(t));
  }
  // By value: orchestrations one after the other, each in preorder with its
  // own task first; a parent is always found before its children.
  std::sort(all.begin(), all.end(), by_id);
  for (auto& t : all)
    if (auto parent = t.id.parent(); parent && find(all, *parent) == all.size())
      return make_error(errc::storage_failure,
                        "the state store holds task " + t.id.to_string()
                          + " whose parent " + parent->to_string()
                          + " is not stored");
  std::vector<stored_orchestration> out;
  for (auto& t : all) {
    if (t.id.is_orchestration()) {
      stored_orchestration orch;
      orch.root = t.id;
      out.push_back(std::move(orch));
    }
    // The parent check above guarantees the orchestration came first.
    out.back().tasks.push_back(std::move(t));
  }
  return out;
}

sql_statement insert_task(const task_id& id, const std::string& payload,
                          const task_retry& retry, const std::string& tenant) {
  std::string parent;
  if (auto p = id.parent())
    parent = p->to_string();
  return make_sql("INSERT INTO tasks(id, orchestration, parent, state, "
                  "payload, max_attempts, backoff_ms, tenant) "
                  "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);",
                  id.to_string(), task_id{id.orchestration, {}}.to_string(),
                  std::move(parent),
                  static_cast<int64_t>(task_state::pending), payload,
                  static_cast<int64_t>(retry.max_attempts),
                  static_cast<int64_t>(retry.backoff_ms), tenant);
}

sql_statement update_task(const task_id& id, task_state state,
                          const std::string& outcome,
                          const std::string& worker, uint32_t attempts,
                          int64_t retry_at_ms) {
  return make_sql("UPDATE tasks SET state = ?2, outcome = ?3, worker = ?4, "
                  "attempts = ?5, retry_at = ?6 WHERE id = ?1;",
                  id.to_string(), static_cast<int64_t>(state), outcome,
                  worker, static_cast<int64_t>(attempts), retry_at_ms);
}

sql_statement update_task(const stored_task& t) {
  return update_task(t.id, t.state, t.outcome, t.worker, t.attempts,
                     t.retry_at_ms);
}

} // namespace spindle::records
