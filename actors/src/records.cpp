#include "spindle/actors/records.hpp"

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/work.hpp"

#include <algorithm>
#include <limits>

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
                  "timestamp_ms, tool_call_id, interrupted, tool_calls, "
                  "tokens, token_encoding, usage_prompt, usage_completion, "
                  "usage_source) "
                  "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
                  "?12, ?13);",
                  thread_id, seq, static_cast<int64_t>(t.role), t.content,
                  t.timestamp_ms, t.tool_call_id, t.interrupted,
                  tool_calls_to_json(t.tool_calls),
                  static_cast<int64_t>(t.tokens),
                  static_cast<int64_t>(t.token_encoding),
                  static_cast<int64_t>(t.usage.prompt_tokens),
                  static_cast<int64_t>(t.usage.completion_tokens),
                  static_cast<int64_t>(t.usage.source));
}

} // namespace

sql_statement count_usage(const std::string& tenant,
                          const std::string& thread_id,
                          const turn_usage& usage, int64_t at_ms) {
  int64_t hour = at_ms / 3600000 * 3600;
  return make_sql("INSERT INTO usage_counters(tenant, hour, thread_id, "
                  "user_id, source, exchanges, prompt_tokens, "
                  "completion_tokens) VALUES(?1, ?2, ?3, ?4, ?5, 1, ?6, ?7) "
                  "ON CONFLICT(tenant, hour, thread_id, user_id, source) "
                  "DO UPDATE SET exchanges = usage_counters.exchanges + 1, "
                  "prompt_tokens = usage_counters.prompt_tokens "
                  "+ excluded.prompt_tokens, "
                  "completion_tokens = usage_counters.completion_tokens "
                  "+ excluded.completion_tokens;",
                  tenant, hour, thread_id, usage.user_id,
                  static_cast<int64_t>(usage.source),
                  static_cast<int64_t>(usage.prompt_tokens),
                  static_cast<int64_t>(usage.completion_tokens));
}

namespace {

// The usage of an exchange's assistant turn, counted in its thread's
// tenant at the turn's time.
sql_statement count_turn_usage(const std::string& thread_id,
                               const turn& t) {
  return records::count_usage(std::string{tenant_of_id(thread_id)}, thread_id,
                     t.usage, t.timestamp_ms);
}

// A thread and its turns; `journal`: also those not folded yet.
std::string load_thread_sql(bool journal) {
  std::string turns = "SELECT thread_id, seq, role, content, timestamp_ms, "
                      "tool_call_id, interrupted, tool_calls, tokens, "
                      "token_encoding, usage_prompt, usage_completion, "
                      "usage_source FROM turns WHERE thread_id = ?1";
  if (journal)
    turns += " UNION ALL SELECT thread_id, seq, role, content, "
             "timestamp_ms, tool_call_id, interrupted, tool_calls, tokens, "
             "token_encoding, usage_prompt, usage_completion, usage_source "
             "FROM turn_journal WHERE thread_id = ?1";
  return "SELECT t.epoch, u.seq, u.role, u.content, u.timestamp_ms, "
         "u.tool_call_id, u.interrupted, t.metadata, u.tool_calls, "
         "u.tokens, u.token_encoding, s.content, s.upto, s.tokens, "
         "s.token_encoding, s.updated_ms, u.usage_prompt, "
         "u.usage_completion, u.usage_source "
         "FROM threads t "
         "LEFT JOIN thread_summaries s ON s.thread_id = t.thread_id "
         "LEFT JOIN ("
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
  if (is_text(rows.front(), 7))
    out.metadata = metadata_from_json(rows.front()[7].text);
  if (auto& row = rows.front(); is_text(row, 11) && is_int(row, 12)
                                && is_int(row, 13) && is_int(row, 14)
                                && is_int(row, 15)) {
    out.summary.content = row[11].text;
    out.summary.upto = u64(row[12]);
    out.summary.tokens = static_cast<uint32_t>(
      std::min<uint64_t>(u64(row[13]), std::numeric_limits<uint32_t>::max()));
    out.summary.token_encoding = static_cast<uint8_t>(
      std::min<uint64_t>(u64(row[14]), std::numeric_limits<uint8_t>::max()));
    out.summary.updated_ms = row[15].integer;
  }
  for (auto& row : rows) {
    if (row.size() < 7 || row[1].type == sql_value::kind::null)
      continue; // a thread without turns
    if (!is_int(row, 1) || !is_int(row, 2) || !is_text(row, 3)
        || !is_int(row, 4) || !is_text(row, 5) || !is_int(row, 6))
      return unreadable("a turn");
    if (row[2].integer < 0
        || row[2].integer > static_cast<int64_t>(turn_role::tool))
      return unreadable("a turn role " + std::to_string(row[2].integer));
    count_work(work_kind::turns_loaded, 1);
    turn t;
    t.role = static_cast<turn_role>(row[2].integer);
    t.content = row[3].text;
    t.timestamp_ms = row[4].integer;
    t.tool_call_id = row[5].text;
    t.interrupted = row[6].integer != 0;
    if (is_text(row, 8)) {
      auto calls = tool_calls_from_json(row[8].text);
      if (!calls)
        return unreadable("a turn's tool calls (" + describe(calls.error())
                          + ")");
      t.tool_calls = std::move(*calls);
    }
    // A count and its encoding are kept together, or not at all.
    if (is_int(row, 9) && is_int(row, 10) && row[9].integer >= 0
        && row[9].integer <= std::numeric_limits<uint32_t>::max()
        && row[10].integer > 0
        && row[10].integer <= std::numeric_limits<uint8_t>::max()) {
      t.tokens = static_cast<uint32_t>(row[9].integer);
      t.token_encoding = static_cast<uint8_t>(row[10].integer);
    }
    if (is_int(row, 16) && is_int(row, 17) && is_int(row, 18)
        && row[18].integer > 0
        && row[18].integer <= static_cast<int64_t>(usage_source::upstream)) {
      auto clamp = [](int64_t v) {
        return static_cast<uint32_t>(std::clamp<int64_t>(
          v, 0, std::numeric_limits<uint32_t>::max()));
      };
      t.usage.prompt_tokens = clamp(row[16].integer);
      t.usage.completion_tokens = clamp(row[17].integer);
      t.usage.source = static_cast<usage_source>(row[18].integer);
    }
    out.turns.push_back(std::move(t));
    out.next_seq = u64(row[1]) + 1;
  }
  return std::optional<stored_thread>{std::move(out)};
}

namespace {

// Before a thread's version is replaced: keeps it if a walk's snapshot
// saw it (docs/threads.md, "Listing").
sql_statement keep_version(const std::string& thread_id) {
  return make_sql("INSERT INTO thread_versions(version, thread_id, "
                  "superseded) SELECT version, thread_id, ?2 FROM threads "
                  "WHERE thread_id = ?1 AND version <= ?3 "
                  "ON CONFLICT DO NOTHING;",
                  thread_id, sql_value::kind::version,
                  sql_value::kind::pinned);
}

} // namespace

sql_write put_summary(const std::string& thread_id, uint64_t epoch,
                      const thread_summary& summary) {
  return {make_sql("INSERT INTO thread_summaries(thread_id, "
                   "content, upto, tokens, token_encoding, updated_ms) "
                   "SELECT ?1, ?3, ?4, ?5, ?6, ?7 FROM threads "
                   "WHERE thread_id = ?1 AND epoch = ?2 "
                   "ON CONFLICT(thread_id) DO UPDATE SET "
                   "content = excluded.content, upto = excluded.upto, "
                   "tokens = excluded.tokens, "
                   "token_encoding = excluded.token_encoding, "
                   "updated_ms = excluded.updated_ms;",
                   thread_id, epoch, summary.content, summary.upto,
                   static_cast<int64_t>(summary.tokens),
                   static_cast<int64_t>(summary.token_encoding),
                   summary.updated_ms)};
}

sql_write create_thread(const std::string& thread_id,
                        const std::vector<turn>& turns, int64_t now_ms,
                        const thread_metadata& metadata,
                        const thread_summary& summary) {
  sql_write out;
  out.reserve(turns.size() + 2);
  out.push_back(make_sql("INSERT INTO threads(thread_id, epoch, created_ms, "
                         "version, turn_count, metadata) "
                         "VALUES(?1, 0, ?2, ?3, ?4, ?5) "
                         "ON CONFLICT DO NOTHING;",
                         thread_id, now_ms, sql_value::kind::version,
                         static_cast<uint64_t>(turns.size()),
                         metadata_to_json(metadata)));
  for (size_t i = 0; i < turns.size(); ++i)
    out.push_back(journal_row(thread_id, i, turns[i]));
  if (summary.upto > 0)
    for (auto& w : put_summary(thread_id, 0, summary))
      out.push_back(std::move(w));
  return out;
}

sql_write append_turn(const std::string& thread_id, uint64_t seq,
                      const turn& t) {
  // Moved in: a braced list would copy the statement once more.
  sql_write out;
  out.reserve(4);
  out.push_back(journal_row(thread_id, seq, t));
  if (t.usage.known())
    out.push_back(count_turn_usage(thread_id, t));
  out.push_back(keep_version(thread_id));
  out.push_back(make_sql("UPDATE threads SET version = ?2, "
                         "turn_count = turn_count + 1 WHERE thread_id = ?1;",
                         thread_id, sql_value::kind::version));
  return out;
}

sql_write append_turns(const std::string& thread_id, uint64_t first_seq,
                       const std::vector<turn>& turns) {
  sql_write out;
  out.reserve(turns.size() + 2);
  for (size_t i = 0; i < turns.size(); ++i) {
    out.push_back(journal_row(thread_id, first_seq + i, turns[i]));
    if (turns[i].usage.known())
      out.push_back(count_turn_usage(thread_id, turns[i]));
  }
  out.push_back(keep_version(thread_id));
  out.push_back(make_sql("UPDATE threads SET version = ?2, "
                         "turn_count = turn_count + ?3 WHERE thread_id = ?1;",
                         thread_id, sql_value::kind::version,
                         static_cast<uint64_t>(turns.size())));
  return out;
}

sql_write clear_thread(const std::string& thread_id) {
  return {make_sql("DELETE FROM turns WHERE thread_id = ?1;", thread_id),
          make_sql("DELETE FROM turn_journal WHERE thread_id = ?1;",
                   thread_id),
          make_sql("DELETE FROM thread_summaries WHERE thread_id = ?1;",
                   thread_id),
          keep_version(thread_id),
          make_sql("UPDATE threads SET epoch = epoch + 1, version = ?2, "
                   "turn_count = 0 WHERE thread_id = ?1;",
                   thread_id, sql_value::kind::version)};
}

sql_write set_thread_metadata(const std::string& thread_id,
                              const thread_metadata& metadata) {
  return {keep_version(thread_id),
          make_sql("UPDATE threads SET metadata = ?2, version = ?3 "
                   "WHERE thread_id = ?1;",
                   thread_id, metadata_to_json(metadata),
                   sql_value::kind::version)};
}

sql_write delete_thread(const std::string& thread_id) {
  sql_write out;
  for (auto table : {"turns", "turn_journal", "thread_summaries",
                     "thread_versions", "threads", "context_items",
                     "context_windows"})
    out.push_back(make_sql(std::string{"DELETE FROM "} + table
                             + " WHERE thread_id = ?1;",
                           thread_id));
  return out;
}

sql_statement thread_version_floor() {
  return make_sql("SELECT max(v) FROM (SELECT max(version) AS v FROM threads "
                  "UNION ALL SELECT max(superseded) FROM thread_versions) "
                  "AS floors;");
}

sql_statement prune_thread_versions(uint64_t horizon) {
  return make_sql("DELETE FROM thread_versions WHERE superseded < ?1;",
                  horizon);
}

sql_statement acquire_thread_lease(const std::string& thread_id,
                                   const std::string& node,
                                   uint64_t incarnation, int64_t now_ms) {
  return make_sql(
    "WITH taken AS ("
    "  INSERT INTO thread_leases AS l "
    "    (thread_id, node, incarnation, epoch, acquired_ms) "
    "  VALUES (?1, ?2, ?3, 1, ?4) "
    "  ON CONFLICT (thread_id) DO UPDATE "
    "    SET node = excluded.node, incarnation = excluded.incarnation, "
    "        epoch = l.epoch + 1, acquired_ms = excluded.acquired_ms "
    "    WHERE l.node IS NULL "
    "       OR (l.node = excluded.node "
    "           AND l.incarnation = excluded.incarnation) "
    "       OR NOT EXISTS (SELECT 1 FROM cluster_nodes n "
    "                       WHERE n.name = l.node "
    "                         AND n.incarnation = l.incarnation "
    "                         AND n.expires_at > clock_timestamp()) "
    "  RETURNING l.epoch) "
    "SELECT (SELECT epoch FROM taken), h.node, n.advertise "
    "  FROM (SELECT 1 AS one) AS o "
    "  LEFT JOIN thread_leases AS h ON h.thread_id = ?1 "
    "  LEFT JOIN cluster_nodes AS n ON n.name = h.node;",
    thread_id, node, incarnation, now_ms);
}

caf::expected<lease_answer> decode_lease(const sql_rows& rows) {
  if (rows.size() != 1 || rows[0].size() != 3)
    return unreadable("a thread lease");
  auto& row = rows[0];
  lease_answer out;
  if (is_int(row, 0) && row[0].integer > 0)
    out.epoch = static_cast<uint64_t>(row[0].integer);
  if (is_text(row, 1))
    out.holder = row[1].text;
  if (is_text(row, 2))
    out.holder_url = row[2].text;
  return out;
}

sql_write release_thread_lease(const std::string& thread_id,
                               uint64_t epoch) {
  return {make_sql("UPDATE thread_leases SET node = NULL "
                   "WHERE thread_id = ?1 AND epoch = ?2;",
                   thread_id, epoch)};
}

sql_statement fence_thread(const std::string& thread_id, uint64_t epoch) {
  return make_sql("SELECT spindle_fence(?1, ?2);", thread_id, epoch);
}

sql_write fenced(const std::string& thread_id, uint64_t epoch,
                 sql_write write) {
  if (epoch == 0 || write.empty())
    return write;
  write.insert(write.begin(), fence_thread(thread_id, epoch));
  return write;
}

sql_statement load_thread_info(const std::string& thread_id) {
  return make_sql("SELECT thread_id, created_ms, version, turn_count, "
                  "metadata FROM threads WHERE thread_id = ?1;",
                  thread_id);
}

namespace {

caf::expected<thread_info> decode_info(const std::vector<sql_value>& row,
                                       size_t at) {
  if (!is_text(row, at) || !is_int(row, at + 1) || !is_int(row, at + 2)
      || !is_int(row, at + 3) || !is_text(row, at + 4))
    return unreadable("a thread row");
  return thread_info{row[at].text, row[at + 1].integer, u64(row[at + 2]),
                     u64(row[at + 3]), metadata_from_json(row[at + 4].text)};
}

} // namespace

caf::expected<std::optional<thread_info>>
decode_thread_info(const sql_rows& rows) {
  if (rows.empty())
    return std::optional<thread_info>{};
  auto info = decode_info(rows.front(), 0);
  if (!info)
    return info.error();
  return std::optional<thread_info>{std::move(*info)};
}

sql_statement list_threads_page(const thread_list_request& r) {
  // Each arm yields (place, thread_id, created, version, turns, metadata,
  // snapshot) in the order of its index; SQLite merges the two. ?1 is the
  // snapshot: a new one (pin) for a walk's first page.
  std::string filters;
  std::vector<sql_value> params;
  params.push_back(r.snapshot == 0 ? sql_value::of(sql_value::kind::pin)
                                   : to_sql_value(r.snapshot));
  bool at_start = r.after_version == 0 && r.after_id.empty();
  params.push_back(at_start ? sql_value::of(std::numeric_limits<int64_t>::max())
                            : to_sql_value(r.after_version));
  params.push_back(to_sql_value(r.after_id));
  params.push_back(to_sql_value(r.updated_after_ms * 1000));
  params.push_back(to_sql_value(r.limit + 1));
  for (auto& [key, value] : r.filters) {
    auto k = params.size() + 1;
    filters += " AND json_extract(t.metadata, ?" + std::to_string(k)
               + ") = ?" + std::to_string(k + 1);
    params.push_back(to_sql_value("$.\"" + key + "\""));
    params.push_back(to_sql_value(value));
  }
  if (r.scoped && r.tenant_prefix.empty()) {
    filters += " AND t.thread_id NOT LIKE '%~%'";
  } else if (r.scoped) {
    // The qualified IDs of one tenant: those from "TENANT~" up to, not
    // including, "TENANT" followed by the character after '~'.
    auto k = params.size() + 1;
    filters += " AND t.thread_id >= ?" + std::to_string(k)
               + " AND t.thread_id < ?" + std::to_string(k + 1);
    auto upper = r.tenant_prefix;
    upper.back() = static_cast<char>(upper.back() + 1);
    params.push_back(to_sql_value(r.tenant_prefix));
    params.push_back(to_sql_value(std::move(upper)));
  }
  // One upper bound per arm, so that SQLite starts each index scan at
  // the page's place (the cursor's place lies at or below the snapshot):
  // with two, it may start at the snapshot and skip every row above the
  // place, a cost that grows with the depth of the page.
  auto below = [at_start](const char* t) {
    std::string x{t};
    return at_start ? x + ".version <= ?1 AND ?2 > 0 AND ?3 = ?3"
                    : "(" + x + ".version, " + x + ".thread_id) < (?2, ?3)";
  };
  std::string sql
    = "SELECT t.version, t.thread_id, t.created_ms, t.version, t.turn_count, "
      "t.metadata, ?1 FROM threads t WHERE "
      + below("t") + " AND t.version > ?4" + filters
      + " UNION ALL "
        "SELECT h.version, h.thread_id, t.created_ms, t.version, "
        "t.turn_count, t.metadata, ?1 FROM thread_versions h "
        "JOIN threads t ON t.thread_id = h.thread_id WHERE "
      + below("h") + " AND h.superseded > ?1 AND h.version > ?4" + filters
      + " ORDER BY 1 DESC, 2 DESC LIMIT ?5;";
  return sql_statement{std::move(sql), std::move(params)};
}

caf::expected<thread_page> decode_threads_page(const sql_rows& rows,
                                               uint64_t limit,
                                               uint64_t snapshot) {
  thread_page page;
  page.snapshot = snapshot;
  for (auto& row : rows) {
    if (!is_int(row, 0) || !is_int(row, 6))
      return unreadable("a thread listing row");
    page.snapshot = u64(row[6]);
    if (page.threads.size() == limit) {
      page.more = true;
      break;
    }
    auto info = decode_info(row, 1);
    if (!info)
      return info.error();
    page.threads.push_back(std::move(*info));
    page.last_version = u64(row[0]);
  }
  return page;
}

sql_write fold_turn_journal(bool shared) {
  constexpr const char* columns
    = "thread_id, seq, role, content, timestamp_ms, tool_call_id, "
      "interrupted, tool_calls, tokens, token_encoding, usage_prompt, "
      "usage_completion, usage_source";
  // PostgreSQL: other processes (a cluster's nodes) append while this one
  // folds, so the rows moved are exactly the rows deleted, in one
  // statement; a copy then a DELETE of the whole table would delete rows
  // appended in between without having copied them.
  if (shared)
    return {make_sql(std::string{"WITH moved AS (DELETE FROM turn_journal "
                                 "RETURNING "}
                     + columns + ") INSERT INTO turns(" + columns
                     + ") SELECT " + columns
                     + " FROM moved ORDER BY thread_id, seq;")};
  return {make_sql(std::string{"INSERT INTO turns("} + columns + ") SELECT "
                     + columns
                     + " FROM turn_journal ORDER BY thread_id, seq;"),
          make_sql("DELETE FROM turn_journal;")};
}

sql_journal turn_journal(bool shared) {
  return sql_journal{"turn_journal", fold_turn_journal(shared),
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
