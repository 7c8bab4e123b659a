#pragma once

// What a key may do (docs/tenants.md, "Scopes"): read and write per kind of
// resource, and the tenant's own key management.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::tenancy {

enum class scope : uint32_t {
  threads_read = 1u << 0,
  threads_write = 1u << 1,
  memories_read = 1u << 2,
  memories_write = 1u << 3,
  tasks_read = 1u << 4,
  tasks_write = 1u << 5,
  events_read = 1u << 6,
  usage_read = 1u << 7,
  keys_admin = 1u << 8,
};

/// A set of scopes as bits.
using scope_set = uint32_t;

inline constexpr scope_set bit(scope s) noexcept {
  return static_cast<scope_set>(s);
}

/// Every scope there is.
inline constexpr scope_set all_scopes = (1u << 9) - 1;

/// What a key gets when its scopes are not given: all but `keys:admin`.
inline constexpr scope_set default_scopes = all_scopes & ~bit(scope::keys_admin);

/// The scope's name ("threads:read", ...).
const char* name_of(scope s) noexcept;

/// The scope named `name`, or false.
bool parse_scope(std::string_view name, scope& out) noexcept;

/// The names of a set, in the order of `scope`.
std::vector<std::string> names_of(scope_set set);

/// Every scope's name, comma-separated, for error messages.
std::string all_scope_names();

} // namespace spindle::tenancy
