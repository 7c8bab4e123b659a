#include "storage/database.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include <sqlite3.h>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

caf::error sqlite_error(sqlite3* db, const std::string& what) {
  std::string msg = what;
  auto code = errc::storage_failure;
  if (db != nullptr) {
    msg += ": ";
    msg += sqlite3_errmsg(db);
    // SQLITE_FULL: the disk (or max_page_count) has no room for the write,
    // which SQLite rolled back; freeing space ends it.
    if ((sqlite3_errcode(db) & 0xff) == SQLITE_FULL)
      code = errc::storage_full;
  }
  return make_error(code, std::move(msg));
}

// A connection that finds the database locked by another of the process's
// connections (the state store, the memory writer, a checkpoint) waits
// for it in steps of 50 us doubling up to 2 ms, 5 s in all. SQLite's own
// busy timeout sleeps 1, 2, 5, 10 ... up to 100 ms per step: a write that
// missed a lock held for a fraction of a millisecond slept for tens of
// milliseconds, and the answers waiting on it with it.
int wait_for_lock(void*, int count) {
  constexpr int ramp = 6;                  // 50 us .. 1.6 ms
  constexpr int give_up = ramp + 5000 / 2; // then 2 ms steps, 5 s in all
  if (count >= give_up)
    return 0;
  auto step = count < ramp ? std::chrono::microseconds{50 << count}
                           : std::chrono::microseconds{2000};
  std::this_thread::sleep_for(step);
  return 1;
}

// Each entry moves the schema from version i to i + 1. Append only; never
// edit a migration that has shipped.
const char* const migrations[] = {
  // 0 -> 1: counters' durable high-water marks.
  "CREATE TABLE counters ("
  "  key TEXT PRIMARY KEY NOT NULL,"
  "  high_water INTEGER NOT NULL CHECK (high_water >= 0)"
  ") WITHOUT ROWID;",
  // 1 -> 2: long-term memory (D8). The container tags user:{id} and
  // thread:{id} are kept as columns ('' = no such tag); `scope` holds the
  // entry's scope token (memory_scope_token) so FTS5 narrows to one scope
  // before ranking with bm25. Triggers keep the index in sync.
  "CREATE TABLE memories ("
  "  id INTEGER PRIMARY KEY,"
  "  user_id TEXT NOT NULL DEFAULT '',"
  "  thread_id TEXT NOT NULL DEFAULT '',"
  "  scope TEXT NOT NULL,"
  "  content TEXT NOT NULL,"
  "  created_ms INTEGER NOT NULL"
  ");"
  "CREATE INDEX memories_by_user ON memories(user_id);"
  "CREATE INDEX memories_by_thread ON memories(thread_id, user_id);"
  "CREATE VIRTUAL TABLE memories_fts USING fts5("
  "  content, scope, content='memories', content_rowid='id');"
  "CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN"
  "  INSERT INTO memories_fts(rowid, content, scope)"
  "  VALUES (new.id, new.content, new.scope);"
  " END;"
  "CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN"
  "  INSERT INTO memories_fts(memories_fts, rowid, content, scope)"
  "  VALUES ('delete', old.id, old.content, old.scope);"
  " END;",
  // 2 -> 3: the state of thread actors, context managers and orchestrators
  // (docs/storage.md). Turns are kept in the order they were appended
  // (`seq`); `epoch` counts clears. Context items are kept as their seed
  // 002 JSON, in window order (`position`), with the ID's number as key so
  // an ID can live in one window only (D4).
  "CREATE TABLE threads ("
  "  thread_id TEXT PRIMARY KEY NOT NULL,"
  "  epoch INTEGER NOT NULL DEFAULT 0,"
  "  created_ms INTEGER NOT NULL"
  ") WITHOUT ROWID;"
  "CREATE TABLE turns ("
  "  thread_id TEXT NOT NULL,"
  "  seq INTEGER NOT NULL,"
  "  role INTEGER NOT NULL,"
  "  content TEXT NOT NULL,"
  "  timestamp_ms INTEGER NOT NULL,"
  "  tool_call_id TEXT NOT NULL DEFAULT '',"
  "  interrupted INTEGER NOT NULL DEFAULT 0,"
  "  PRIMARY KEY (thread_id, seq)"
  ") WITHOUT ROWID;"
  "CREATE TABLE context_windows ("
  "  thread_id TEXT PRIMARY KEY NOT NULL,"
  "  capacity INTEGER NOT NULL,"
  "  token_budget INTEGER NOT NULL,"
  "  added INTEGER NOT NULL DEFAULT 0,"
  "  evicted INTEGER NOT NULL DEFAULT 0,"
  "  removed INTEGER NOT NULL DEFAULT 0,"
  "  cleared INTEGER NOT NULL DEFAULT 0"
  ") WITHOUT ROWID;"
  "CREATE TABLE context_items ("
  "  seq INTEGER PRIMARY KEY,"
  "  thread_id TEXT NOT NULL,"
  "  position INTEGER NOT NULL,"
  "  item TEXT NOT NULL"
  ");"
  "CREATE INDEX context_items_by_window ON context_items(thread_id, position);"
  "CREATE TABLE tasks ("
  "  id TEXT PRIMARY KEY NOT NULL,"
  "  orchestration TEXT NOT NULL,"
  "  parent TEXT NOT NULL,"
  "  state INTEGER NOT NULL,"
  "  payload TEXT NOT NULL,"
  "  outcome TEXT NOT NULL DEFAULT '',"
  "  worker TEXT NOT NULL DEFAULT ''"
  ") WITHOUT ROWID;"
  "CREATE INDEX tasks_by_orchestration ON tasks(orchestration, id);",
  // 3 -> 4: new turns are appended to a journal in arrival order (rowid),
  // so a commit writes the few pages at its end instead of one page per
  // thread it touched; the state store folds the journal into `turns` in
  // large sorted batches (docs/storage.md, "The turn journal").
  "CREATE TABLE turn_journal ("
  "  id INTEGER PRIMARY KEY,"
  "  thread_id TEXT NOT NULL,"
  "  seq INTEGER NOT NULL,"
  "  role INTEGER NOT NULL,"
  "  content TEXT NOT NULL,"
  "  timestamp_ms INTEGER NOT NULL,"
  "  tool_call_id TEXT NOT NULL DEFAULT '',"
  "  interrupted INTEGER NOT NULL DEFAULT 0"
  ");",
  // 4 -> 5: long-term memory retrieval with a bounded cost
  // (docs/memory.md, "Retrieval"). The FTS5 index ranked every entry of a
  // scope that matched a word; it goes, with its scope token. Instead each
  // scope (a user's entries, or a thread's anonymous ones; the exact IDs,
  // '' for none) counts its entries and words, and keeps per term the
  // number of its entries holding it (`df`) and the newest
  // memory_recent_per_term of them (`recent`: encoded postings, newest
  // first). The memory writer maintains them in the transaction that
  // stores an entry; entries above `indexed_through` (all of them, after
  // this upgrade) are indexed when the memory opens.
  "DROP TRIGGER memories_ai;"
  "DROP TRIGGER memories_ad;"
  "DROP TABLE memories_fts;"
  "DROP INDEX memories_by_user;"
  "DROP INDEX memories_by_thread;"
  "ALTER TABLE memories DROP COLUMN scope;"
  "CREATE TABLE memory_scopes ("
  "  id INTEGER PRIMARY KEY,"
  "  user_id TEXT NOT NULL,"
  "  thread_id TEXT NOT NULL,"
  "  entries INTEGER NOT NULL DEFAULT 0,"
  "  words INTEGER NOT NULL DEFAULT 0,"
  "  UNIQUE (user_id, thread_id)"
  ");"
  "CREATE TABLE memory_terms ("
  "  scope INTEGER NOT NULL,"
  "  term TEXT NOT NULL,"
  "  df INTEGER NOT NULL,"
  "  recent BLOB NOT NULL,"
  "  PRIMARY KEY (scope, term)"
  ") WITHOUT ROWID;"
  "CREATE TABLE memory_index_state ("
  "  id INTEGER PRIMARY KEY CHECK (id = 0),"
  "  indexed_through INTEGER NOT NULL"
  ");"
  "INSERT INTO memory_index_state(id, indexed_through) VALUES (0, 0);",
  // 5 -> 6: answers to requests that carried an Idempotency-Key
  // (docs/api.md, "Idempotent retries"), kept in their own file
  // (`idempotency.db`) for a retention time: the key, a fingerprint of
  // the request (method, path, body), and the reply replayed to a retry.
  "CREATE TABLE idempotency_keys ("
  "  key TEXT PRIMARY KEY NOT NULL,"
  "  fingerprint TEXT NOT NULL,"
  "  status INTEGER NOT NULL,"
  "  content_type TEXT NOT NULL,"
  "  headers TEXT NOT NULL,"
  "  body BLOB NOT NULL,"
  "  created_ms INTEGER NOT NULL"
  ") WITHOUT ROWID;"
  "CREATE INDEX idempotency_keys_by_age ON idempotency_keys(created_ms);",
  // 6 -> 7: memories can be listed and deleted (docs/memory.md,
  // "Listing and deleting"). A scope's `version` counts every change to
  // it (stores and deletions): a reader keeps a term's list while the
  // version it was read with stands (a count of entries can come back to
  // the same value after a deletion and a store). The indexes find a
  // user's entries, and a thread's anonymous ones, newest first.
  "ALTER TABLE memory_scopes ADD COLUMN version INTEGER NOT NULL DEFAULT 0;"
  "CREATE INDEX memories_by_user ON memories(user_id, id);"
  "CREATE INDEX memories_anonymous ON memories(thread_id, id) "
  "WHERE user_id = '';",
  // 7 -> 8: threads as resources (docs/threads.md, "Threads as
  // resources"). Each thread row carries its turn count, its metadata (a
  // JSON object of strings) and its version: the store's version of the
  // thread's last change, strictly increasing across threads (about
  // microseconds since the epoch: see docs/storage.md, "Versions"). A
  // walk over the threads lists them by version as of its snapshot; a
  // change replacing a version that some walk's snapshot saw keeps it in
  // `thread_versions` with the version that replaced it. Existing threads
  // take their last turn's (or creation's) time as their version.
  "ALTER TABLE threads ADD COLUMN version INTEGER NOT NULL DEFAULT 0;"
  "ALTER TABLE threads ADD COLUMN turn_count INTEGER NOT NULL DEFAULT 0;"
  "ALTER TABLE threads ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';"
  "UPDATE threads SET"
  "  turn_count = (SELECT count(*) FROM turns u"
  "                WHERE u.thread_id = threads.thread_id)"
  "             + (SELECT count(*) FROM turn_journal j"
  "                WHERE j.thread_id = threads.thread_id),"
  "  version = 1000 * max(created_ms,"
  "    coalesce((SELECT max(timestamp_ms) FROM turns u"
  "              WHERE u.thread_id = threads.thread_id), 0),"
  "    coalesce((SELECT max(timestamp_ms) FROM turn_journal j"
  "              WHERE j.thread_id = threads.thread_id), 0));"
  "CREATE INDEX threads_by_version ON threads(version, thread_id);"
  "CREATE TABLE thread_versions ("
  "  version INTEGER NOT NULL,"
  "  thread_id TEXT NOT NULL,"
  "  superseded INTEGER NOT NULL,"
  "  PRIMARY KEY (version, thread_id)"
  ") WITHOUT ROWID;"
  "CREATE INDEX thread_versions_by_thread ON thread_versions(thread_id);",
  // 8 -> 9: retries (docs/orchestration.md, "Retries"). A task counts its
  // claims (`attempts`) and may be claimed `max_attempts` times; a failed
  // or stale task with attempts left is pending again from `retry_at` (ms
  // since the epoch; 0: at once). A task that left pending before this
  // migration was claimed once.
  "ALTER TABLE tasks ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;"
  "ALTER TABLE tasks ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 1;"
  "ALTER TABLE tasks ADD COLUMN backoff_ms INTEGER NOT NULL DEFAULT 0;"
  "ALTER TABLE tasks ADD COLUMN retry_at INTEGER NOT NULL DEFAULT 0;"
  "UPDATE tasks SET attempts = 1 WHERE state <> 0;",

  // 9 -> 10: an assistant turn's tool calls, OpenAI's JSON array as text
  // ('' for none: every turn stored before). In parentheses: one element
  // of two statements, not two elements missing their comma.
  ("ALTER TABLE turns ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '';"
   "ALTER TABLE turn_journal ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '';"),

  // 10 -> 11: a turn's prompt tokens and the encoding they were counted
  // with (messages/tokens.hpp, `token_encoding_id`; 0: not counted, as
  // every turn stored before: counted when its thread is loaded).
  ("ALTER TABLE turns ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0;"
   "ALTER TABLE turns ADD COLUMN token_encoding INTEGER NOT NULL DEFAULT 0;"
   "ALTER TABLE turn_journal ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0;"
   "ALTER TABLE turn_journal ADD COLUMN token_encoding INTEGER NOT NULL "
   "DEFAULT 0;"),

  // 11 -> 12: a thread's summary of the turns before its prompts' window
  // (docs/threads.md, "Compaction"): it covers turns [0, upto).
  ("CREATE TABLE thread_summaries ("
   "  thread_id TEXT PRIMARY KEY,"
   "  content TEXT NOT NULL,"
   "  upto INTEGER NOT NULL,"
   "  tokens INTEGER NOT NULL,"
   "  token_encoding INTEGER NOT NULL,"
   "  updated_ms INTEGER NOT NULL"
   ") WITHOUT ROWID;"),

  // 12 -> 13: PostgreSQL's cluster tables (cluster_nodes, thread_leases,
  // spindle_fence; docs/cluster.md). A SQLite store is one process, never
  // a cluster: nothing changes here, the version follows.
  "SELECT 1;",

  // 13 -> 14: tenants (docs/tenants.md). An orchestration's root row names
  // its tenant ('' for the default tenant, as every stored one is).
  "ALTER TABLE tasks ADD COLUMN tenant TEXT NOT NULL DEFAULT '';"
  "CREATE INDEX tasks_by_tenant ON tasks(tenant, parent, id);",

  // 14 -> 15: usage (docs/usage.md). An assistant turn keeps what its
  // exchange spent (source 0: none, as every turn stored before), and
  // each tenant's counters per hour, thread, user and source answer
  // GET /v1/usage without reading turns.
  ("ALTER TABLE turns ADD COLUMN usage_prompt INTEGER NOT NULL DEFAULT 0;"
   "ALTER TABLE turns ADD COLUMN usage_completion INTEGER NOT NULL "
   "DEFAULT 0;"
   "ALTER TABLE turns ADD COLUMN usage_source INTEGER NOT NULL DEFAULT 0;"
   "ALTER TABLE turn_journal ADD COLUMN usage_prompt INTEGER NOT NULL "
   "DEFAULT 0;"
   "ALTER TABLE turn_journal ADD COLUMN usage_completion INTEGER NOT NULL "
   "DEFAULT 0;"
   "ALTER TABLE turn_journal ADD COLUMN usage_source INTEGER NOT NULL "
   "DEFAULT 0;"
   "CREATE TABLE usage_counters ("
   "  tenant TEXT NOT NULL,"
   "  hour INTEGER NOT NULL,"
   "  thread_id TEXT NOT NULL,"
   "  user_id TEXT NOT NULL,"
   "  source INTEGER NOT NULL,"
   "  exchanges INTEGER NOT NULL,"
   "  prompt_tokens INTEGER NOT NULL,"
   "  completion_tokens INTEGER NOT NULL,"
   "  PRIMARY KEY (tenant, hour, thread_id, user_id, source)"
   ") WITHOUT ROWID;"),
};

static_assert(sizeof(migrations) / sizeof(migrations[0])
                == database::schema_version,
              "one migration per schema version");

} // namespace

// -- statement ------------------------------------------------------------------

statement::statement(statement&& other) noexcept
  : db_(other.db_), stmt_(other.stmt_) {
  other.stmt_ = nullptr;
}

statement& statement::operator=(statement&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(stmt_);
    db_ = other.db_;
    stmt_ = other.stmt_;
    other.stmt_ = nullptr;
  }
  return *this;
}

statement::~statement() {
  sqlite3_finalize(stmt_);
}

statement& statement::bind(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}

statement& statement::bind(int index, std::string_view value) {
  // A default string_view has no data; SQLite would bind NULL for it.
  sqlite3_bind_text(stmt_, index, value.data() != nullptr ? value.data() : "",
                    static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return *this;
}

statement& statement::bind_blob(int index, std::string_view bytes) {
  sqlite3_bind_blob(stmt_, index, bytes.data() != nullptr ? bytes.data() : "",
                    static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  return *this;
}

statement& statement::bind_null(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

caf::expected<bool> statement::step() {
  auto rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW)
    return true;
  if (rc == SQLITE_DONE)
    return false;
  return sqlite_error(db_, "statement failed");
}

caf::error statement::run() {
  auto rc = step();
  reset();
  if (!rc)
    return rc.error();
  return caf::none;
}

int64_t statement::column_int64(int index) const {
  return sqlite3_column_int64(stmt_, index);
}

std::string statement::column_text(int index) const {
  auto* text = sqlite3_column_text(stmt_, index);
  auto size = sqlite3_column_bytes(stmt_, index);
  if (text == nullptr)
    return {};
  return std::string{reinterpret_cast<const char*>(text),
                     static_cast<size_t>(size)};
}

std::string_view statement::column_view(int index) const {
  // sqlite3_column_blob before sqlite3_column_bytes: the size is then that
  // of the bytes returned, without a conversion in between.
  auto* data = sqlite3_column_blob(stmt_, index);
  auto size = sqlite3_column_bytes(stmt_, index);
  if (data == nullptr)
    return {};
  return {static_cast<const char*>(data), static_cast<size_t>(size)};
}

statement& statement::bind(int index, const sql_value& value) {
  switch (value.type) {
    case sql_value::kind::integer:
      return bind(index, value.integer);
    case sql_value::kind::text:
      return bind(index, std::string_view{value.text});
    case sql_value::kind::null:
    case sql_value::kind::version: // bound by the state store
    case sql_value::kind::pinned:
    case sql_value::kind::pin:
      break;
  }
  return bind_null(index);
}

int statement::column_count() const {
  return sqlite3_column_count(stmt_);
}

sql_value statement::column(int index) const {
  switch (sqlite3_column_type(stmt_, index)) {
    case SQLITE_NULL:
      return sql_value{};
    case SQLITE_INTEGER:
      return sql_value::of(column_int64(index));
    default:
      return sql_value::of(column_text(index));
  }
}

bool statement::column_is_null(int index) const {
  return sqlite3_column_type(stmt_, index) == SQLITE_NULL;
}

void statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

// -- database ---------------------------------------------------------------------

caf::expected<std::unique_ptr<database>>
database::open(const std::string& path, sync_mode sync, int version) {
  sqlite3* db = nullptr;
  auto flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
               | SQLITE_OPEN_NOMUTEX;
  // "unix-excl": the process holds the database file's lock for as long as
  // it has the file open, so a transaction takes no file lock of its own
  // (six fcntl calls fewer per commit), and no other process can open the
  // file meanwhile: one process owns a data directory (docs/storage.md).
  const char* vfs = path == ":memory:" ? nullptr : "unix-excl";
  if (sqlite3_open_v2(path.c_str(), &db, flags, vfs) != SQLITE_OK) {
    auto err = sqlite_error(db, "cannot open database '" + path + "'");
    sqlite3_close(db);
    return err;
  }
  std::unique_ptr<database> result{new database(db, path)};
  // Reading the schema first makes a corrupt or foreign file fail here,
  // and a file another process holds: it is given a moment to let go
  // (a process that just exited), not the 5 s a busy table is given.
  sqlite3_busy_timeout(db, 250);
  if (auto err = result->exec("SELECT count(*) FROM sqlite_master;")) {
    if ((sqlite3_errcode(db) & 0xff) == SQLITE_BUSY)
      return make_error(errc::storage_failure,
                        "'" + path
                          + "' is in use by another process: one process "
                            "owns a data directory at a time");
    return make_error(errc::storage_failure,
                      "'" + path + "' is not a usable SQLite database: "
                        + describe(err));
  }
  sqlite3_busy_handler(db, &wait_for_lock, nullptr);
  if (path != ":memory:") {
    if (auto err = result->exec("PRAGMA journal_mode=WAL;"))
      return err;
  }
  if (auto err = result->exec(sync == sync_mode::full
                                ? "PRAGMA synchronous=FULL;"
                                : "PRAGMA synchronous=NORMAL;"))
    return err;
  if (auto err = result->migrate(version))
    return err;
  return result;
}

database::~database() {
  sqlite3_close_v2(db_);
}

caf::error database::exec(std::string_view sql) {
  std::string text{sql};
  char* msg = nullptr;
  if (sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
    std::string what = msg != nullptr ? msg : "unknown error";
    sqlite3_free(msg);
    return make_error((sqlite3_errcode(db_) & 0xff) == SQLITE_FULL
                        ? errc::storage_full
                        : errc::storage_failure,
                      "database '" + path_ + "': " + what);
  }
  return caf::none;
}

caf::expected<statement> database::prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt,
                         nullptr)
      != SQLITE_OK)
    return sqlite_error(db_, "cannot prepare statement");
  return statement{db_, stmt};
}

int64_t database::changes() {
  return sqlite3_changes(db_);
}

int database::user_version() {
  auto stmt = prepare("PRAGMA user_version;");
  if (!stmt)
    return -1;
  auto row = stmt->step();
  if (!row || !*row)
    return -1;
  return static_cast<int>(stmt->column_int64(0));
}

caf::error database::migrate(int target) {
  auto version = user_version();
  if (version < 0)
    return sqlite_error(db_, "cannot read the schema version of '" + path_
                               + "'");
  if (version > schema_version)
    return make_error(errc::storage_failure,
                      "'" + path_ + "' has schema version "
                        + std::to_string(version) + ", newer than this "
                        + "build's " + std::to_string(schema_version)
                        + "; upgrade spindle or use another --data");
  for (auto v = version; v < std::min(target, schema_version); ++v) {
    std::string sql = "BEGIN IMMEDIATE;";
    sql += migrations[v];
    sql += "PRAGMA user_version = " + std::to_string(v + 1) + ";COMMIT;";
    if (auto err = exec(sql)) {
      exec("ROLLBACK;");
      return err;
    }
  }
  return caf::none;
}

} // namespace spindle
