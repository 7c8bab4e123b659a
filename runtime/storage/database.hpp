#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/storage.hpp"
#include "spindle/runtime/storage.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace spindle {

/// One prepared SQLite statement. Not thread-safe: owned by one actor.
class statement {
public:
  statement() = default;
  statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  statement(statement&&) noexcept;
  statement& operator=(statement&&) noexcept;
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;
  ~statement();

  statement& bind(int index, int64_t value);
  statement& bind(int index, std::string_view value);
  statement& bind_null(int index);
  /// Binds bytes as a BLOB.
  statement& bind_blob(int index, std::string_view bytes);
  /// Binds an integer, a text or NULL.
  statement& bind(int index, const sql_value& value);

  /// Steps once: true while a row is available, false when done.
  /// Errors: `storage_failure` with SQLite's message.
  caf::expected<bool> step();

  /// Runs to completion and resets; for statements without rows.
  caf::error run();

  int64_t column_int64(int index) const;
  std::string column_text(int index) const;
  /// A TEXT or BLOB column's bytes, valid until the next step or reset.
  std::string_view column_view(int index) const;
  bool column_is_null(int index) const;
  /// How many columns a row has.
  int column_count() const;
  /// A column as an integer, a text or NULL.
  sql_value column(int index) const;

  /// Clears bindings and rewinds, ready for the next use.
  void reset();

private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

/// An open SQLite database with spindle's schema, migrated to the newest
/// version on open. Not thread-safe: one owner (the storage actor).
class database {
public:
  /// The schema version this build writes. A database of a newer version
  /// is refused at open, never touched.
  static constexpr int schema_version = 15;

  /// Opens (creating if missing) the database at `path`, or a private
  /// in-memory one for ":memory:". Turns on WAL, sets `sync`, and applies
  /// pending migrations in one transaction each, up to `version` (an
  /// older one only where tests build a database as an older build left
  /// it). Errors: `storage_failure` naming the file and the cause
  /// (unwritable directory, corrupt file, newer schema).
  static caf::expected<std::unique_ptr<database>>
  open(const std::string& path, sync_mode sync, int version = schema_version);

  ~database();
  database(const database&) = delete;
  database& operator=(const database&) = delete;

  /// Runs one or more statements without results.
  caf::error exec(std::string_view sql);

  /// Prepares a statement. Errors: `storage_failure` with SQLite's message.
  caf::expected<statement> prepare(std::string_view sql);

  /// Rows changed by the last statement.
  int64_t changes();

  /// The schema version stored in the file.
  int user_version();

  sqlite3* handle() noexcept {
    return db_;
  }

  const std::string& path() const noexcept {
    return path_;
  }

private:
  database(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  caf::error migrate(int target);

  sqlite3* db_;
  std::string path_;
};

} // namespace spindle
