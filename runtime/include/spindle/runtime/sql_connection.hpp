#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "spindle/messages/storage.hpp"

namespace spindle {

class database;

/// The databases spindle keeps its state in (docs/storage.md, "Backends").
enum class sql_backend : uint8_t { sqlite, postgres };

/// One prepared statement of an `sql_connection`, with parameters ?1, ?2,
/// ... Not thread-safe: used by its connection's owner only.
class sql_query {
public:
  virtual ~sql_query() = default;

  /// Binds parameter `index` (1-based): an integer, a text or NULL.
  virtual void bind(int index, const sql_value& value) = 0;

  /// Runs the statement on the first call, then moves from row to row:
  /// true while a row is available, false when done.
  /// Errors: `storage_failure` (`storage_full` for a full disk) with the
  /// database's message.
  virtual caf::expected<bool> step() = 0;

  /// The current row's columns: an integer, a text or NULL each.
  virtual int column_count() const = 0;
  virtual sql_value column(int index) const = 0;

  /// Clears the bindings and rewinds, ready for the next use.
  virtual void reset() = 0;

  /// Runs to completion and resets; for statements without rows.
  caf::error run();
  /// Runs to completion and resets; every row it returned.
  caf::expected<sql_rows> rows();
};

/// A connection to the database behind the state store and the counter
/// store: SQLite (runtime/storage/sqlite/) or PostgreSQL
/// (runtime/storage/postgres/). Both run the same SQL, written in the
/// subset they share (docs/storage.md, "Backends"). Not thread-safe: one
/// owner.
class sql_connection {
public:
  virtual ~sql_connection() = default;

  virtual sql_backend backend() const noexcept = 0;

  /// Runs statements without parameters or results.
  virtual caf::error exec(std::string_view sql) = 0;

  /// Prepares a statement. Errors: `storage_failure`.
  virtual caf::expected<std::unique_ptr<sql_query>>
  prepare(const std::string& sql) = 0;

  /// Rows changed by the last statement.
  virtual int64_t changes() = 0;

  /// Starts a transaction that will write.
  virtual caf::error begin() = 0;

  /// Commits the transaction. An error means nothing of it was stored:
  /// where the database's answer was lost with the connection, the
  /// outcome is looked up before answering, and a commit that cannot be
  /// confirmed either way is an error naming that.
  virtual caf::error commit() = 0;

  /// Rolls the transaction back (if one is open).
  virtual void rollback() = 0;

  /// Whether a failing statement spoils its whole transaction (PostgreSQL)
  /// rather than undoing itself alone (SQLite): then every write of a
  /// group commit needs a savepoint of its own.
  virtual bool failure_spoils_transaction() const noexcept = 0;

  /// The SQLite database underneath, for SQLite's own hooks; null for any
  /// other backend.
  virtual database* sqlite() noexcept {
    return nullptr;
  }

  /// Where the connection goes, for messages: a path, or a URL with its
  /// password hidden.
  virtual std::string where() const = 0;
};

/// Wraps an open SQLite database.
std::unique_ptr<sql_connection> sqlite_connection(std::unique_ptr<database> db);

} // namespace spindle
