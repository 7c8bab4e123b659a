#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

  /// Queues the statement with its bound parameters in the pipelined
  /// transaction of its connection (sql_connection::begin_pipelined) and
  /// clears the bindings; `sql_connection::sync` runs it. Rows it returns
  /// are not read. Errors: `invalid_argument` for a value the database
  /// cannot hold, `storage_failure` or `storage_unavailable` when it could
  /// not be queued; nothing of it is queued then.
  virtual caf::error send();

  /// Runs to completion and resets; for statements without rows.
  caf::error run();
  /// Runs to completion and resets; every row it returned.
  caf::expected<sql_rows> rows();
};

/// What the statements of a pipelined transaction came to
/// (sql_connection::sync).
struct sql_pipeline_result {
  /// Rows each statement changed, in the order they were queued: every
  /// one of them when `error` is none.
  std::vector<int64_t> changes;
  /// The first failure. The statements after it did not run, and the
  /// transaction can only be rolled back.
  caf::error error;
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

  /// Whether `begin_pipelined` is available: statements sent to the
  /// database without waiting for the one before (PostgreSQL's pipeline
  /// mode), so a batch of them costs one round trip.
  virtual bool pipelines() const noexcept {
    return false;
  }

  /// Starts a transaction that will write, whose statements are queued
  /// (sql_query::send) and run by `sync`, BEGIN itself among them; commit()
  /// or rollback() end it, as any transaction. Errors: `storage_failure`,
  /// `storage_unavailable`; no transaction is open then.
  virtual caf::error begin_pipelined();

  /// Sends what was queued since `begin_pipelined` or the last `sync` and
  /// reads what each statement came to; the transaction stays open.
  virtual sql_pipeline_result sync();

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

/// Prepares `sql`, binds `params` to ?1, ?2, ... and runs it: every row it
/// returned. For connections used outside the state store (the cluster's
/// membership, the tenant store). Errors: those of `prepare` and `step`.
caf::expected<sql_rows> run_query(sql_connection& db, const std::string& sql,
                                  const std::vector<sql_value>& params = {});

/// Wraps an open SQLite database.
std::unique_ptr<sql_connection> sqlite_connection(std::unique_ptr<database> db);

} // namespace spindle
