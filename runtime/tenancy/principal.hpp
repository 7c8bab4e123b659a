#pragma once

// Who a request acts for (docs/tenants.md, "Who a request acts for").

#include <string>

#include "tenancy/scopes.hpp"

namespace spindle::tenancy {

/// The ID of the tenant that holds the data written before tenancy, and
/// all data while tenancy is off. Its IDs are not qualified.
inline constexpr const char* default_tenant = "default";

struct principal {
  enum class kind : uint8_t {
    /// Tenancy is off: the one implicit tenant, every scope.
    open,
    /// The admin token: manages tenants and keys; acts in a tenant only
    /// when it names one (`Spindle-Tenant`), then with every scope.
    admin,
    /// A tenant's key: its tenant, its scopes.
    key,
  };
  kind who = kind::open;
  /// The tenant acted in; empty for the admin token naming none.
  std::string tenant = default_tenant;
  /// What the tenant's IDs start with inside spindle: "" for the default
  /// tenant, else "TENANT~" (ids.hpp, `tenant_separator`).
  std::string prefix;
  scope_set scopes = all_scopes;
  /// The key's ID (`key`), for logs.
  std::string key_id;

  bool in_tenant() const noexcept {
    return !tenant.empty();
  }
  bool may(scope s) const noexcept {
    return (scopes & bit(s)) != 0;
  }
  /// `id` as spindle stores it for this tenant.
  std::string qualify(const std::string& id) const {
    return prefix.empty() ? id : prefix + id;
  }
};

/// The prefix of `tenant`'s IDs: "" for the default tenant.
inline std::string prefix_of(const std::string& tenant) {
  return tenant == default_tenant ? std::string{} : tenant + "~";
}

} // namespace spindle::tenancy
