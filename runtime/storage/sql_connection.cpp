// What every sql_connection and sql_query shares, whatever the backend:
// the helpers built on a query's step, and the pipelining defaults of a
// backend that does not pipeline.

#include "storage/sql_connection.hpp"

#include "spindle/messages/error.hpp"

namespace spindle {

// Pipelining is PostgreSQL's alone (pipelines()): SQLite runs in the
// process and has no round trips to save.

caf::error sql_query::send() {
  return make_error(errc::storage_failure,
                    "this database does not pipeline statements");
}

caf::error sql_connection::begin_pipelined() {
  return make_error(errc::storage_failure,
                    where() + " does not pipeline statements");
}

sql_pipeline_result sql_connection::sync() {
  return {{}, make_error(errc::storage_failure,
                         where() + " does not pipeline statements")};
}

caf::error sql_query::run() {
  auto rc = step();
  reset();
  if (!rc)
    return rc.error();
  return caf::none;
}

caf::expected<sql_rows> sql_query::rows() {
  sql_rows out;
  for (;;) {
    auto row = step();
    if (!row) {
      reset();
      return row.error();
    }
    if (!*row)
      break;
    auto n = column_count();
    std::vector<sql_value> columns;
    columns.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      columns.push_back(column(i));
    out.push_back(std::move(columns));
  }
  reset();
  return out;
}

caf::expected<sql_rows> run_query(sql_connection& db, const std::string& sql,
                                  const std::vector<sql_value>& params) {
  auto q = db.prepare(sql);
  if (!q)
    return q.error();
  for (size_t i = 0; i < params.size(); ++i)
    (*q)->bind(static_cast<int>(i + 1), params[i]);
  return (*q)->rows();
}

} // namespace spindle
