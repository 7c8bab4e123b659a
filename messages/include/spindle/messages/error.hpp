#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace spindle {

/// spindle's error codes. Errors are values: actors reply with
/// `caf::make_error(errc::x, "what went wrong")`, the facade returns
/// `caf::expected<T>`, the CLI and the HTTP server turn them into messages
/// and status codes. Every code a user can cause carries a context string
/// that names the offending field or value.
enum class errc : uint8_t {
  /// A parameter is outside its documented range (k = 0, max_turns < 2, ...).
  invalid_argument = 1,
  /// An ID, prefix, thread or agent name does not match its grammar.
  invalid_id,
  /// A counter has no next value (orchestration IDs past ZZZZ).
  exhausted,
  /// The thing asked for does not exist.
  not_found,
  /// An explicit ID or name is already taken.
  already_exists,
  /// The thread or session is busy and the caller asked not to wait.
  conflict,
  /// The item does not fit even an empty window (token budget).
  capacity_exceeded,
  /// A request did not complete within its timeout.
  timeout,
  /// The durable store failed to read or commit.
  storage_failure,
  /// A file-system operation failed.
  io_failure,
  /// The runtime is stopping or the serving actor is gone.
  unavailable,
  /// The LLM provider failed or answered with an error.
  upstream_failure,
  /// A value is too large (body, content, count).
  too_large,
  /// Malformed input (JSON syntax, wrong types).
  malformed,
  /// A task's lease expired or was taken over (or the call names none for
  /// a leased task): the worker no longer holds the task.
  lease_lost,
  /// The durable store could not commit because its disk (or database) is
  /// full: nothing of the write was stored; it succeeds again once space
  /// is freed (HTTP 507).
  storage_full,
  /// The durable store cannot be reached now (PostgreSQL down or
  /// restarting, the connection lost): nothing of the write was stored, or
  /// its outcome could not be learnt; it succeeds again once the database
  /// answers (HTTP 503).
  storage_unavailable,
  /// In a cluster: this node does not own the thread (any more). Its lease
  /// moved to another node, or this node lost its own lease (cut off from
  /// the database, or paused past it): nothing was stored; the same
  /// request succeeds when sent again, through any node (HTTP 503,
  /// docs/cluster.md).
  not_owner,
  /// Over one of the tenant's limits on the model (requests or tokens per
  /// minute, or its queue is full): nothing was stored; the same request
  /// succeeds after the wait it was given (HTTP 429, docs/limits.md).
  rate_limited,
  /// The model's upstream refused the call for its own load (it answered
  /// 429 or 503). An exchange sends a refused call again (twice at most,
  /// once the upstream's gate reopens) before it fails with this: its
  /// user turn is stored, its reply is not. The same call succeeds after
  /// the wait it was given (HTTP 429 with `Retry-After`, docs/limits.md,
  /// "When the upstream refuses").
  upstream_busy,
};

/// Returns the stable snake_case name of `x`, e.g. "invalid_id".
/// This function is thread-safe.
std::string to_string(errc x);

/// Parses a name produced by `to_string(errc)`. Returns false for unknown
/// names. This function is thread-safe.
bool from_string(const std::string& name, errc& out);

/// Builds an error of spindle's category with a human-readable context.
caf::error make_error(errc code, std::string context);

/// A store's error for a write or read that failed because of `cause`:
/// `storage_full`, `storage_unavailable` or `invalid_argument` (a value
/// the database cannot hold, such as a NUL character in PostgreSQL's
/// text) when the cause is, else `storage_failure`, so that a full disk,
/// an unreachable database or a bad value keeps its code through every
/// layer that adds what it was doing. This function is thread-safe.
caf::error make_storage_error(const caf::error& cause, std::string context);

/// True for `storage_failure`, `storage_full` and `storage_unavailable`.
/// Thread-safe.
bool is_storage_error(const caf::error& err);

/// Maps any non-empty error to the spindle code a caller should act on:
/// spindle's own codes pass through, CAF's request timeout becomes
/// `timeout`, every other system error (a dead receiver, a stopped system)
/// becomes `unavailable`. This function is thread-safe.
errc classify(const caf::error& err);

/// Renders any error as "name: context", e.g.
/// "invalid_id: '../x' is not a task ID". Knows spindle's category and CAF's
/// `sec`; others are rendered by CAF. This function is thread-safe.
std::string describe(const caf::error& err);

/// The atom naming spindle's error category.
inline constexpr caf::atom_value error_category = caf::atom("spindle");

} // namespace spindle

CAF_ERROR_CODE_ENUM(spindle::errc, "spindle")
