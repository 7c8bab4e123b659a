#include "tenancy/tenant_store.hpp"

#include <algorithm>
#include <filesystem>

#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include "core/digest.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "storage/database.hpp"
#include "storage/postgres/postgres.hpp"
#include "storage/sql_connection.hpp"
#include "tenancy/principal.hpp"

namespace spindle::tenancy {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

constexpr char alphabet62[]
  = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
constexpr char alphabet36[] = "abcdefghijklmnopqrstuvwxyz0123456789";

// `n` characters drawn uniformly from the first `size` of `alphabet`, from
// the operating system's random source (OpenSSL's RAND_bytes), with
// rejection so that every character is equally likely.
std::string random_text(size_t n, const char* alphabet, unsigned size) {
  std::string out;
  out.reserve(n);
  unsigned limit = 256 - 256 % size;
  unsigned char buf[64];
  while (out.size() < n) {
    if (RAND_bytes(buf, sizeof buf) != 1)
      throw std::runtime_error{"no random bytes from the system"};
    for (unsigned char b : buf)
      if (b < limit && out.size() < n)
        out += alphabet[b % size];
  }
  return out;
}

constexpr const char* key_marker = "spk_";
constexpr size_t key_secret_chars = 40;
constexpr size_t key_prefix_chars = 12;

// A cached answer stays good while the refresher keeps up: past this
// without a successful read of the log of changes (the store cannot be
// reached), the database is asked again. Generous, so that a refresher
// only delayed by a busy machine does not send every request to the store.
constexpr int64_t stale_after_ms = 10000;
// How long a hash found to be no key is refused without asking again, and
// how many such hashes are remembered.
constexpr auto unknown_for = std::chrono::seconds{1};
constexpr size_t max_unknown = 65536;
// Changes older than this leave the log.
constexpr int64_t change_retention_ms = 3600 * 1000;

std::string text_of(const sql_value& v) {
  return v.type == sql_value::kind::text ? v.text : std::string{};
}

int64_t int_of(const sql_value& v) {
  return v.type == sql_value::kind::integer ? v.integer : 0;
}

scope_set scopes_of(std::string_view text) {
  scope_set out = 0;
  size_t start = 0;
  while (start < text.size()) {
    auto end = std::min(text.find(' ', start), text.size());
    scope s;
    if (parse_scope(text.substr(start, end - start), s))
      out |= bit(s);
    start = end + 1;
  }
  return out;
}

std::string scopes_text(scope_set set) {
  std::string out;
  for (auto& name : names_of(set)) {
    if (!out.empty())
      out += ' ';
    out += name;
  }
  return out;
}

tenant_record tenant_of_row(const std::vector<sql_value>& row) {
  return tenant_record{text_of(row[0]), text_of(row[1]), int_of(row[2]),
                       int_of(row[3])};
}

constexpr const char* key_columns
  = "id, tenant, prefix, name, scopes, created_ms, expires_ms, last_used_ms";

key_record key_of_row(const std::vector<sql_value>& row) {
  key_record k;
  k.id = text_of(row[0]);
  k.tenant = text_of(row[1]);
  k.prefix = text_of(row[2]);
  k.name = text_of(row[3]);
  k.scopes = scopes_of(text_of(row[4]));
  k.created_ms = int_of(row[5]);
  k.expires_ms = int_of(row[6]);
  k.last_used_ms = int_of(row[7]);
  return k;
}

caf::expected<sql_rows> query(sql_connection& db, const std::string& sql,
                              const std::vector<sql_value>& params) {
  return run_query(db, sql, params);
}

caf::error run(sql_connection& db, const std::string& sql,
               std::vector<sql_value> params) {
  auto rows = query(db, sql, std::move(params));
  return rows ? caf::error{} : rows.error();
}

std::string tenants_database_path(const storage_options& options) {
  if (options.files_in_memory())
    return ":memory:";
  return (std::filesystem::path{options.data_dir} / "tenants.db").string();
}

// The change of a tenant's end-user settings, in the log of changes.
constexpr std::string_view auth_marker = "auth:";

std::string auth_change(const std::string& tenant) {
  return std::string{auth_marker} + tenant;
}

// The log's entry for a change of a tenant's limits.
constexpr std::string_view limits_marker = "limits:";

std::string limits_change(const std::string& tenant) {
  return std::string{limits_marker} + tenant;
}

constexpr const char* limit_columns
  = "requests_per_min, tokens_per_min, concurrent_exchanges, max_queued, "
    "reply_reserve";

sql_value limit_value(const std::optional<uint64_t>& v) {
  return v ? sql_value::of(static_cast<int64_t>(*v))
           : sql_value::of(sql_value::kind::null);
}

std::optional<uint64_t> limit_of(const sql_value& v) {
  if (v.type != sql_value::kind::integer || v.integer < 0)
    return std::nullopt;
  return static_cast<uint64_t>(v.integer);
}

// Most tokens kept verified; past it, the cache starts again.
constexpr size_t max_verified_tokens = 65536;
// The longest a JWK Set or an issuer may be.
constexpr size_t max_jwks_bytes = 64 * 1024;
constexpr size_t max_issuer_bytes = 512;

bool unique_violation(const caf::error& err) {
  auto text = describe(err);
  return text.find("UNIQUE") != std::string::npos
         || text.find("unique") != std::string::npos
         || text.find("duplicate key") != std::string::npos;
}

} // namespace

tenant_store::tenant_store(std::unique_ptr<sql_connection> db)
  : db_(std::move(db)) {
}

caf::expected<std::unique_ptr<tenant_store>>
tenant_store::open(const storage_options& storage) {
  std::unique_ptr<sql_connection> db;
  if (storage.on_postgres()) {
    auto opened = open_postgres(storage.store);
    if (!opened)
      return opened.error();
    db = std::move(*opened);
  } else {
    auto opened = database::open(tenants_database_path(storage), storage.sync);
    if (!opened)
      return opened.error();
    db = sqlite_connection(std::move(*opened));
  }
  std::unique_ptr<tenant_store> out{new tenant_store(std::move(db))};
  if (auto err = out->create_schema())
    return err;
  out->load_limits({});
  out->refresh_once();
  out->refresher_ = std::thread{[p = out.get()] { p->refresher(); }};
  return out;
}

tenant_store::~tenant_store() {
  {
    std::lock_guard<std::mutex> guard{stop_mx_};
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (refresher_.joinable())
    refresher_.join();
}

caf::error tenant_store::create_schema() {
  std::lock_guard<std::mutex> guard{db_mx_};
  bool pg = db_->backend() == sql_backend::postgres;
  if (auto err = db_->begin())
    return err;
  auto fail = [&](caf::error err) {
    db_->rollback();
    return err;
  };
  // Two nodes starting at once: one creates, the other waits and finds.
  if (pg)
    if (auto err = db_->exec("SELECT pg_advisory_xact_lock(7305813101);"))
      return fail(std::move(err));
  std::string ddl
    = "CREATE TABLE IF NOT EXISTS tenants ("
      "  id TEXT PRIMARY KEY,"
      "  name TEXT NOT NULL UNIQUE,"
      "  weight BIGINT NOT NULL DEFAULT 1,"
      "  created_ms BIGINT NOT NULL);"
      "CREATE TABLE IF NOT EXISTS tenant_keys ("
      "  id TEXT PRIMARY KEY,"
      "  tenant TEXT NOT NULL,"
      "  hash TEXT NOT NULL UNIQUE,"
      "  prefix TEXT NOT NULL,"
      "  name TEXT NOT NULL DEFAULT '',"
      "  scopes TEXT NOT NULL,"
      "  created_ms BIGINT NOT NULL,"
      "  expires_ms BIGINT NOT NULL DEFAULT 0,"
      "  last_used_ms BIGINT NOT NULL DEFAULT 0);"
      "CREATE INDEX IF NOT EXISTS tenant_keys_by_tenant "
      "  ON tenant_keys(tenant, id);"
      // How a tenant's end users are authenticated (one issuer each).
      "CREATE TABLE IF NOT EXISTS tenant_auth ("
      "  tenant TEXT PRIMARY KEY,"
      "  issuer TEXT NOT NULL UNIQUE,"
      "  audience TEXT NOT NULL DEFAULT '',"
      "  hs256_secret TEXT NOT NULL DEFAULT '',"
      "  jwks TEXT NOT NULL DEFAULT '',"
      "  updated_ms BIGINT NOT NULL);"
      // A tenant's own limits on the model; NULL: the server's default.
      "CREATE TABLE IF NOT EXISTS tenant_limits ("
      "  tenant TEXT PRIMARY KEY,"
      "  requests_per_min BIGINT,"
      "  tokens_per_min BIGINT,"
      "  concurrent_exchanges BIGINT,"
      "  max_queued BIGINT,"
      "  reply_reserve BIGINT);";
  ddl += pg ? "CREATE TABLE IF NOT EXISTS tenant_key_changes ("
              "  seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
              "  key_id TEXT NOT NULL,"
              "  at_ms BIGINT NOT NULL);"
            : "CREATE TABLE IF NOT EXISTS tenant_key_changes ("
              "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
              "  key_id TEXT NOT NULL,"
              "  at_ms BIGINT NOT NULL);";
  if (auto err = db_->exec(ddl))
    return fail(std::move(err));
  if (auto err = run(*db_,
                     "INSERT INTO tenants(id, name, weight, created_ms) "
                     "VALUES (?1, ?1, 1, ?2) ON CONFLICT DO NOTHING;",
                     {sql_value::of(std::string{default_tenant}),
                      sql_value::of(now_ms())}))
    return fail(std::move(err));
  // Readers start from the log's end: what changed before they started is
  // not in their cache.
  auto last = query(*db_, "SELECT max(seq) FROM tenant_key_changes;", {});
  if (!last)
    return fail(last.error());
  if (!last->empty())
    seen_change_ = int_of((*last)[0][0]);
  return db_->commit();
}

// -- limits -------------------------------------------------------------------

rate_limits limit_settings::over(const rate_limits& defaults) const {
  rate_limits out = defaults;
  if (requests_per_min)
    out.requests_per_min = *requests_per_min;
  if (tokens_per_min)
    out.tokens_per_min = *tokens_per_min;
  if (concurrent_exchanges)
    out.concurrent_exchanges = *concurrent_exchanges;
  if (max_queued)
    out.max_queued = *max_queued;
  if (reply_reserve)
    out.reply_reserve = *reply_reserve;
  return out;
}

std::string limit_settings::check() const {
  auto range = [](const std::optional<uint64_t>& v, const char* name,
                  uint64_t lo, uint64_t hi) -> std::string {
    if (v && (*v < lo || *v > hi))
      return std::string{"limits."} + name + " must be between "
             + std::to_string(lo) + " and " + std::to_string(hi);
    return {};
  };
  for (auto problem :
       {range(requests_per_min, "requests_per_min", 0, max_requests_per_min),
        range(tokens_per_min, "tokens_per_min", 0, max_tokens_per_min),
        range(concurrent_exchanges, "concurrent_exchanges", 0,
              max_concurrent_exchanges),
        range(max_queued, "max_queued", 0, max_queued_limit),
        range(reply_reserve, "reply_reserve", 1, max_reply_reserve)})
    if (!problem.empty())
      return problem;
  return {};
}

rate_limits tenant_store::limits_of(std::string_view tenant,
                                    const rate_limits& defaults) const {
  std::shared_lock<std::shared_mutex> guard{limits_mx_};
  if (limits_.empty())
    return defaults;
  auto i = limits_.find(std::string{tenant});
  return i == limits_.end() ? defaults : i->second.over(defaults);
}

uint64_t tenant_store::weight_of(std::string_view tenant) const {
  std::shared_lock<std::shared_mutex> guard{limits_mx_};
  if (weights_.empty())
    return 1;
  auto i = weights_.find(std::string{tenant});
  return i == weights_.end() ? 1 : i->second;
}

void tenant_store::load_limits(const std::string& tenant) {
  caf::expected<sql_rows> rows{sql_rows{}};
  caf::expected<sql_rows> weights{sql_rows{}};
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    weights = tenant.empty()
                ? query(*db_, "SELECT id, weight FROM tenants WHERE weight <> 1;",
                        {})
                : query(*db_, "SELECT id, weight FROM tenants WHERE id = ?1;",
                        {sql_value::of(tenant)});
    rows = tenant.empty()
             ? query(*db_,
                     std::string{"SELECT tenant, "} + limit_columns
                       + " FROM tenant_limits;",
                     {})
             : query(*db_,
                     std::string{"SELECT tenant, "} + limit_columns
                       + " FROM tenant_limits WHERE tenant = ?1;",
                     {sql_value::of(tenant)});
  }
  if (!rows || !weights) {
    spdlog::warn("tenants: cannot read the tenants' limits: {}",
                 describe(!rows ? rows.error() : weights.error()));
    return;
  }
  std::unique_lock<std::shared_mutex> guard{limits_mx_};
  if (!tenant.empty()) {
    limits_.erase(tenant);
    weights_.erase(tenant);
  }
  for (auto& row : *weights)
    if (int_of(row[1]) > 1)
      weights_[text_of(row[0])] = static_cast<uint64_t>(int_of(row[1]));
  for (auto& row : *rows) {
    limit_settings l{limit_of(row[1]), limit_of(row[2]), limit_of(row[3]),
                     limit_of(row[4]), limit_of(row[5])};
    if (!l.empty())
      limits_[text_of(row[0])] = l;
  }
}

caf::error tenant_store::store_limits(const std::string& tenant,
                                      const limit_settings& limits) {
  auto err = limits.empty()
               ? run(*db_, "DELETE FROM tenant_limits WHERE tenant = ?1;",
                     {sql_value::of(tenant)})
               : run(*db_,
                     std::string{"INSERT INTO tenant_limits(tenant, "}
                       + limit_columns
                       + ") VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                         "ON CONFLICT (tenant) DO UPDATE SET "
                         "requests_per_min = ?2, tokens_per_min = ?3, "
                         "concurrent_exchanges = ?4, max_queued = ?5, "
                         "reply_reserve = ?6;",
                     {sql_value::of(tenant),
                      limit_value(limits.requests_per_min),
                      limit_value(limits.tokens_per_min),
                      limit_value(limits.concurrent_exchanges),
                      limit_value(limits.max_queued),
                      limit_value(limits.reply_reserve)});
  if (err)
    return err;
  return log_change(limits_change(tenant));
}

// -- tenants ------------------------------------------------------------------

std::string tenant_store::check_name(std::string_view name) {
  if (name.empty() || name.size() > 64)
    return "name must have 1 to 64 characters";
  if (name.front() == ' ' || name.back() == ' ')
    return "name must not start or end with a space";
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == ' ' || c == '.' || c == '_'
              || c == '-';
    if (!ok)
      return "name may hold only A-Z a-z 0-9, spaces and . _ -";
  }
  return {};
}

caf::expected<tenant_record>
tenant_store::create_tenant(const std::string& name, int64_t weight,
                            const limit_settings& limits) {
  if (auto problem = check_name(name); !problem.empty())
    return make_error(errc::invalid_argument, problem);
  if (weight < 1 || weight > 1000)
    return make_error(errc::invalid_argument,
                      "weight must be between 1 and 1000");
  if (auto problem = limits.check(); !problem.empty())
    return make_error(errc::invalid_argument, problem);
  auto made = create_tenant_row(name, weight, limits);
  if (made) {
    std::unique_lock<std::shared_mutex> guard{limits_mx_};
    if (!limits.empty())
      limits_[made->id] = limits;
    if (weight > 1)
      weights_[made->id] = static_cast<uint64_t>(weight);
  }
  return made;
}

caf::expected<tenant_record>
tenant_store::create_tenant_row(const std::string& name, int64_t weight,
                                const limit_settings& limits) {
  std::lock_guard<std::mutex> guard{db_mx_};
  auto count = query(*db_, "SELECT count(*) FROM tenants;", {});
  if (!count)
    return count.error();
  if (!count->empty()
      && static_cast<size_t>(int_of((*count)[0][0])) >= max_tenants)
    return make_error(errc::too_large, "at most "
                                         + std::to_string(max_tenants)
                                         + " tenants");
  tenant_record t{"t" + random_text(11, alphabet36, 36), name, weight,
                  now_ms(), limits};
  auto done = transact([&]() -> caf::expected<bool> {
    auto err = run(*db_,
                   "INSERT INTO tenants(id, name, weight, created_ms) "
                   "VALUES (?1, ?2, ?3, ?4);",
                   {sql_value::of(t.id), sql_value::of(t.name),
                    sql_value::of(t.weight), sql_value::of(t.created_ms)});
    if (err)
      return unique_violation(err)
               ? make_error(errc::conflict,
                            "a tenant named '" + name + "' exists")
               : err;
    if (!limits.empty())
      if (auto err2 = store_limits(t.id, limits))
        return err2;
    return true;
  });
  if (!done)
    return done.error();
  return t;
}

caf::expected<std::vector<tenant_record>> tenant_store::list_tenants() {
  std::lock_guard<std::mutex> guard{db_mx_};
  auto rows = query(*db_,
                    "SELECT id, name, weight, created_ms FROM tenants "
                    "ORDER BY created_ms, id;",
                    {});
  if (!rows)
    return rows.error();
  std::vector<tenant_record> out;
  std::shared_lock<std::shared_mutex> limits_guard{limits_mx_};
  for (auto& row : *rows) {
    out.push_back(tenant_of_row(row));
    if (auto i = limits_.find(out.back().id); i != limits_.end())
      out.back().limits = i->second;
  }
  return out;
}

caf::expected<std::optional<tenant_record>>
tenant_store::find_tenant(const std::string& id) {
  std::lock_guard<std::mutex> guard{db_mx_};
  auto rows = query(*db_,
                    "SELECT id, name, weight, created_ms FROM tenants "
                    "WHERE id = ?1;",
                    {sql_value::of(id)});
  if (!rows)
    return rows.error();
  if (rows->empty())
    return std::optional<tenant_record>{};
  auto t = tenant_of_row(rows->front());
  std::shared_lock<std::shared_mutex> limits_guard{limits_mx_};
  if (auto i = limits_.find(t.id); i != limits_.end())
    t.limits = i->second;
  return std::optional<tenant_record>{std::move(t)};
}

caf::expected<std::optional<tenant_record>>
tenant_store::update_tenant(const std::string& id,
                            const std::optional<std::string>& name,
                            std::optional<int64_t> weight,
                            const std::optional<limit_settings>& limits) {
  if (name)
    if (auto problem = check_name(*name); !problem.empty())
      return make_error(errc::invalid_argument, problem);
  if (weight && (*weight < 1 || *weight > 1000))
    return make_error(errc::invalid_argument,
                      "weight must be between 1 and 1000");
  if (limits)
    if (auto problem = limits->check(); !problem.empty())
      return make_error(errc::invalid_argument, problem);
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    if (limits) {
      auto found = query(*db_, "SELECT count(*) FROM tenants WHERE id = ?1;",
                         {sql_value::of(id)});
      if (!found)
        return found.error();
      if (found->empty() || int_of((*found)[0][0]) == 0)
        return std::optional<tenant_record>{};
      auto done = transact([&]() -> caf::expected<bool> {
        if (auto err = store_limits(id, *limits))
          return err;
        return true;
      });
      if (!done)
        return done.error();
      std::unique_lock<std::shared_mutex> limits_guard{limits_mx_};
      if (limits->empty())
        limits_.erase(id);
      else
        limits_[id] = *limits;
    }
    if (name) {
      auto err = run(*db_, "UPDATE tenants SET name = ?2 WHERE id = ?1;",
                     {sql_value::of(id), sql_value::of(*name)});
      if (err)
        return unique_violation(err)
                 ? make_error(errc::conflict,
                              "a tenant named '" + *name + "' exists")
                 : err;
    }
    if (weight) {
      // Every node's fair queue reads it: through the log of changes.
      auto done = transact([&]() -> caf::expected<bool> {
        if (auto err = run(*db_,
                           "UPDATE tenants SET weight = ?2 WHERE id = ?1;",
                           {sql_value::of(id), sql_value::of(*weight)}))
          return err;
        if (auto err = log_change(limits_change(id)))
          return err;
        return true;
      });
      if (!done)
        return done.error();
      std::unique_lock<std::shared_mutex> limits_guard{limits_mx_};
      if (*weight > 1)
        weights_[id] = static_cast<uint64_t>(*weight);
      else
        weights_.erase(id);
    }
  }
  return find_tenant(id);
}

caf::expected<uint64_t> tenant_store::drop_keys(const std::string& tenant,
                                                bool with_tenant,
                                                bool& tenant_found) {
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    auto rows = query(*db_, "SELECT id FROM tenant_keys WHERE tenant = ?1;",
                      {sql_value::of(tenant)});
    if (!rows)
      return rows.error();
    for (auto& row : *rows)
      keys.push_back(text_of(row[0]));
    auto done = transact([&]() -> caf::expected<bool> {
      for (auto& k : keys)
        if (auto err = log_change(k))
          return err;
      if (auto err = run(*db_, "DELETE FROM tenant_keys WHERE tenant = ?1;",
                         {sql_value::of(tenant)}))
        return err;
      // Its end users' tokens stop too.
      if (auto err = run(*db_, "DELETE FROM tenant_auth WHERE tenant = ?1;",
                         {sql_value::of(tenant)}))
        return err;
      if (db_->changes() > 0)
        if (auto err = log_change(auth_change(tenant)))
          return err;
      if (with_tenant) {
        if (auto err = run(*db_, "DELETE FROM tenants WHERE id = ?1;",
                           {sql_value::of(tenant)}))
          return err;
        tenant_found = db_->changes() > 0;
        if (auto err = store_limits(tenant, limit_settings{}))
          return err;
      }
      return true;
    });
    if (!done)
      return done.error();
  }
  for (auto& k : keys)
    evict(k);
  evict(auth_change(tenant));
  if (with_tenant) {
    std::unique_lock<std::shared_mutex> limits_guard{limits_mx_};
    limits_.erase(tenant);
    weights_.erase(tenant);
  }
  return static_cast<uint64_t>(keys.size());
}

caf::expected<uint64_t> tenant_store::revoke_keys(const std::string& tenant) {
  bool unused = false;
  return drop_keys(tenant, false, unused);
}

caf::expected<bool> tenant_store::delete_tenant(const std::string& id) {
  if (id == default_tenant)
    return make_error(errc::invalid_argument,
                      "the default tenant cannot be deleted");
  bool found = false;
  if (auto dropped = drop_keys(id, true, found); !dropped)
    return dropped.error();
  return found;
}

// -- keys ---------------------------------------------------------------------

caf::expected<created_key>
tenant_store::create_key(const std::string& tenant, const std::string& name,
                         scope_set scopes, int64_t expires_in_s) {
  std::lock_guard<std::mutex> guard{db_mx_};
  auto found = query(*db_,
                     "SELECT (SELECT count(*) FROM tenants WHERE id = ?1), "
                     "(SELECT count(*) FROM tenant_keys WHERE tenant = ?1);",
                     {sql_value::of(tenant)});
  if (!found)
    return found.error();
  if (found->empty() || int_of((*found)[0][0]) == 0)
    return make_error(errc::not_found, "no tenant '" + tenant + "'");
  if (static_cast<size_t>(int_of((*found)[0][1])) >= max_keys_per_tenant)
    return make_error(errc::too_large,
                      "a tenant holds at most "
                        + std::to_string(max_keys_per_tenant)
                        + " keys; revoke one first");
  created_key out;
  out.secret = key_marker + random_text(key_secret_chars, alphabet62, 62);
  auto& k = out.record;
  k.id = "key_" + random_text(16, alphabet36, 36);
  k.tenant = tenant;
  k.prefix = out.secret.substr(0, key_prefix_chars);
  k.name = name;
  k.scopes = scopes;
  k.created_ms = now_ms();
  k.expires_ms = expires_in_s > 0 ? k.created_ms + expires_in_s * 1000 : 0;
  auto err = run(*db_,
                 "INSERT INTO tenant_keys(id, tenant, hash, prefix, name, "
                 "scopes, created_ms, expires_ms) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);",
                 {sql_value::of(k.id), sql_value::of(k.tenant),
                  sql_value::of(hex_of(hash_of(out.secret))),
                  sql_value::of(k.prefix),
                  sql_value::of(k.name), sql_value::of(scopes_text(k.scopes)),
                  sql_value::of(k.created_ms), sql_value::of(k.expires_ms)});
  if (err)
    return err;
  return out;
}

caf::expected<std::vector<key_record>>
tenant_store::list_keys(const std::string& tenant) {
  std::vector<key_record> out;
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    auto rows = query(*db_,
                      std::string{"SELECT "} + key_columns
                        + " FROM tenant_keys WHERE tenant = ?1 "
                          "ORDER BY created_ms, id;",
                      {sql_value::of(tenant)});
    if (!rows)
      return rows.error();
    for (auto& row : *rows)
      out.push_back(key_of_row(row));
  }
  // Uses seen here and not written back yet.
  std::shared_lock<std::shared_mutex> guard{cache_mx_};
  for (auto& [hash, c] : cache_)
    for (auto& k : out)
      if (k.id == c->record.id)
        k.last_used_ms = std::max(k.last_used_ms,
                                  c->used_ms.load() / 60000 * 60000);
  return out;
}

caf::expected<bool> tenant_store::revoke_key(const std::string& key_id,
                                             const std::string& tenant) {
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    auto done = transact([&]() -> caf::expected<bool> {
      auto deleted
        = tenant.empty()
            ? run(*db_, "DELETE FROM tenant_keys WHERE id = ?1;",
                  {sql_value::of(key_id)})
            : run(*db_,
                  "DELETE FROM tenant_keys WHERE id = ?1 AND tenant = ?2;",
                  {sql_value::of(key_id), sql_value::of(tenant)});
      if (deleted)
        return deleted;
      if (db_->changes() == 0)
        return false;
      if (auto err = log_change(key_id))
        return err;
      return true;
    });
    if (!done || !*done)
      return done;
  }
  evict(key_id);
  return true;
}

caf::expected<bool>
tenant_store::transact(const std::function<caf::expected<bool>()>& body) {
  if (auto err = db_->begin())
    return err;
  auto done = body();
  if (!done || !*done) {
    db_->rollback();
    return done;
  }
  if (auto err = db_->commit())
    return err;
  return true;
}

caf::error tenant_store::log_change(const std::string& key_id) {
  return run(*db_,
             "INSERT INTO tenant_key_changes(key_id, at_ms) VALUES (?1, ?2);",
             {sql_value::of(key_id), sql_value::of(now_ms())});
}

void tenant_store::evict(const std::string& key_id) {
  std::unique_lock<std::shared_mutex> guard{cache_mx_};
  evictions_.fetch_add(1);
  if (key_id.compare(0, auth_marker.size(), auth_marker) == 0) {
    auto tenant = key_id.substr(auth_marker.size());
    for (auto i = issuers_.begin(); i != issuers_.end();) {
      if (i->second->tenant != tenant) {
        ++i;
        continue;
      }
      i->second->dropped.store(true);
      i = issuers_.erase(i);
    }
    // An issuer registered now is no longer unknown.
    unknown_issuers_.clear();
    return;
  }
  for (auto i = cache_.begin(); i != cache_.end();)
    i = i->second->record.id == key_id ? cache_.erase(i) : std::next(i);
}

// -- authentication -----------------------------------------------------------

bool tenant_store::looks_like_key(std::string_view secret) noexcept {
  static constexpr std::string_view marker = key_marker;
  if (secret.size() != marker.size() + key_secret_chars
      || secret.substr(0, marker.size()) != marker)
    return false;
  // Letters and digits: one table look-up a byte, OR-ed, not branched on.
  static constexpr auto alnum = [] {
    std::array<unsigned char, 256> t{};
    for (auto& v : t)
      v = 1;
    for (int c = 'a'; c <= 'z'; ++c)
      t[static_cast<size_t>(c)] = 0;
    for (int c = 'A'; c <= 'Z'; ++c)
      t[static_cast<size_t>(c)] = 0;
    for (int c = '0'; c <= '9'; ++c)
      t[static_cast<size_t>(c)] = 0;
    return t;
  }();
  unsigned char bad = 0;
  for (char c : secret.substr(marker.size()))
    bad |= alnum[static_cast<unsigned char>(c)];
  return bad == 0;
}

sha256_digest tenant_store::hash_of(std::string_view secret) {
  return sha256(secret);
}

key_check tenant_store::check(const key_record& k) {
  if (k.expires_ms != 0 && now_ms() >= k.expires_ms)
    return key_check::expired;
  return key_check::valid;
}

std::shared_ptr<const principal>
tenant_store::cached_principal(std::string_view secret) {
  if (!looks_like_key(secret)
      || steady_ms() - refreshed_at_.load(std::memory_order_relaxed)
           > stale_after_ms)
    return nullptr;
  auto hash = cache_key_of(secret);
  std::shared_lock<std::shared_mutex> guard{cache_mx_};
  auto i = cache_.find(hash);
  if (i == cache_.end())
    return nullptr;
  auto& c = *i->second;
  auto now = now_ms();
  if (c.record.expires_ms != 0 && now >= c.record.expires_ms)
    return nullptr;
  hits_.fetch_add(1, std::memory_order_relaxed);
  c.used_ms.store(now, std::memory_order_relaxed);
  return c.who;
}

std::optional<key_check> tenant_store::cached(std::string_view secret,
                                              key_record& out) {
  if (!looks_like_key(secret))
    return key_check::unknown;
  if (steady_ms() - refreshed_at_.load(std::memory_order_relaxed)
      > stale_after_ms)
    return std::nullopt;
  auto hash = cache_key_of(secret);
  std::shared_lock<std::shared_mutex> guard{cache_mx_};
  if (auto i = cache_.find(hash); i != cache_.end()) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    i->second->used_ms.store(now_ms(), std::memory_order_relaxed);
    out = i->second->record;
    return check(out);
  }
  if (auto i = unknown_.find(hash);
      i != unknown_.end()
      && std::chrono::steady_clock::now() - i->second < unknown_for)
    return key_check::unknown;
  return std::nullopt;
}

caf::expected<key_check> tenant_store::authenticate(std::string_view secret,
                                                    key_record& out) {
  if (!looks_like_key(secret))
    return key_check::unknown;
  if (auto known = cached(secret, out))
    return *known;
  misses_.fetch_add(1, std::memory_order_relaxed);
  auto hash = cache_key_of(secret);
  auto evictions = evictions_.load();
  caf::expected<sql_rows> rows{sql_rows{}};
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    rows = query(*db_,
                 std::string{"SELECT "} + key_columns
                   + " FROM tenant_keys WHERE hash = ?1;",
                 {sql_value::of(hex_of(hash_of(secret)))});
  }
  if (!rows)
    return rows.error();
  std::unique_lock<std::shared_mutex> guard{cache_mx_};
  if (rows->empty()) {
    if (unknown_.size() >= max_unknown)
      unknown_.clear();
    unknown_[hash] = std::chrono::steady_clock::now();
    return key_check::unknown;
  }
  auto entry = std::make_shared<cached_key>();
  entry->record = key_of_row(rows->front());
  auto who = std::make_shared<principal>();
  who->who = principal::kind::key;
  who->set_tenant(entry->record.tenant);
  who->scopes = entry->record.scopes;
  who->key_id = entry->record.id;
  entry->who = std::move(who);
  entry->stored_used_ms = entry->record.last_used_ms;
  entry->used_ms.store(now_ms());
  out = entry->record;
  if (evictions == evictions_.load())
    cache_[hash] = std::move(entry);
  return check(out);
}

// -- end users ----------------------------------------------------------------

caf::expected<auth_record> tenant_store::set_auth(const std::string& tenant,
                                                  issuer_keys keys) {
  if (tenant == default_tenant)
    return make_error(errc::invalid_argument,
                      "the default tenant has no end users: its IDs are not "
                      "qualified; create a tenant for them");
  if (keys.issuer.size() > max_issuer_bytes)
    return make_error(errc::invalid_argument,
                      "issuer has more than "
                        + std::to_string(max_issuer_bytes) + " bytes");
  if (keys.jwks.size() > max_jwks_bytes)
    return make_error(errc::invalid_argument,
                      "jwks has more than " + std::to_string(max_jwks_bytes)
                        + " bytes");
  // Checked and compiled before it is stored: what is stored works.
  auto verifier = jwt_verifier::make(keys);
  if (!verifier)
    return verifier.error();
  auth_record out{tenant, std::move(keys), now_ms()};
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    bool missing = false;
    auto done = transact([&]() -> caf::expected<bool> {
      auto found = query(*db_, "SELECT count(*) FROM tenants WHERE id = ?1;",
                         {sql_value::of(tenant)});
      if (!found)
        return found.error();
      if (found->empty() || int_of((*found)[0][0]) == 0) {
        missing = true;
        return false;
      }
      auto err = run(*db_,
                     "INSERT INTO tenant_auth(tenant, issuer, audience, "
                     "hs256_secret, jwks, updated_ms) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
                     "ON CONFLICT (tenant) DO UPDATE SET issuer = ?2, "
                     "audience = ?3, hs256_secret = ?4, jwks = ?5, "
                     "updated_ms = ?6;",
                     {sql_value::of(tenant), sql_value::of(out.keys.issuer),
                      sql_value::of(out.keys.audience),
                      sql_value::of(out.keys.hs256_secret),
                      sql_value::of(out.keys.jwks),
                      sql_value::of(out.updated_ms)});
      if (err)
        return unique_violation(err)
                 ? make_error(errc::conflict,
                              "another tenant's end users have the issuer '"
                                + out.keys.issuer + "'")
                 : err;
      if (auto logged = log_change(auth_change(tenant)))
        return logged;
      return true;
    });
    if (!done)
      return done.error();
    if (missing)
      return make_error(errc::not_found, "no tenant '" + tenant + "'");
  }
  evict(auth_change(tenant));
  return out;
}

caf::expected<std::optional<auth_record>>
tenant_store::get_auth(const std::string& tenant) {
  std::lock_guard<std::mutex> guard{db_mx_};
  auto rows = query(*db_,
                    "SELECT issuer, audience, hs256_secret, jwks, updated_ms "
                    "FROM tenant_auth WHERE tenant = ?1;",
                    {sql_value::of(tenant)});
  if (!rows)
    return rows.error();
  if (rows->empty())
    return std::optional<auth_record>{};
  auto& row = rows->front();
  auth_record out;
  out.tenant = tenant;
  out.keys.issuer = text_of(row[0]);
  out.keys.audience = text_of(row[1]);
  out.keys.hs256_secret = text_of(row[2]);
  out.keys.jwks = text_of(row[3]);
  out.updated_ms = int_of(row[4]);
  return std::optional<auth_record>{std::move(out)};
}

caf::expected<bool> tenant_store::clear_auth(const std::string& tenant) {
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    auto done = transact([&]() -> caf::expected<bool> {
      if (auto err = run(*db_, "DELETE FROM tenant_auth WHERE tenant = ?1;",
                         {sql_value::of(tenant)}))
        return err;
      if (db_->changes() == 0)
        return false;
      if (auto err = log_change(auth_change(tenant)))
        return err;
      return true;
    });
    if (!done || !*done)
      return done;
  }
  evict(auth_change(tenant));
  return true;
}

caf::expected<std::shared_ptr<const principal>>
tenant_store::end_user(std::string_view token, bool may_block,
                       bool& needs_store) {
  // Called on the HTTP layer's loops: nothing a token holds may throw out
  // of here.
  try {
    return end_user_of(token, may_block, needs_store);
  } catch (const std::exception& e) {
    needs_store = false;
    return make_error(errc::invalid_argument,
                      std::string{"the token is refused: it cannot be read "
                                  "("}
                        + e.what() + ")");
  }
}

caf::expected<std::shared_ptr<const principal>>
tenant_store::end_user_of(std::string_view token, bool may_block,
                          bool& needs_store) {
  needs_store = false;
  auto refused = [](std::string why) {
    return make_error(errc::invalid_argument, std::move(why));
  };
  if (token.size() > max_jwt_bytes)
    return refused("the token is refused: it has more than "
                   + std::to_string(max_jwt_bytes) + " bytes");
  bool fresh = steady_ms() - refreshed_at_.load(std::memory_order_relaxed)
               <= stale_after_ms;
  auto now = now_ms();
  auto token_key = verified_key_of(token);
  // The common case: a token verified before, by settings still in use.
  // Another token that ends as a verified one does (a signature taken
  // from one and put under other claims) finds its entry and differs:
  // it is verified in full.
  if (fresh) {
    std::shared_lock<std::shared_mutex> guard{verified_mx_};
    if (auto i = verified_.find(token_key);
        i != verified_.end() && same_bytes(i->second.token, token)
        && !i->second.issuer->dropped.load()
        && now / 1000 < i->second.expires + jwt_leeway_s) {
      jwt_hits_.fetch_add(1, std::memory_order_relaxed);
      return i->second.who;
    }
  }
  auto issuer = jwt_issuer(token);
  if (!issuer)
    return refused("the token is refused: it is no key, and no JWT with "
                   "an issuer (iss)");
  auto shown = issuer->substr(0, 64);
  std::shared_ptr<issuer_entry> entry;
  if (fresh) {
    std::shared_lock<std::shared_mutex> guard{cache_mx_};
    if (auto i = issuers_.find(*issuer); i != issuers_.end())
      entry = i->second;
    else if (auto u = unknown_issuers_.find(*issuer);
             u != unknown_issuers_.end()
             && std::chrono::steady_clock::now() - u->second < unknown_for)
      return refused("the token is refused: no tenant accepts tokens of the "
                     "issuer '" + shown + "'");
  }
  if (!entry) {
    if (!may_block) {
      needs_store = true;
      return std::shared_ptr<const principal>{};
    }
    auto evictions = evictions_.load();
    caf::expected<sql_rows> rows{sql_rows{}};
    {
      std::lock_guard<std::mutex> guard{db_mx_};
      rows = query(*db_,
                   "SELECT tenant, audience, hs256_secret, jwks "
                   "FROM tenant_auth WHERE issuer = ?1;",
                   {sql_value::of(*issuer)});
    }
    if (!rows)
      return rows.error();
    std::unique_lock<std::shared_mutex> guard{cache_mx_};
    if (rows->empty()) {
      if (unknown_issuers_.size() >= max_unknown)
        unknown_issuers_.clear();
      unknown_issuers_[*issuer] = std::chrono::steady_clock::now();
      return refused("the token is refused: no tenant accepts tokens of the "
                     "issuer '" + shown + "'");
    }
    auto& row = rows->front();
    issuer_keys keys{*issuer, text_of(row[1]), text_of(row[2]),
                     text_of(row[3])};
    auto verifier = jwt_verifier::make(std::move(keys));
    if (!verifier)
      return refused("the token is refused: its issuer's settings no "
                     "longer work: "
                     + describe(verifier.error()));
    entry = std::make_shared<issuer_entry>();
    entry->tenant = text_of(row[0]);
    entry->verifier = std::move(*verifier);
    if (evictions == evictions_.load())
      issuers_[*issuer] = entry;
  }
  jwt_verified_.fetch_add(1, std::memory_order_relaxed);
  auto claims = entry->verifier->verify(token, now / 1000);
  if (!claims)
    return claims.error();
  auto who = std::make_shared<principal>();
  who->who = principal::kind::end_user;
  who->set_tenant(entry->tenant);
  who->user = claims->subject;
  who->thread_prefix = who->prefix + claims->subject + tenant_separator;
  who->scopes = bit(scope::threads_read) | bit(scope::threads_write)
                | bit(scope::memories_read) | bit(scope::memories_write);
  std::shared_ptr<const principal> out = std::move(who);
  std::unique_lock<std::shared_mutex> guard{verified_mx_};
  if (verified_.size() >= max_verified_tokens)
    verified_.clear();
  verified_[token_key] =
    verified_token{std::string{token}, out, claims->expires, entry};
  return out;
}

void tenant_store::refresher() {
  int64_t last_flush = steady_ms();
  for (;;) {
    {
      std::unique_lock<std::mutex> guard{stop_mx_};
      if (stop_cv_.wait_for(guard, refresh, [this] { return stopping_; }))
        return;
    }
    refresh_once();
    // Last uses, to the minute, once a minute.
    if (steady_ms() - last_flush < 60000)
      continue;
    last_flush = steady_ms();
    std::vector<std::pair<std::string, int64_t>> used;
    {
      std::shared_lock<std::shared_mutex> guard{cache_mx_};
      for (auto& [hash, c] : cache_) {
        auto at = c->used_ms.load() / 60000 * 60000;
        if (at > c->stored_used_ms) {
          c->stored_used_ms = at;
          used.emplace_back(c->record.id, at);
        }
      }
    }
    std::lock_guard<std::mutex> guard{db_mx_};
    // One transaction for all of them: one commit (one fsync) a minute,
    // not one per key in use.
    if (!used.empty()) {
      auto noted = transact([&]() -> caf::expected<bool> {
        for (auto& [id, at] : used)
          if (auto err = run(*db_,
                             "UPDATE tenant_keys SET last_used_ms = ?2 "
                             "WHERE id = ?1 AND last_used_ms < ?2;",
                             {sql_value::of(id), sql_value::of(at)}))
            return err;
        return true;
      });
      if (!noted)
        spdlog::warn("tenants: cannot note when {} keys were used: {}",
                     used.size(), describe(noted.error()));
    }
    if (auto err = run(*db_, "DELETE FROM tenant_key_changes WHERE at_ms < ?1;",
                       {sql_value::of(now_ms() - change_retention_ms)}))
      spdlog::warn("tenants: cannot prune the log of key changes: {}",
                   describe(err));
  }
}

void tenant_store::refresh_once() {
  std::vector<std::string> changed;
  {
    std::lock_guard<std::mutex> guard{db_mx_};
    auto rows = query(*db_,
                      "SELECT seq, key_id FROM tenant_key_changes "
                      "WHERE seq > ?1 ORDER BY seq;",
                      {sql_value::of(seen_change_)});
    if (!rows) {
      spdlog::warn("tenants: cannot read the log of key changes: {}",
                   describe(rows.error()));
      return;
    }
    for (auto& row : *rows) {
      seen_change_ = std::max(seen_change_, int_of(row[0]));
      changed.push_back(text_of(row[1]));
    }
  }
  for (auto& id : changed) {
    if (id.compare(0, limits_marker.size(), limits_marker) == 0)
      load_limits(id.substr(limits_marker.size()));
    else
      evict(id);
  }
  refreshed_at_.store(steady_ms(), std::memory_order_relaxed);
}

} // namespace spindle::tenancy
