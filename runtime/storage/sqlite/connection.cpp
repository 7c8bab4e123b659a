// SQLite behind the sql_connection interface: the state store's and the
// counter store's connection to a data directory's spindle.db.

#include "spindle/messages/error.hpp"
#include "storage/database.hpp"
#include "storage/sql_connection.hpp"

namespace spindle {

namespace {

class sqlite_query final : public sql_query {
public:
  explicit sqlite_query(statement stmt) : stmt_(std::move(stmt)) {}

  void bind(int index, const sql_value& value) override {
    stmt_.bind(index, value);
  }
  caf::expected<bool> step() override {
    return stmt_.step();
  }
  int column_count() const override {
    return stmt_.column_count();
  }
  sql_value column(int index) const override {
    return stmt_.column(index);
  }
  void reset() override {
    stmt_.reset();
  }

private:
  statement stmt_;
};

class sqlite_conn final : public sql_connection {
public:
  explicit sqlite_conn(std::unique_ptr<database> db) : db_(std::move(db)) {}

  sql_backend backend() const noexcept override {
    return sql_backend::sqlite;
  }
  caf::error exec(std::string_view sql) override {
    return db_->exec(sql);
  }
  caf::expected<std::unique_ptr<sql_query>>
  prepare(const std::string& sql) override {
    auto stmt = db_->prepare(sql);
    if (!stmt)
      return stmt.error();
    return std::unique_ptr<sql_query>{new sqlite_query(std::move(*stmt))};
  }
  int64_t changes() override {
    return db_->changes();
  }
  // IMMEDIATE: the write lock is taken at the start, so a transaction
  // never fails half-way for want of it.
  caf::error begin() override {
    return db_->exec("BEGIN IMMEDIATE;");
  }
  caf::error commit() override {
    return db_->exec("COMMIT;");
  }
  void rollback() override {
    db_->exec("ROLLBACK;");
  }
  bool failure_spoils_transaction() const noexcept override {
    return false;
  }
  database* sqlite() noexcept override {
    return db_.get();
  }
  std::string where() const override {
    return db_->path();
  }

private:
  std::unique_ptr<database> db_;
};

} // namespace

std::unique_ptr<sql_connection>
sqlite_connection(std::unique_ptr<database> db) {
  return std::make_unique<sqlite_conn>(std::move(db));
}

} // namespace spindle
