#include "spindle/actors/records.hpp"

#include "spindle/messages/error.hpp"

namespace spindle::records {

caf::error unreadable(const std::string& what) {
  return make_error(errc::storage_failure,
                    "the state store holds " + what
                      + " this build cannot read");
}

bool is_int(const std::vector<sql_value>& row, size_t i) {
  return i < row.size() && row[i].type == sql_value::kind::integer;
}

bool is_text(const std::vector<sql_value>& row, size_t i) {
  return i < row.size() && row[i].type == sql_value::kind::text;
}

namespace {

uint64_t u64(const sql_value& x) {
  return x.integer < 0 ? 0 : static_cast<uint64_t>(x.integer);
}

} // namespace

// -- threads --------------------------------------------------------------------

namespace {

// A new turn's row in the journal.
sql_statement journal_row(const std::string& thread_id, uint64_t seq,
                          const turn& t) {
  return make_sql("INSERT INTO turn_journal(thread_id, seq, role, content, "
                  "timestamp_ms, tool_call_id, interrupted) "
                  "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7);",
                  thread_id, seq, static_cast<int64_t>(t.role), t.content,
                  t.timestamp_ms, t.tool_call_id, t.interrupted);
}

// A thread and its turns; `journal`: also those not folded yet.
std::string load_thread_sql(bool journal) {
  std::string turns = "SELECT thread_id, seq, role, content, timestamp_ms, "
                      "tool_call_id, interrupted FROM turns "
                      "WHERE thread_id = ?1";
  if (journal)
    turns += " UNION ALL SELECT thread_id, seq, role, content, "
             "timestamp_ms, tool_call_id, interrupted FROM turn_journal "
             "WHERE thread_id = ?1";
  return "SELECT t.epoch, u.seq, u.role, u.content, u.timestamp_ms, "
         "u.tool_call_id, u.interrupted FROM threads t LEFT JOIN ("
         + turns
         + ") u ON u.thread_id = t.thread_id WHERE t.thread_id = ?1 "
           "ORDER BY u.seq;";
}

} // namespace

sql_statement load_thread(const std::string& thread_id) {
  // The store folds the journal first when it holds the thread's turns, or
  // reads `turns` alone when it holds none (turn_journal()); reading both
  // keeps the load exact after a fold that failed.
  static const std::string sql = load_thread_sql(true);
  return make_sql(sql, thread_id);
}

caf::expected<std::optional<stored_thread>>
decode_thread(const sql_rows& rows) {
  if (rows.empty())
    return std::optional<stored_thread>{};
  stored_thread out;
  if (!is_int(rows.front(), 0))
    return unreadable("a thread row");
  out.epoch = u64(rows.front()[0]);
  for (auto& row : rows) {
    if (row.size() < 7 || row[1].type == sql_value::kind::null)
      continue; // a thread without turns
    if (!is_int(row, 1) || !is_int(row, 2) || !is_text(row, 3)
        || !is_int(row, 4) || !is_text(row, 5) || !is_int(row, 6))
      return unreadable("a turn");
    if (row[2].integer < 0
        || row[2].integer > static_cast<int64_t>(turn_role::tool))
      return unreadable("a turn role " + std::to_string(row[2].integer));
    turn t;
    t.role = static_cast<turn_role>(row[2].integer);
    t.content = row[3].text;
    t.timestamp_ms = row[4].integer;
    t.tool_call_id = row[5].text;
    t.interrupted = row[6].integer != 0;
    out.turns.push_back(std::move(t));
    out.next_seq = u64(row[1]) + 1;
  }
  return std::optional<stored_thread>{std::move(out)};
}

sql_write create_thread(const std::string& thread_id,
                        const std::vector<turn>& turns, int64_t now_ms) {
  sql_write out;
  out.reserve(turns.size() + 1);
  out.push_back(make_sql("INSERT INTO threads(thread_id, epoch, created_ms) "
                         "VALUES(?1, 0, ?2) ON CONFLICT DO NOTHING;",
                         thread_id, now_ms));
  for (size_t i = 0; i < turns.size(); ++i)
    out.push_back(journal_row(thread_id, i, turns[i]));
  return out;
}

sql_write append_turn(const std::string& thread_id, uint64_t seq,
                      const turn& t) {
  // Moved in: a braced list would copy the statement once more.
  sql_write out;
  out.push_back(journal_row(thread_id, seq, t));
  return out;
}

sql_write clear_thread(const std::string& thread_id) {
  return {make_sql("DELETE FROM turns WHERE thread_id = ?1;", thread_id),
          make_sql("DELETE FROM turn_journal WHERE thread_id = ?1;",
                   thread_id),
          make_sql("UPDATE threads SET epoch = epoch + 1 "
                   "WHERE thread_id = ?1;",
                   thread_id)};
}

sql_write fold_turn_journal() {
  return {make_sql("INSERT INTO turns(thread_id, seq, role, content, "
                   "timestamp_ms, tool_call_id, interrupted) "
                   "SELECT thread_id, seq, role, content, timestamp_ms, "
                   "tool_call_id, interrupted FROM turn_journal "
                   "ORDER BY thread_id, seq;"),
          make_sql("DELETE FROM turn_journal;")};
}

sql_journal turn_journal() {
  return sql_journal{"turn_journal", fold_turn_journal(),
                     journal_row("", 0, turn{}).sql, load_thread_sql(true),
                     load_thread_sql(false)};
}

sql_statement list_threads() {
  return make_sql("SELECT thread_id FROM threads ORDER BY thread_id;");
}

sql_statement count_threads() {
  return make_sql("SELECT count(*) FROM threads;");
}

// -- context windows --------------------------------------------------------------

sql_statement load_window(const std::string& thread_id) {
  return make_sql("SELECT capacity, token_budget, added, evicted, removed, "
                  "cleared FROM context_windows WHERE thread_id = ?1;",
                  thread_id);
}

sql_statement load_window_items(const std::string& thread_id) {
  return make_sql("SELECT position, item FROM context_items "
                  "WHERE thread_id = ?1 ORDER BY position;",
                  thread_id);
}

caf::expected<std::optional<stored_window>>
decode_window(const sql_rows& window_rows, const sql_rows& item_rows) {
  if (window_rows.empty())
    return std::optional<stored_window>{};
  auto& w = window_rows.front();
  for (size_t i = 0; i < 6; ++i)
    if (!is_int(w, i))
      return unreadable("a context window row");
  stored_window out;
  out.bounds.capacity = w[0].integer;
  out.bounds.token_budget = w[1].integer;
  out.added = u64(w[2]);
  out.evicted = u64(w[3]);
  out.removed = u64(w[4]);
  out.cleared = u64(w[5]);
  for (auto& row : item_rows) {
    if (!is_int(row, 0) || !is_text(row, 1))
      return unreadable("a context item row");
    auto item = parse_context_item(row[1].text);
    if (!item)
      return unreadable("a context item (" + describe(item.error()) + ")");
    out.items.push_back(std::move(*item));
    out.next_position = u64(row[0]) + 1;
  }
  return std::optional<stored_window>{std::move(out)};
}

sql_statement put_window(const std::string& thread_id,
                         const window_options& bounds, uint64_t added,
                         uint64_t evicted, uint64_t removed,
                         uint64_t cleared) {
  return make_sql("INSERT INTO context_windows(thread_id, capacity, "
                  "token_budget, added, evicted, removed, cleared) "
                  "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                  "ON CONFLICT(thread_id) DO UPDATE SET "
                  "capacity = excluded.capacity, "
                  "token_budget = excluded.token_budget, "
                  "added = excluded.added, evicted = excluded.evicted, "
                  "removed = excluded.removed, cleared = excluded.cleared;",
                  thread_id, bounds.capacity, bounds.token_budget, added,
                  evicted, removed, cleared);
}

sql_statement insert_item(const std::string& thread_id, uint64_t position,
                          const context_item& item) {
  return make_sql("INSERT INTO context_items(seq, thread_id, position, item) "
                  "VALUES(?1, ?2, ?3, ?4);",
                  item.sequence(), thread_id, position,
                  context_item_to_json(item).dump());
}

sql_statement delete_item(uint64_t sequence) {
  return make_sql("DELETE FROM context_items WHERE seq = ?1;", sequence);
}

sql_statement delete_items(const std::string& thread_id) {
  return make_sql("DELETE FROM context_items WHERE thread_id = ?1;",
                  thread_id);
}

sql_statement find_item_owner(uint64_t sequence) {
  return make_sql("SELECT thread_id FROM context_items WHERE seq = ?1;",
                  sequence);
}

} // namespace spindle::records
