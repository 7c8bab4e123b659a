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
    /// An end user's token (a JWT its tenant's issuer signed): that user
    /// in that tenant, its own threads and memories only.
    end_user,
  };
  kind who = kind::open;
  /// The tenant acted in; empty for the admin token naming none.
  std::string tenant = default_tenant;
  /// What the tenant's IDs start with inside spindle: "" for the default
  /// tenant, else "TENANT~" (ids.hpp, `tenant_separator`).
  std::string prefix;
  /// What the threads this principal may name start with: `prefix`, and
  /// for an end user `prefix` + USER + "~" (its own threads only).
  std::string thread_prefix;
  /// The end user (`end_user`), as its tenant knows it.
  std::string user;
  scope_set scopes = all_scopes;
  /// The key's ID (`key`), for logs.
  std::string key_id;

  bool in_tenant() const noexcept {
    return !tenant.empty();
  }
  bool may(scope s) const noexcept {
    return (scopes & bit(s)) != 0;
  }
  /// Acts in `id` (its prefixes too).
  void set_tenant(const std::string& id);

  bool is_end_user() const noexcept {
    return who == kind::end_user;
  }
  /// The thread `id` as spindle stores it for this principal.
  std::string qualify(const std::string& id) const {
    return thread_prefix.empty() ? id : thread_prefix + id;
  }
};

/// The prefix of `tenant`'s IDs: "" for the default tenant.
inline std::string prefix_of(const std::string& tenant) {
  return tenant == default_tenant ? std::string{} : tenant + "~";
}

inline void principal::set_tenant(const std::string& id) {
  tenant = id;
  prefix = prefix_of(id);
  thread_prefix = prefix;
}

} // namespace spindle::tenancy
