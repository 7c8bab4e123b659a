#include "auth.hpp"

#include <stdexcept>
#include <unordered_map>

#include <openssl/crypto.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/memory.hpp"
#include "tenancy/tenant_store.hpp"

namespace spindle::http {

namespace {

using tenancy::principal;
using tenancy::scope;

const std::unordered_map<std::string, route_rule>& rules() {
  static const std::unordered_map<std::string, route_rule> table = [] {
    std::unordered_map<std::string, route_rule> t;
    auto put = [&](std::initializer_list<const char*> routes, access a,
                   scope s = scope::threads_read) {
      for (auto* r : routes)
        t.emplace(r, route_rule{a, s});
    };
    put({"GET /healthz", "GET /", "GET /console/{file}",
         "GET /v1/openapi.json"},
        access::open);
    put({"POST /v1/tokens/count", "GET /v1/me"}, access::any);
    put({"GET /metrics", "GET /v1/stats", "GET /v1/cluster",
         "POST /v1/tenants", "GET /v1/tenants", "GET /v1/tenants/{id}",
         "PATCH /v1/tenants/{id}", "DELETE /v1/tenants/{id}"},
        access::admin);
    put({"POST /v1/tenants/{id}/keys", "GET /v1/tenants/{id}/keys",
         "DELETE /v1/keys/{id}", "PUT /v1/tenants/{id}/auth",
         "GET /v1/tenants/{id}/auth", "DELETE /v1/tenants/{id}/auth"},
        access::tenant_admin, scope::keys_admin);
    put({"GET /v1/threads", "GET /v1/threads/{id}",
         "GET /v1/threads/{id}/history", "GET /v1/threads/{id}/items",
         "GET /v1/threads/{id}/items/render",
         "POST /v1/threads/{id}/context"},
        access::tenant, scope::threads_read);
    put({"POST /v1/threads", "PATCH /v1/threads/{id}",
         "DELETE /v1/threads/{id}", "POST /v1/threads/{id}/copy",
         "POST /v1/threads/{id}/messages",
         "POST /v1/threads/{id}/messages/stream",
         "POST /v1/threads/{id}/cancel", "POST /v1/threads/{id}/turns",
         "DELETE /v1/threads/{id}/turns", "POST /v1/threads/{id}/items",
         "POST /v1/chat/completions"},
        access::tenant, scope::threads_write);
    put({"GET /v1/memories", "GET /v1/memories/entries"}, access::tenant,
        scope::memories_read);
    put({"POST /v1/memories", "DELETE /v1/memories",
         "DELETE /v1/memories/{id}"},
        access::tenant, scope::memories_write);
    put({"GET /v1/orchestrations", "GET /v1/orchestrations/{id}",
         "GET /v1/tasks/{id}"},
        access::tenant, scope::tasks_read);
    put({"POST /v1/orchestrations", "POST /v1/tasks/claim",
         "POST /v1/tasks/{id}/complete", "POST /v1/tasks/{id}/fail",
         "POST /v1/tasks/{id}/heartbeat", "POST /v1/tasks/{id}/requeue",
         "POST /v1/tasks/{id}/subtasks", "POST /v1/ids"},
        access::tenant, scope::tasks_write);
    put({"GET /v1/events"}, access::tenant, scope::events_read);
    put({"GET /v1/usage", "GET /v1/limits"}, access::tenant,
        scope::usage_read);
    return t;
  }();
  return table;
}

api_error unauthorized(std::string message) {
  return api_error{401, "unauthorized", std::move(message)};
}

api_error forbidden(std::string message, std::string param = {}) {
  return api_error{403, "permission_denied", std::move(message),
                   std::move(param)};
}

// The bearer token of the request, or "" without one: a view into the
// request's header.
std::string_view bearer_of(const request& req) {
  auto header = req.authorization();
  static constexpr std::string_view bearer = "Bearer ";
  if (header.substr(0, bearer.size()) != bearer)
    return {};
  return header.substr(bearer.size());
}

auth_outcome refused(api_error e) {
  auth_outcome out;
  out.refusal = std::move(e);
  return out;
}

// What a principal may do on a route with `rule`, once it is known.
std::optional<api_error> authorize(const principal& p, const route_rule& rule,
                                   const request& req) {
  switch (rule.who) {
    case access::open:
    case access::any:
      return std::nullopt;
    case access::admin:
      if (p.who == principal::kind::admin)
        return std::nullopt;
      return forbidden("this route is for the admin token (--admin-token)");
    case access::tenant_admin:
      if (p.who == principal::kind::admin)
        return std::nullopt;
      if (p.is_end_user())
        return forbidden("an end user's token reaches only its own threads "
                         "and memories",
                         "keys:admin");
      if (!p.may(scope::keys_admin))
        return forbidden("this key lacks the scope 'keys:admin'",
                         "keys:admin");
      // Its own tenant's keys only; a key's ID is checked by the route.
      if (req.matches.size() > 1 && req.path.rfind("/v1/tenants/", 0) == 0
          && req.matches[1] != p.tenant)
        return forbidden("a key manages the keys of its own tenant only");
      return std::nullopt;
    case access::tenant:
      if (!p.in_tenant())
        return forbidden("the admin token manages tenants and keys; name a "
                         "tenant with the Spindle-Tenant header to act in "
                         "it");
      if (!p.may(rule.scope) && p.is_end_user())
        return forbidden(std::string{"an end user's token reaches only its "
                                     "own threads and memories (scope '"}
                           + tenancy::name_of(rule.scope) + "')",
                         tenancy::name_of(rule.scope));
      if (!p.may(rule.scope))
        return forbidden(std::string{"this key lacks the scope '"}
                           + tenancy::name_of(rule.scope) + "'",
                         tenancy::name_of(rule.scope));
      return std::nullopt;
  }
  return std::nullopt;
}

} // namespace

route_rule rule_of(const std::string& route) {
  auto& t = rules();
  auto i = t.find(route);
  if (i == t.end())
    throw std::logic_error{"route " + route
                           + " has no rule of access (runtime/server/"
                             "auth.cpp)"};
  return i->second;
}

std::shared_ptr<const principal> open_principal() {
  static const auto p = std::make_shared<const principal>();
  return p;
}

bool same_secret(std::string_view given, std::string_view secret) noexcept {
  // Bytes compared by CRYPTO_memcmp, which reads them all: the time taken
  // says nothing about how much of a guess was right. Only a guess of
  // another length is told apart sooner, which gives away the length of
  // the secret and nothing of its content.
  return !secret.empty() && given.size() == secret.size()
         && CRYPTO_memcmp(given.data(), secret.data(), secret.size()) == 0;
}

auth_outcome authenticate(const request& req, const route_rule& rule,
                          const std::string& admin_token,
                          tenancy::tenant_store& tenants, bool may_block) {
  auto token = bearer_of(req);
  if (token.empty())
    return refused(
      unauthorized("this route requires 'Authorization: Bearer <key>'"));
  auto named = std::string{req.tenant_header()};
  if (same_secret(token, admin_token)) {
    auto p = std::make_shared<principal>();
    p->who = principal::kind::admin;
    p->tenant.clear();
    if (!named.empty()) {
      if (named != tenancy::default_tenant) {
        if (!valid_tenant_id(named))
          return refused(api_error{404, "not_found",
                                   "no tenant '" + named.substr(0, 64) + "'",
                                   "Spindle-Tenant"});
        if (!may_block) {
          auth_outcome later;
          later.needs_store = true;
          return later;
        }
        auto found = tenants.find_tenant(named);
        if (!found)
          return refused(api_error{503, "unavailable",
                                   "cannot read the tenants: "
                                     + describe(found.error())});
        if (!*found)
          return refused(api_error{404, "not_found",
                                   "no tenant '" + named + "'",
                                   "Spindle-Tenant"});
      }
      p->set_tenant(named);
    }
    if (auto no = authorize(*p, rule, req))
      return refused(std::move(*no));
    auth_outcome out;
    out.who = std::move(p);
    return out;
  }
  // The common case: a key in use, its principal made once.
  if (auto p = tenants.cached_principal(token)) {
    if (!named.empty() && named != p->tenant)
      return refused(forbidden(
        "Spindle-Tenant names a tenant for the admin token; a key acts in "
        "its own tenant only",
        "Spindle-Tenant"));
    if (auto no = authorize(*p, rule, req))
      return refused(std::move(*no));
    auth_outcome out;
    out.who = std::move(p);
    return out;
  }
  // An end user's token: a key has no dot, a JWT two. Its shape is
  // checked by the store, after its cache of verified tokens (a token
  // found there was checked when it was verified).
  if (token.find('.') != std::string_view::npos) {
    bool needs_store = false;
    // Its errors say "the token is refused: ..." or name what is missing.
    auto p = tenants.end_user(token, may_block, needs_store);
    if (!p) {
      if (classify(p.error()) == errc::invalid_argument)
        return refused(unauthorized(to_api_error(p.error()).message));
      return refused(api_error{503, "unavailable",
                               "cannot read the tenants: "
                                 + describe(p.error())});
    }
    if (needs_store) {
      auth_outcome later;
      later.needs_store = true;
      return later;
    }
    if (!named.empty() && named != (*p)->tenant)
      return refused(forbidden(
        "Spindle-Tenant names a tenant for the admin token; an end user "
        "acts in its own tenant only",
        "Spindle-Tenant"));
    if (auto no = authorize(**p, rule, req))
      return refused(std::move(*no));
    auth_outcome out;
    out.who = std::move(*p);
    return out;
  }
  tenancy::key_record key;
  tenancy::key_check verdict;
  if (auto known = tenants.cached(token, key)) {
    verdict = *known;
  } else if (!may_block) {
    auth_outcome later;
    later.needs_store = true;
    return later;
  } else {
    auto checked = tenants.authenticate(token, key);
    if (!checked)
      return refused(api_error{503, "unavailable",
                               "cannot read the keys: "
                                 + describe(checked.error())});
    verdict = *checked;
  }
  if (verdict == tenancy::key_check::unknown)
    return refused(unauthorized(
      "the key is not valid (unknown or revoked); this route requires "
      "'Authorization: Bearer <key>'"));
  if (verdict == tenancy::key_check::expired)
    return refused(unauthorized("the key " + key.id + " has expired"));
  if (!named.empty() && named != key.tenant)
    return refused(forbidden(
      "Spindle-Tenant names a tenant for the admin token; a key acts in "
      "its own tenant only",
      "Spindle-Tenant"));
  auto p = std::make_shared<principal>();
  p->who = principal::kind::key;
  p->set_tenant(key.tenant);
  p->scopes = key.scopes;
  p->key_id = key.id;
  if (auto no = authorize(*p, rule, req))
    return refused(std::move(*no));
  auth_outcome out;
  out.who = std::move(p);
  return out;
}

const principal& who(const request& req) {
  if (req.who)
    return *req.who;
  return *open_principal();
}

std::optional<std::string> try_scoped_thread(const request& req,
                                             const std::string& id) {
  auto& p = who(req);
  // A tenant's own clients may name its end users' threads: USER~ID.
  if (auto sep = id.find(tenant_separator);
      sep != std::string::npos && !p.is_end_user() && !p.prefix.empty()) {
    if (validate_client_user_id(std::string_view{id}.substr(0, sep))
        || validate_client_thread_id(std::string_view{id}.substr(sep + 1)))
      return std::nullopt;
    return p.qualify(id);
  }
  if (validate_client_thread_id(id))
    return std::nullopt;
  return p.qualify(id);
}

std::string scoped_thread(const request& req, const std::string& id,
                          const char* field) {
  if (auto scoped = try_scoped_thread(req, id))
    return std::move(*scoped);
  auto err = validate_client_thread_id(id);
  if (!err) // USER~ID with a bad user part.
    err = make_error(errc::invalid_id,
                     "thread_id '" + id.substr(0, 64)
                       + "' is invalid: an end user's thread is USER~ID "
                         "with a valid user ID and thread ID");
  auto e = to_api_error(err);
  e.param = field != nullptr ? field : "";
  throw e;
}

std::string scoped_user(const request& req, const std::string& id,
                        const char* field) {
  auto& p = who(req);
  if (p.is_end_user()) {
    // An end user is its token's subject, whatever the body says.
    if (!id.empty() && id != p.user)
      throw api_error{403, "permission_denied",
                      std::string{field} + " '" + id.substr(0, 64)
                        + "' is not the end user of this token",
                      field};
    return p.prefix + p.user;
  }
  if (id.empty())
    return id;
  if (auto err = validate_client_user_id(id)) {
    auto e = to_api_error(err);
    e.param = field;
    throw e;
  }
  return p.prefix.empty() ? id : p.prefix + id;
}

std::string local(const request& req, const std::string& id) {
  auto& p = who(req);
  if (!p.thread_prefix.empty()
      && id.compare(0, p.thread_prefix.size(), p.thread_prefix) == 0)
    return id.substr(p.thread_prefix.size());
  if (!p.prefix.empty() && id.compare(0, p.prefix.size(), p.prefix) == 0)
    return id.substr(p.prefix.size());
  return std::string{local_id(id)};
}

api_error scrubbed(api_error e, const request& req) {
  auto& p = who(req);
  for (auto* prefix : {&p.thread_prefix, &p.prefix}) {
    if (prefix->empty())
      continue;
    for (auto at = e.message.find(*prefix); at != std::string::npos;
         at = e.message.find(*prefix, at))
      e.message.erase(at, prefix->size());
  }
  return e;
}

} // namespace spindle::http
