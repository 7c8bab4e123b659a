#pragma once

// Who a request acts for and what it may do (docs/tenants.md): the rule of
// every route, the admin token, tenants' keys, and the IDs of a tenant.

#include <memory>
#include <optional>
#include <string>

#include "router.hpp"
#include "tenancy/principal.hpp"
#include "tenancy/scopes.hpp"

namespace spindle::tenancy {
class tenant_store;
} // namespace spindle::tenancy

namespace spindle::http {

/// The rule of the route named `route` ("GET /v1/threads/{id}"). Throws
/// std::logic_error for a route without one: every route has a rule.
route_rule rule_of(const std::string& route);

/// The principal of every request while tenancy is off.
std::shared_ptr<const tenancy::principal> open_principal();

/// Authenticates `req` for a route with `rule` while tenancy is on. With
/// `may_block` false it never touches the database. Thread-safe.
auth_outcome authenticate(const request& req, const route_rule& rule,
                          const std::string& admin_token,
                          tenancy::tenant_store& tenants, bool may_block);

/// Whether `given` is `secret`, in time independent of where they differ
/// (a `given` of another length is refused at once: the length of the
/// secret is not hidden, its content is).
bool same_secret(std::string_view given, std::string_view secret) noexcept;

/// The principal of a request (the open one when none was set).
const tenancy::principal& who(const request& req);

/// A thread ID from a client (the path's, a body's or a query's `field`),
/// checked (no tenant in it; 400 `invalid_id` otherwise) and qualified for
/// the request's tenant. "new" is kept as the tenant's "new".
std::string scoped_thread(const request& req, const std::string& id,
                          const char* field = "thread_id");
/// The same without throwing: nullopt for an ID the request may not name.
/// A tenant's key (or the admin token in a tenant) may name an end user's
/// thread as USER~ID; an end user names its own threads only.
std::optional<std::string> try_scoped_thread(const request& req,
                                             const std::string& id);
/// The same for a user ID; "" stays "". For an end user: its own ID
/// whether given or not, and 403 `permission_denied` for another.
std::string scoped_user(const request& req, const std::string& id,
                        const char* field = "user_id");
/// A thread or user ID as the request's principal knows it.
std::string local(const request& req, const std::string& id);

/// `e` without the request's tenant prefix in its message.
api_error scrubbed(api_error e, const request& req);

} // namespace spindle::http
