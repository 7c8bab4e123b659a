#pragma once

#include <caf/error.hpp>

namespace spindle {

class sql_connection;

/// Brings the PostgreSQL schema to `database::schema_version` in one
/// transaction under an advisory lock (schema.cpp). A newer schema is
/// refused, untouched.
caf::error migrate_postgres(sql_connection& db, const std::string& where);

/// The schema version stored (0: none yet).
caf::expected<int> read_postgres_schema_version(sql_connection& db);

} // namespace spindle
