#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "spindle/messages/atoms.hpp"

// The state store: one detached actor owning one SQLite connection, through
// which thread actors, context managers and orchestrators make their state
// durable. It knows no domain: a write is a list of SQL statements with
// their parameters, applied atomically; a read is one query. Writes that
// arrive while a commit runs are committed together (group commit), and a
// write is answered only after its transaction committed. The SQL of each
// area lives beside its actor (actors/src/records.cpp); the schema in
// runtime/storage/sqlite/database.cpp. See docs/storage.md.

namespace spindle {

/// A parameter or a column value: an integer, a text or NULL; or, as a
/// parameter only, a number the state store binds when it runs the
/// statement (docs/storage.md, "Versions"):
/// - `version`: this write's version, one per write, larger than every
///   version the store handed out before (`next_thread_version`);
/// - `pinned`: the latest version a reader took as its snapshot;
/// - `pin` (in a read): takes a snapshot now, the latest version handed
///   out, after every write that arrived before the read committed.
struct sql_value {
  enum class kind : uint8_t { null, integer, text, version, pinned, pin };
  kind type = kind::null;
  int64_t integer = 0;
  std::string text;

  static sql_value of(int64_t x) {
    return sql_value{kind::integer, x, {}};
  }
  static sql_value of(std::string x) {
    return sql_value{kind::text, 0, std::move(x)};
  }
  static sql_value of(kind k) {
    return sql_value{k, 0, {}};
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sql_value& x) {
  return f(caf::meta::type_name("sql_value"), x.type, x.integer, x.text);
}

/// One statement and its parameters (?1, ?2, ...).
struct sql_statement {
  std::string sql;
  std::vector<sql_value> params;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sql_statement& x) {
  return f(caf::meta::type_name("sql_statement"), x.sql, x.params);
}

/// Statements applied all or nothing.
using sql_write = std::vector<sql_statement>;

/// Rows of a query, each a vector of its columns.
using sql_rows = std::vector<std::vector<sql_value>>;

inline sql_value to_sql_value(std::string x) {
  return sql_value::of(std::move(x));
}
inline sql_value to_sql_value(const char* x) {
  return sql_value::of(std::string{x});
}
inline sql_value to_sql_value(int64_t x) {
  return sql_value::of(x);
}
inline sql_value to_sql_value(uint64_t x) {
  return sql_value::of(static_cast<int64_t>(x));
}
inline sql_value to_sql_value(int x) {
  return sql_value::of(static_cast<int64_t>(x));
}
inline sql_value to_sql_value(sql_value x) {
  return x;
}
inline sql_value to_sql_value(sql_value::kind x) {
  return sql_value::of(x);
}
inline sql_value to_sql_value(bool x) {
  return sql_value::of(static_cast<int64_t>(x ? 1 : 0));
}

/// Builds a statement from SQL and parameters (int64_t-convertible numbers
/// and strings).
template <class... Ts>
sql_statement make_sql(std::string sql, Ts&&... params) {
  // Moved in one by one: a braced list would copy each value (its text)
  // once more, out of the list's constant array.
  std::vector<sql_value> values;
  values.reserve(sizeof...(Ts));
  (values.push_back(to_sql_value(std::forward<Ts>(params))), ...);
  return sql_statement{std::move(sql), std::move(values)};
}

/// An append-only table the state store folds into its home table in
/// large batches (docs/storage.md, "The turn journal"). The store tracks
/// the keys (first parameter) of the rows appended since the last fold: a
/// keyed read folds first when the journal holds its key, and otherwise
/// runs its home-table twin, which does not scan the journal. Any other
/// query that names the journal folds first whenever a write came since
/// the last fold; the rest never wait for a fold.
struct sql_journal {
  /// The journal's table name.
  std::string table;
  /// The statements that move every row to the home table, in one write.
  sql_write fold;
  /// The statement that appends a row; its ?1 is the row's key.
  std::string append_sql;
  /// A query that reads the rows of one key (its ?1) from the journal and
  /// the home table,
  std::string keyed_read_sql;
  /// and the same query on the home table alone (same parameters).
  std::string keyed_home_read_sql;
};

/// What a writer runs in the state store once its write's outcome is
/// known, before the write is answered: the store stays domain-free, and
/// the writer's in-memory state follows the database without a message
/// back to it (the thread actor publishes a committed turn this way and
/// the store answers the thread's caller directly: docs/storage.md,
/// "Order"). Runs on the store's thread, in the order the writes arrived;
/// it must not block.
class write_hook {
public:
  virtual ~write_hook() = default;
  /// The write committed, changing `changes` rows; returns the answer.
  virtual uint64_t committed(uint64_t changes) = 0;
  /// The write was not stored; returns the error to answer with.
  virtual caf::error failed(caf::error reason) = 0;
};

using write_hook_ptr = std::shared_ptr<write_hook>;

/// The state store's protocol.
/// - `(store, write)`: applies the statements in one savepoint of the next
///   transaction and replies with the rows they changed, after the commit.
///   A failing statement undoes its whole write (not its batch neighbours).
///   Errors: `storage_failure` with SQLite's message. An empty write
///   changes nothing and is answered once every write that arrived before
///   it has committed (a barrier).
/// - `(store, write, hook)`: the same, answered with what `hook` returns.
/// - `(load, statement)`: runs a query after every write that arrived
///   before it has committed, and replies with its rows.
using storage_actor = caf::typed_actor<
  caf::replies_to<store_atom, sql_write>::with<uint64_t>,
  caf::replies_to<store_atom, sql_write, write_hook_ptr>::with<uint64_t>,
  caf::replies_to<load_atom, sql_statement>::with<sql_rows>>;

} // namespace spindle

// A hook travels only inside the process, never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(spindle::write_hook_ptr)
