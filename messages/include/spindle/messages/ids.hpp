#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>

namespace spindle {

/// Counter keys name the counters the ID allocator owns:
///   "ctx"      context item IDs       ctx-1, ctx-2, ...
///   "global"   orchestration IDs      0001, 0002, ..., 9999, A000, ...
///   <task ID>  children of that task  0001 -> 0001_t1; 0001_t1 -> 0001_t1.1
/// The same names are the prefixes of the file-protocol counters
/// (ai_comms/counters/{key}.NextId).
namespace counter_keys {
inline constexpr std::string_view context = "ctx";
inline constexpr std::string_view orchestration = "global";
} // namespace counter_keys

/// What a counter key counts.
enum class counter_kind : uint8_t { context, orchestration, task };

/// Classifies and validates a counter key.
/// Errors: `invalid_id` naming the key and the grammar it failed.
/// This function is thread-safe.
caf::expected<counter_kind> classify_counter_key(std::string_view key);

/// The largest sequence value a key may hand out: 2^63 - 1 for context IDs,
/// hybrid36::max_ordinal (ZZZZ) for orchestrations and task levels.
uint64_t max_sequence(counter_kind kind) noexcept;

/// Renders the n-th ID of a counter: "ctx-7", "0007", "0001_t7", "0001_t1.7".
/// Errors: `invalid_id` for a bad key, `exhausted` for n out of range.
caf::expected<std::string> render_id(std::string_view key, uint64_t n);

/// Formats a context item ID: `ctx-N`.
std::string format_context_id(uint64_t n);

/// Parses a context item ID in canonical form `ctx-N` (N >= 1, decimal,
/// no leading zero, below 2^63). Returns nullopt otherwise.
std::optional<uint64_t> parse_context_id(std::string_view text);

/// Validates a conversation thread ID (D10): 1 to 128 characters of
/// [A-Za-z0-9._:-], never "." or "..". ("new" is valid here; the HTTP API
/// gives it the meaning "create one".) The ID may be qualified by a tenant
/// (`TENANT~ID`, see `tenant_separator`), or be an end user's thread in a
/// tenant (`TENANT~USER~ID`, USER a valid user ID); its own part follows
/// the rule above. Errors: `invalid_id` naming the problem, with the offending value
/// shortened. This function is thread-safe.
caf::error validate_thread_id(std::string_view id);

/// Validates a thread ID as a client sends it: the rule of
/// `validate_thread_id` without a tenant (a client's ID never holds the
/// separator). Thread-safe.
caf::error validate_client_thread_id(std::string_view id);

/// The separator of a tenant-qualified ID: `TENANT~ID` is the thread or
/// user `ID` of the tenant `TENANT` (docs/tenants.md, "How data belongs to
/// a tenant"). IDs a client sends never hold it; the default tenant's IDs
/// are not qualified.
inline constexpr char tenant_separator = '~';

/// The most characters a tenant ID has: [a-z0-9], 1 to 32 of them.
inline constexpr size_t max_tenant_id = 32;

/// True for a tenant ID: 1 to 32 characters of [a-z0-9].
bool valid_tenant_id(std::string_view id) noexcept;

/// The tenant of a qualified ID (before the separator); empty for an
/// unqualified one (the default tenant's).
std::string_view tenant_of_id(std::string_view id) noexcept;

/// The ID as its tenant's clients know it (after the separator).
std::string_view local_id(std::string_view id) noexcept;

/// `id` qualified by the tenant whose IDs start with `prefix` ("" for the
/// default tenant, else `TENANT~`).
std::string qualify_id(std::string_view prefix, std::string_view id);

/// Validates an agent name used in file-system paths (D10): 1 to 64
/// characters of [A-Za-z0-9._-], not starting with '.' or '-'.
/// Errors: `invalid_id`. This function is thread-safe.
caf::error validate_agent_name(std::string_view name);

/// A run of consecutive values handed out by one counter: first,
/// first + 1, ..., first + count - 1. `count` is at least 1.
struct id_range {
  std::string key;
  uint64_t first = 0;
  uint64_t count = 0;

  /// The last value in the range.
  uint64_t last() const noexcept {
    return first + count - 1;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, id_range& x) {
  return f(caf::meta::type_name("id_range"), x.key, x.first, x.count);
}

/// How many IDs an allocator has handed out since it started, by kind.
struct id_stats {
  uint64_t context = 0;
  uint64_t orchestration = 0;
  uint64_t task = 0;
  /// Counters in memory now (at most `id_allocator_options::max_counters`
  /// once idle ones can be forgotten).
  uint64_t counters = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, id_stats& x) {
  return f(caf::meta::type_name("id_stats"), x.context, x.orchestration,
           x.task, x.counters);
}

/// Renders every ID in the range, in order.
/// Errors as for `render_id`.
caf::expected<std::vector<std::string>> render_ids(const id_range& range);

} // namespace spindle
