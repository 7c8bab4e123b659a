#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <caf/expected.hpp>

#include "storage/sql_connection.hpp"

namespace spindle {

/// Whether `store` names a PostgreSQL database: a `postgres://` or
/// `postgresql://` URL (libpq's connection URI).
bool is_postgres_url(std::string_view store);

/// `url` with its password, if any, replaced by `***`: what messages and
/// logs show of a store's URL.
std::string redact_url(std::string_view url);

/// Opens a connection to the PostgreSQL database at `url` (libpq's URI
/// form). With `migrate`, brings the schema to this build's version first,
/// inside one transaction under an advisory lock, so that nodes starting
/// at once on an empty database migrate it exactly once; a database of a
/// newer schema is refused and left untouched. Errors: `storage_failure`
/// naming the redacted URL and the cause (unreachable, refused, bad URL,
/// newer schema).
///
/// The connection reopens itself when it was lost, at the next statement
/// outside a transaction; inside one, every statement fails until the
/// transaction ends, and a commit whose answer was lost is looked up
/// (`txid_status`) before it is reported (sql_connection::commit).
caf::expected<std::unique_ptr<sql_connection>>
open_postgres(const std::string& url, bool migrate = true);

/// The schema version of the PostgreSQL database at `url` (0 for an
/// empty one). Errors: `storage_failure`.
caf::expected<int> postgres_schema_version(const std::string& url);

} // namespace spindle
