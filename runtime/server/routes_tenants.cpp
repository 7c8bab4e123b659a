// Tenants and keys (docs/api.md, "Tenants and keys"; docs/tenants.md): the
// admin token manages tenants; it and a tenant's keys with `keys:admin`
// manage that tenant's keys.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "auth.hpp"
#include "idempotency.hpp"
#include "router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"
#include "tenancy/tenant_store.hpp"

namespace spindle::http {

namespace {

using tenancy::tenant_store;

// The most scopes a request may list (each named once is enough).
constexpr size_t max_scope_list = 64;
// The longest a key may live: ten years.
constexpr int64_t max_expires_in_s = 10LL * 366 * 24 * 3600;

tenant_store& store_of(router& r) {
  auto store = r.tenants();
  if (!store)
    throw api_error{403, "permission_denied",
                    "tenancy is off: start spindle serve with --admin-token "
                    "to manage tenants and keys"};
  return *store;
}

json time_or_null(int64_t ms) {
  return ms == 0 ? json(nullptr) : json(ms);
}

json limit_json(const std::optional<uint64_t>& v) {
  return v ? json(*v) : json(nullptr);
}

// The tenant's own limits: null where the server's default applies.
json limits_json(const tenancy::limit_settings& l) {
  return json{{"requests_per_min", limit_json(l.requests_per_min)},
              {"tokens_per_min", limit_json(l.tokens_per_min)},
              {"concurrent_exchanges", limit_json(l.concurrent_exchanges)},
              {"max_queued", limit_json(l.max_queued)},
              {"reply_reserve", limit_json(l.reply_reserve)}};
}

json tenant_json(const tenancy::tenant_record& t) {
  return json{{"id", t.id},
              {"object", "tenant"},
              {"name", t.name},
              {"weight", t.weight},
              {"limits", limits_json(t.limits)},
              {"created_at", t.created_ms}};
}

// The body's `limits` over `base`: each field an integer, or null for the
// server's default; `"limits": null` puts every field back to it. Nullopt
// when the body has none.
std::optional<tenancy::limit_settings>
limits_of_body(const json& body, tenancy::limit_settings base) {
  auto i = body.find("limits");
  if (i == body.end())
    return std::nullopt;
  if (i->is_null())
    return tenancy::limit_settings{};
  if (!i->is_object())
    throw api_error{400, "malformed",
                    "limits must be an object of integers (or null)",
                    "limits"};
  static const std::pair<const char*,
                         std::optional<uint64_t> tenancy::limit_settings::*>
    fields[] = {
      {"requests_per_min", &tenancy::limit_settings::requests_per_min},
      {"tokens_per_min", &tenancy::limit_settings::tokens_per_min},
      {"concurrent_exchanges", &tenancy::limit_settings::concurrent_exchanges},
      {"max_queued", &tenancy::limit_settings::max_queued},
      {"reply_reserve", &tenancy::limit_settings::reply_reserve},
    };
  for (auto& item : i->items()) {
    const std::string& key = item.key();
    const json& value = item.value();
    auto f = std::find_if(std::begin(fields), std::end(fields),
                          [&key](const auto& x) { return key == x.first; });
    if (f == std::end(fields))
      throw api_error{400, "malformed",
                      "limits has no field '" + key.substr(0, 64)
                        + "' (requests_per_min, tokens_per_min, "
                          "concurrent_exchanges, max_queued, "
                          "reply_reserve)",
                      "limits." + key.substr(0, 64)};
    auto param = "limits." + key;
    if (value.is_null()) {
      base.*(f->second) = std::nullopt;
      continue;
    }
    if (!value.is_number_integer())
      throw api_error{400, "malformed",
                      param + " must be an integer (or null)", param};
    if (value.is_number_unsigned())
      base.*(f->second) = value.get<uint64_t>();
    else {
      auto v = value.get<int64_t>();
      if (v < 0)
        throw api_error{400, "invalid_argument",
                        param + " must not be negative", param};
      base.*(f->second) = static_cast<uint64_t>(v);
    }
  }
  if (auto problem = base.check(); !problem.empty())
    throw api_error{400, "invalid_argument", problem,
                    problem.substr(0, problem.find(' '))};
  return base;
}

json key_json(const tenancy::key_record& k) {
  return json{{"id", k.id},
              {"object", "key"},
              {"tenant", k.tenant},
              {"name", k.name},
              {"prefix", k.prefix},
              {"scopes", tenancy::names_of(k.scopes)},
              {"created_at", k.created_ms},
              {"expires_at", time_or_null(k.expires_ms)},
              {"last_used_at", time_or_null(k.last_used_ms)}};
}

// A tenant ID of the path: one that cannot be a tenant answers as a
// missing one.
const std::string& path_tenant(const request& req) {
  auto& id = req.matches[1];
  if (!valid_tenant_id(id))
    throw api_error{404, "not_found",
                    "no tenant '" + id.substr(0, 64) + "'"};
  return id;
}

tenancy::tenant_record found_tenant(tenant_store& store,
                                    const std::string& id) {
  auto found = store.find_tenant(id);
  if (!found)
    fail(found.error());
  if (!*found)
    throw api_error{404, "not_found", "no tenant '" + id + "'"};
  return **found;
}

std::optional<int64_t> weight_of(const json& body) {
  auto w = optional_int(body, "weight");
  if (w && (*w < 1 || *w > 1000))
    throw api_error{400, "invalid_argument",
                    "weight must be between 1 and 1000", "weight"};
  return w;
}

std::string name_of_body(const json& body, bool required) {
  auto name = required ? required_string(body, "name")
                       : optional_string(body, "name").value_or("");
  if (required || !name.empty())
    if (auto problem = tenant_store::check_name(name); !problem.empty())
      throw api_error{400, "invalid_argument", problem, "name"};
  return name;
}

tenancy::scope_set scopes_of_body(const json& body) {
  auto field = body.find("scopes");
  if (field == body.end() || field->is_null())
    return tenancy::default_scopes;
  if (!field->is_array())
    throw api_error{400, "malformed",
                    "field 'scopes' must be an array of scope names",
                    "scopes"};
  if (field->size() > max_scope_list)
    throw api_error{413, "too_large",
                    "scopes lists at most " + std::to_string(max_scope_list)
                      + " names",
                    "scopes"};
  if (field->empty())
    throw api_error{400, "invalid_argument",
                    "scopes is empty: a key needs at least one scope ("
                      + tenancy::all_scope_names() + ")",
                    "scopes"};
  tenancy::scope_set set = 0;
  for (auto& item : *field) {
    tenancy::scope s;
    if (!item.is_string() || !tenancy::parse_scope(item.get<std::string>(), s))
      throw api_error{400, "invalid_argument",
                      "scopes: '"
                        + (item.is_string() ? item.get<std::string>().substr(0, 64)
                                            : dump(item).substr(0, 64))
                        + "' is not a scope; the scopes are "
                        + tenancy::all_scope_names(),
                      "scopes"};
    set |= tenancy::bit(s);
  }
  return set;
}

// The end-user settings as shown: never the HS256 secret; the JWK Set's
// public keys as given.
json auth_json(const tenancy::auth_record& a) {
  json out{{"object", "tenant_auth"},
           {"tenant", a.tenant},
           {"issuer", a.keys.issuer},
           {"audience", a.keys.audience.empty() ? json(nullptr)
                                                : json(a.keys.audience)},
           {"hs256", !a.keys.hs256_secret.empty()},
           {"updated_at", a.updated_ms}};
  auto jwks = a.keys.jwks.empty() ? json(nullptr)
                                  : json::parse(a.keys.jwks, nullptr, false);
  out["jwks"] = jwks.is_discarded() ? json(nullptr) : jwks;
  return out;
}

// The most a JWK Set file may hold.
constexpr std::streamsize max_jwks_file = 64 * 1024;

// A JWK Set given as a file path, read now (the admin token only: a
// tenant's key may not make the server read its files).
std::string read_jwks_file(const request& req, const std::string& path) {
  if (who(req).who != tenancy::principal::kind::admin)
    throw api_error{403, "permission_denied",
                    "only the admin token may give jwks as a file path; "
                    "give the JWK Set itself",
                    "jwks"};
  auto unreadable = [&](const std::string& why) {
    return api_error{400, "invalid_argument",
                     "cannot read the JWK Set file '" + path.substr(0, 200)
                       + "': " + why,
                     "jwks"};
  };
  // Opened without blocking and read only when it is a regular file: a
  // FIFO, a terminal or a device would hold this worker (or never end).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    throw unreadable(std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_it{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0)
    throw unreadable(std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw unreadable("not a regular file");
  if (st.st_size > max_jwks_file)
    throw api_error{413, "too_large",
                    "the JWK Set file has more than "
                      + std::to_string(max_jwks_file) + " bytes",
                    "jwks"};
  std::string text(static_cast<size_t>(max_jwks_file) + 1, '\0');
  size_t have = 0;
  while (have < text.size()) {
    auto n = ::read(fd, text.data() + have, text.size() - have);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw unreadable(std::strerror(errno));
    if (n == 0)
      break;
    have += static_cast<size_t>(n);
  }
  text.resize(have);
  if (text.size() > static_cast<size_t>(max_jwks_file))
    throw api_error{413, "too_large",
                    "the JWK Set file has more than "
                      + std::to_string(max_jwks_file) + " bytes",
                    "jwks"};
  return text;
}

// What the tenant holds: threads (any?) and memory scopes.
struct holdings {
  bool threads = false;
  uint64_t memory_scopes = 0;
};

holdings holdings_of(router& r, const std::string& prefix) {
  holdings out;
  thread_list_request lr;
  lr.limit = 1;
  lr.scoped = true;
  lr.tenant_prefix = prefix;
  auto page = r.rt().list_threads(lr);
  if (!page)
    fail(page.error());
  out.threads = !page->threads.empty();
  auto scopes = r.rt().delete_tenant_memories(prefix, /*dry_run=*/true);
  if (scopes)
    out.memory_scopes = *scopes;
  else if (classify(scopes.error()) != errc::unavailable)
    fail(scopes.error());
  return out;
}

} // namespace

void add_tenant_routes(router& r) {
  r.post(R"(/v1/tenants)", "POST /v1/tenants",
         [&r](const request& req, response& res, request_context& ctx) {
           auto& store = store_of(r);
           auto body = parse_body(req, {"name", "weight", "limits"});
           auto name = name_of_body(body, true);
           auto weight = weight_of(body).value_or(1);
           auto limits = limits_of_body(body, {});
           auto created = store.create_tenant(
             name, weight, limits.value_or(tenancy::limit_settings{}));
           if (!created)
             fail(created.error());
           ctx.log["tenant"] = created->id;
           reply(res, 201, tenant_json(*created));
         });

  r.get(R"(/v1/tenants)", "GET /v1/tenants",
        [&r](const request& req, response& res, request_context&) {
          auto& store = store_of(r);
          only_params(req, {});
          auto all = store.list_tenants();
          if (!all)
            fail(all.error());
          json data = json::array();
          for (auto& t : *all)
            data.push_back(tenant_json(t));
          reply(res, 200, {{"object", "list"}, {"data", std::move(data)}});
        });

  r.get(R"(/v1/tenants/([^/]+))", "GET /v1/tenants/{id}",
        [&r](const request& req, response& res, request_context&) {
          auto& store = store_of(r);
          reply(res, 200, tenant_json(found_tenant(store, path_tenant(req))));
        });

  r.patch(R"(/v1/tenants/([^/]+))", "PATCH /v1/tenants/{id}",
          [&r](const request& req, response& res, request_context&) {
            auto& store = store_of(r);
            auto& id = path_tenant(req);
            auto body = parse_body(req, {"name", "weight", "limits"});
            if (!body.contains("name") && !body.contains("weight")
                && !body.contains("limits"))
              throw api_error{400, "malformed",
                              "give name, weight and/or limits to change",
                              "name"};
            std::optional<std::string> name;
            if (body.contains("name"))
              name = name_of_body(body, true);
            auto weight = weight_of(body);
            if (id == tenancy::default_tenant && name)
              throw api_error{400, "invalid_argument",
                              "the default tenant keeps its name", "name"};
            // Limits change field by field: those the body names.
            std::optional<tenancy::limit_settings> limits;
            if (body.contains("limits"))
              limits = limits_of_body(body,
                                      found_tenant(store, id).limits);
            auto updated = store.update_tenant(id, name, weight, limits);
            if (!updated)
              fail(updated.error());
            if (!*updated)
              throw api_error{404, "not_found", "no tenant '" + id + "'"};
            reply(res, 200, tenant_json(**updated));
          });

  r.del(R"(/v1/tenants/([^/]+))", "DELETE /v1/tenants/{id}",
        [&r](const request& req, response& res, request_context& ctx) {
          auto& store = store_of(r);
          only_params(req, {"force"});
          auto& id = path_tenant(req);
          auto force_text = req.get_param_value("force");
          if (req.has_param("force") && force_text != "true"
              && force_text != "false")
            throw api_error{400, "invalid_argument",
                            "force must be true or false", "force"};
          bool force = force_text == "true";
          if (id == tenancy::default_tenant)
            throw api_error{400, "invalid_argument",
                            "the default tenant cannot be deleted"};
          found_tenant(store, id);
          auto prefix = tenancy::prefix_of(id);
          auto held = holdings_of(r, prefix);
          if ((held.threads || held.memory_scopes > 0) && !force)
            throw api_error{
              409, "conflict",
              "tenant '" + id + "' holds "
                + (held.threads ? std::string{"threads"}
                                : std::string{"no threads"})
                + " and the memories of " + std::to_string(held.memory_scopes)
                + " users or threads; delete them, or delete the tenant with "
                  "?force=true to remove them with it"};
          // Its keys go first, so that nothing of it is written while its
          // data goes; other nodes stop accepting them within the bound.
          auto revoked = store.revoke_keys(id);
          if (!revoked)
            fail(revoked.error());
          if (held.threads || held.memory_scopes > 0)
            std::this_thread::sleep_for(2 * tenant_store::refresh);
          uint64_t threads = 0;
          for (;;) {
            thread_list_request lr;
            lr.limit = max_thread_page;
            lr.scoped = true;
            lr.tenant_prefix = prefix;
            auto page = r.rt().list_threads(lr);
            if (!page)
              fail(page.error());
            if (page->threads.empty())
              break;
            for (auto& t : page->threads) {
              auto gone = r.rt().delete_thread(t.thread_id);
              if (!gone && classify(gone.error()) != errc::not_found)
                fail(gone.error());
              ++threads;
            }
          }
          uint64_t memories = 0;
          auto deleted = r.rt().delete_tenant_memories(prefix);
          if (deleted)
            memories = *deleted;
          else if (classify(deleted.error()) != errc::unavailable)
            fail(deleted.error());
          if (auto keys = r.idempotency())
            if (auto err = keys->forget_prefix(prefix))
              fail(err);
          if (auto usage = r.rt().delete_usage(id);
              !usage && classify(usage.error()) != errc::unavailable)
            fail(usage.error());
          auto gone = store.delete_tenant(id);
          if (!gone)
            fail(gone.error());
          if (!*gone)
            throw api_error{404, "not_found", "no tenant '" + id + "'"};
          spdlog::info("tenant {} deleted: {} threads, {} memories, {} keys",
                       id, threads, memories, *revoked);
          ctx.log["tenant"] = id;
          reply(res, 200,
                {{"id", id},
                 {"object", "tenant"},
                 {"deleted", true},
                 {"threads", threads},
                 {"memories", memories},
                 {"keys", *revoked}});
        });

  r.post(R"(/v1/tenants/([^/]+)/keys)", "POST /v1/tenants/{id}/keys",
         [&r](const request& req, response& res, request_context& ctx) {
           auto& store = store_of(r);
           auto& id = path_tenant(req);
           auto body = parse_body(req, {"name", "scopes", "expires_in_s"},
                                  /*allow_empty=*/true);
           auto name = name_of_body(body, false);
           auto scopes = scopes_of_body(body);
           auto expires = optional_int(body, "expires_in_s");
           if (expires && (*expires < 1 || *expires > max_expires_in_s))
             throw api_error{400, "invalid_argument",
                             "expires_in_s must be between 1 and "
                               + std::to_string(max_expires_in_s),
                             "expires_in_s"};
           // A key may not hand out more than it holds.
           auto& principal = who(req);
           if (principal.who == tenancy::principal::kind::key
               && (scopes & ~principal.scopes) != 0)
             throw api_error{403, "permission_denied",
                             "a key cannot create a key with scopes it "
                             "lacks",
                             "scopes"};
           auto created = store.create_key(id, name, scopes,
                                           expires.value_or(0));
           if (!created)
             fail(created.error());
           ctx.log["key"] = created->record.id;
           auto out = key_json(created->record);
           out["key"] = created->secret;
           reply(res, 201, out);
         });

  r.get(R"(/v1/tenants/([^/]+)/keys)", "GET /v1/tenants/{id}/keys",
        [&r](const request& req, response& res, request_context&) {
          auto& store = store_of(r);
          only_params(req, {});
          auto& id = path_tenant(req);
          found_tenant(store, id);
          auto keys = store.list_keys(id);
          if (!keys)
            fail(keys.error());
          json data = json::array();
          for (auto& k : *keys)
            data.push_back(key_json(k));
          reply(res, 200, {{"object", "list"}, {"data", std::move(data)}});
        });

  // Who the request's token acts as: for a console or a client that holds
  // a token and wants to show what it may do.
  r.get(R"(/v1/me)", "GET /v1/me",
        [&r](const request& req, response& res, request_context&) {
          only_params(req, {});
          auto& p = who(req);
          using kind = tenancy::principal::kind;
          const char* kinds[] = {"open", "admin", "key", "end_user"};
          json out{{"object", "principal"},
                   {"kind", kinds[static_cast<int>(p.who)]},
                   {"tenant", p.in_tenant() ? json(p.tenant) : json(nullptr)},
                   {"tenant_name", nullptr},
                   {"user", p.is_end_user() ? json(p.user) : json(nullptr)},
                   {"key_id", p.who == kind::key ? json(p.key_id)
                                                 : json(nullptr)},
                   {"scopes", tenancy::names_of(p.scopes)}};
          if (p.in_tenant())
            if (auto store = r.tenants()) {
              auto found = store->find_tenant(p.tenant);
              if (!found)
                fail(found.error());
              if (*found)
                out["tenant_name"] = (*found)->name;
            }
          if (p.who == kind::open)
            out["tenant_name"] = p.tenant;
          reply(res, 200, out);
        });

  r.put(R"(/v1/tenants/([^/]+)/auth)", "PUT /v1/tenants/{id}/auth",
        [&r](const request& req, response& res, request_context& ctx) {
          auto& store = store_of(r);
          auto& id = path_tenant(req);
          auto body
            = parse_body(req, {"issuer", "audience", "hs256_secret", "jwks"});
          tenancy::issuer_keys keys;
          keys.issuer = required_string(body, "issuer");
          keys.audience = optional_string(body, "audience").value_or("");
          keys.hs256_secret
            = optional_string(body, "hs256_secret").value_or("");
          if (auto jwks = body.find("jwks");
              jwks != body.end() && !jwks->is_null()) {
            if (jwks->is_object())
              keys.jwks = dump(*jwks);
            else if (jwks->is_string())
              keys.jwks = read_jwks_file(req, jwks->get<std::string>());
            else
              throw api_error{400, "malformed",
                              "field 'jwks' must be a JWK Set (an object "
                              "with 'keys') or a file path",
                              "jwks"};
          }
          if (keys.hs256_secret.empty() && keys.jwks.empty())
            throw api_error{400, "invalid_argument",
                            "give hs256_secret or jwks: how end users' "
                            "tokens are signed",
                            "hs256_secret"};
          auto set = store.set_auth(id, std::move(keys));
          if (!set) {
            auto e = to_api_error(set.error());
            if (e.status == 400 && e.param.empty())
              e.param = e.message.find("jwk") != std::string::npos
                          ? "jwks"
                        : e.message.find("secret") != std::string::npos
                          ? "hs256_secret"
                        : e.message.rfind("audience", 0) == 0 ? "audience"
                                                               : "issuer";
            throw e;
          }
          ctx.log["tenant"] = id;
          spdlog::info("tenant {}: end users' tokens of issuer '{}' accepted",
                       id, set->keys.issuer);
          reply(res, 200, auth_json(*set));
        });

  r.get(R"(/v1/tenants/([^/]+)/auth)", "GET /v1/tenants/{id}/auth",
        [&r](const request& req, response& res, request_context&) {
          auto& store = store_of(r);
          only_params(req, {});
          auto& id = path_tenant(req);
          found_tenant(store, id);
          auto got = store.get_auth(id);
          if (!got)
            fail(got.error());
          if (!*got)
            throw api_error{404, "not_found",
                            "tenant '" + id + "' accepts no end users' "
                              "tokens"};
          reply(res, 200, auth_json(**got));
        });

  r.del(R"(/v1/tenants/([^/]+)/auth)", "DELETE /v1/tenants/{id}/auth",
        [&r](const request& req, response& res, request_context& ctx) {
          auto& store = store_of(r);
          only_params(req, {});
          auto& id = path_tenant(req);
          found_tenant(store, id);
          auto gone = store.clear_auth(id);
          if (!gone)
            fail(gone.error());
          if (!*gone)
            throw api_error{404, "not_found",
                            "tenant '" + id + "' accepts no end users' "
                              "tokens"};
          ctx.log["tenant"] = id;
          reply(res, 200,
                {{"tenant", id}, {"object", "tenant_auth"}, {"deleted", true}});
        });

  r.del(R"(/v1/keys/([^/]+))", "DELETE /v1/keys/{id}",
        [&r](const request& req, response& res, request_context& ctx) {
          auto& store = store_of(r);
          auto& id = req.matches[1];
          auto& principal = who(req);
          // A key revokes its own tenant's keys only; another tenant's
          // key answers as a missing one.
          auto tenant = principal.who == tenancy::principal::kind::key
                          ? principal.tenant
                          : std::string{};
          auto gone = store.revoke_key(id, tenant);
          if (!gone)
            fail(gone.error());
          if (!*gone)
            throw api_error{404, "not_found",
                            "no key '" + id.substr(0, 64) + "'"};
          ctx.log["key"] = id;
          reply(res, 200, {{"id", id}, {"object", "key"}, {"revoked", true}});
        });
}

} // namespace spindle::http
