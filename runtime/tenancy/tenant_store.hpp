#pragma once

// Tenants and their keys (docs/tenants.md): kept in `tenants.db` in the
// data directory, in PostgreSQL with a `--store`, or in memory with
// `--data :memory:`. A key's secret is never stored: only its SHA-256,
// and a prefix of 12 characters to tell keys apart in listings.
//
// Authentication is answered from a cache of the keys in use. A change of
// a key (a revocation, a deleted tenant) is written to a log of changes
// beside the keys; every process reads that log every `refresh` and drops
// what changed from its cache, so a revocation reaches every node of a
// cluster within that bound, and the node that revoked it at once.
// Thread-safe.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/expected.hpp>

#include "core/digest.hpp"
#include "spindle/runtime/limits.hpp"
#include "spindle/runtime/storage.hpp"
#include "tenancy/jwt.hpp"
#include "tenancy/principal.hpp"
#include "tenancy/scopes.hpp"

namespace spindle {

class sql_connection;

namespace tenancy {

/// The largest values a tenant's limits take.
inline constexpr uint64_t max_requests_per_min = 1000000000;
inline constexpr uint64_t max_tokens_per_min = 1000000000000;
inline constexpr uint64_t max_concurrent_exchanges = 100000;
inline constexpr uint64_t max_queued_limit = 100000;
inline constexpr uint64_t max_reply_reserve = 10000000;

/// A tenant's own limits on the model (docs/limits.md): a field without
/// a value takes the server's default (`spindle serve --requests-per-min`
/// and the others); 0 is no limit of that kind.
struct limit_settings {
  std::optional<uint64_t> requests_per_min;
  std::optional<uint64_t> tokens_per_min;
  std::optional<uint64_t> concurrent_exchanges;
  std::optional<uint64_t> max_queued;
  std::optional<uint64_t> reply_reserve;

  /// The limits in force: these over `defaults`.
  rate_limits over(const rate_limits& defaults) const;
  bool empty() const noexcept {
    return !requests_per_min && !tokens_per_min && !concurrent_exchanges
           && !max_queued && !reply_reserve;
  }
  /// An error message when a value is out of its range, else empty.
  std::string check() const;
};

struct tenant_record {
  std::string id;
  std::string name;
  /// Its share of the model when the upstream is contended (1 to 1000).
  int64_t weight = 1;
  int64_t created_ms = 0;
  limit_settings limits;
};

struct key_record {
  std::string id;
  std::string tenant;
  /// The secret's first 12 characters ("spk_" and 8 more).
  std::string prefix;
  std::string name;
  scope_set scopes = default_scopes;
  int64_t created_ms = 0;
  /// 0: never expires.
  int64_t expires_ms = 0;
  /// The last request it authenticated, to the minute; 0: never used.
  int64_t last_used_ms = 0;
};

/// A key as created: the record and its secret, which is shown once.
struct created_key {
  key_record record;
  std::string secret;
};

/// How a tenant's end users are authenticated (docs/tenants.md, "End
/// users"). `keys.hs256_secret` is never shown.
struct auth_record {
  std::string tenant;
  issuer_keys keys;
  int64_t updated_ms = 0;
};

/// What a presented secret came to.
enum class key_check : uint8_t { valid, unknown, expired };

class tenant_store {
public:
  /// The longest a revocation takes to reach another process.
  static constexpr std::chrono::milliseconds refresh{500};
  /// Keys a tenant may hold.
  static constexpr size_t max_keys_per_tenant = 1000;
  /// Tenants there may be.
  static constexpr size_t max_tenants = 100000;

  /// Opens the store of `storage` (creating its tables) and starts the
  /// refresher. Ensures the default tenant exists.
  static caf::expected<std::unique_ptr<tenant_store>>
  open(const storage_options& storage);

  ~tenant_store();
  tenant_store(const tenant_store&) = delete;
  tenant_store& operator=(const tenant_store&) = delete;

  // -- tenants ----------------------------------------------------------------

  /// An error message if `name` is no tenant name (1 to 64 characters of
  /// A-Z a-z 0-9, space, . _ -; no space first or last), else empty.
  static std::string check_name(std::string_view name);

  /// Errors: invalid_argument, conflict (the name is taken),
  /// too_large (max_tenants), storage_failure.
  caf::expected<tenant_record> create_tenant(const std::string& name,
                                             int64_t weight,
                                             const limit_settings& limits = {});
  caf::expected<std::vector<tenant_record>> list_tenants();
  caf::expected<std::optional<tenant_record>>
  find_tenant(const std::string& id);
  /// Changes the name and/or the weight; nullopt when there is no such
  /// tenant. Errors as for `create_tenant`.
  caf::expected<std::optional<tenant_record>>
  update_tenant(const std::string& id, const std::optional<std::string>& name,
                std::optional<int64_t> weight,
                const std::optional<limit_settings>& limits = std::nullopt);
  /// The limits in force for `tenant`: its own over `defaults`, from
  /// memory (every process reloads a tenant's limits within `refresh` of
  /// a change). Thread-safe and quick: called for every call to the model.
  rate_limits limits_of(std::string_view tenant,
                        const rate_limits& defaults) const;
  /// The tenant's weight toward the upstream (1 for one unknown), from
  /// memory as `limits_of`.
  uint64_t weight_of(std::string_view tenant) const;
  /// Revokes every key of `tenant` (at once here, within `refresh`
  /// elsewhere); returns how many. Errors: storage_failure.
  caf::expected<uint64_t> revoke_keys(const std::string& tenant);
  /// Removes the tenant and its keys (revoked at once here, within
  /// `refresh` elsewhere); false when there is no such tenant. The
  /// default tenant cannot be removed (invalid_argument).
  caf::expected<bool> delete_tenant(const std::string& id);

  // -- keys -------------------------------------------------------------------

  /// A new key of `tenant`; `expires_in_s` 0: never expires. Errors:
  /// not_found (no such tenant), too_large (max_keys_per_tenant),
  /// storage_failure.
  caf::expected<created_key> create_key(const std::string& tenant,
                                        const std::string& name,
                                        scope_set scopes,
                                        int64_t expires_in_s);
  caf::expected<std::vector<key_record>> list_keys(const std::string& tenant);
  /// Revokes `key_id` (of `tenant`, unless empty); false when there is no
  /// such key (of that tenant).
  caf::expected<bool> revoke_key(const std::string& key_id,
                                 const std::string& tenant = {});

  // -- authentication -----------------------------------------------------------

  /// Whether `secret` has the form of a key ("spk_" and 40 of [A-Za-z0-9]).
  static bool looks_like_key(std::string_view secret) noexcept;

  /// The key of `secret` from the cache, without touching the database:
  /// nullopt when the cache cannot tell (not cached, or the refresher has
  /// not run for too long); then call `authenticate`.
  std::optional<key_check> cached(std::string_view secret, key_record& out);

  /// The principal of `secret` when it is a valid key in the cache (made
  /// once per key, shared by its requests): the fast path, without the
  /// database and without an allocation; null when the cache cannot say
  /// (then `cached` and `authenticate`).
  std::shared_ptr<const principal> cached_principal(std::string_view secret);

  /// The key of `secret`, reading the database when it is not cached.
  /// Errors: storage_failure.
  caf::expected<key_check> authenticate(std::string_view secret,
                                        key_record& out);

  // -- end users ----------------------------------------------------------------

  /// Registers, or replaces, how `tenant`'s end users are authenticated:
  /// at once here, within `refresh` elsewhere. Errors: invalid_argument
  /// (the settings, naming what is wrong; the default tenant, whose IDs
  /// are not qualified), not_found (no such tenant), conflict (another
  /// tenant holds the issuer), storage_failure.
  caf::expected<auth_record> set_auth(const std::string& tenant,
                                      issuer_keys keys);
  caf::expected<std::optional<auth_record>>
  get_auth(const std::string& tenant);
  /// Stops accepting `tenant`'s end users' tokens; false when it had no
  /// settings.
  caf::expected<bool> clear_auth(const std::string& tenant);

  /// The principal of an end user's `token` (a JWT), made once per token
  /// and kept until it expires. With `may_block` false it never reads the
  /// database: when it would have to, it sets `needs_store` and returns
  /// null. Errors: invalid_argument (the token is refused, with the
  /// reason), storage_failure.
  caf::expected<std::shared_ptr<const principal>>
  end_user(std::string_view token, bool may_block, bool& needs_store);

  /// Tokens verified (signature checked) and answered from the cache.
  uint64_t jwt_verifications() const noexcept {
    return jwt_verified_.load(std::memory_order_relaxed);
  }
  uint64_t jwt_cache_hits() const noexcept {
    return jwt_hits_.load(std::memory_order_relaxed);
  }

  /// Keys authenticated from the cache and from the database, for metrics.
  uint64_t cache_hits() const noexcept {
    return hits_.load(std::memory_order_relaxed);
  }
  uint64_t cache_misses() const noexcept {
    return misses_.load(std::memory_order_relaxed);
  }

private:
  struct cached_key {
    key_record record;
    std::shared_ptr<const principal> who;
    /// Last use seen here (ms), written back at most once a minute.
    std::atomic<int64_t> used_ms{0};
    int64_t stored_used_ms = 0;
  };

  /// A tenant's end-user settings in use.
  struct issuer_entry {
    std::string tenant;
    std::shared_ptr<const jwt_verifier> verifier;
    /// Set when the settings changed or went: tokens it verified no
    /// longer count.
    std::atomic<bool> dropped{false};
  };
  /// A token verified: the token, its principal, when it expires (s),
  /// and by whose settings.
  struct verified_token {
    std::string token;
    std::shared_ptr<const principal> who;
    int64_t expires = 0;
    std::shared_ptr<const issuer_entry> issuer;
  };

  explicit tenant_store(std::unique_ptr<sql_connection> db);

  caf::expected<std::shared_ptr<const principal>>
  end_user_of(std::string_view token, bool may_block, bool& needs_store);

  caf::error create_schema();
  caf::expected<tenant_record> create_tenant_row(const std::string& name,
                                                 int64_t weight,
                                                 const limit_settings& limits);
  /// Revokes every key of `tenant` and, `with_tenant`, removes the tenant
  /// in the same transaction (`tenant_found` says whether it was there).
  caf::expected<uint64_t> drop_keys(const std::string& tenant,
                                    bool with_tenant, bool& tenant_found);
  void refresher();
  void refresh_once();
  /// Reads `tenant`'s limits (all tenants' when empty) into `limits_`.
  void load_limits(const std::string& tenant);
  /// Writes `tenant`'s limits (`db_mx_` held, in a transaction).
  caf::error store_limits(const std::string& tenant,
                          const limit_settings& limits);
  /// Drops `key_id` from the cache ("auth:TENANT": that tenant's end-user
  /// settings).
  void evict(const std::string& key_id);
  caf::error log_change(const std::string& key_id);
  /// Runs `body` in a transaction (`db_mx_` held): committed when it
  /// returns true, rolled back when it returns false or an error.
  caf::expected<bool>
  transact(const std::function<caf::expected<bool>()>& body);
  /// A secret's SHA-256: in hexadecimal the stored `hash`.
  static sha256_digest hash_of(std::string_view secret);
  /// A secret's key in the caches: SipHash-2-4-128 under this process's
  /// random key, a tenth of SHA-256's cost; no secret is held in memory.
  siphash_digest cache_key_of(std::string_view secret) const noexcept {
    return siphash128(cache_hash_key_, secret);
  }
  /// A token's key in the cache of verified tokens: SipHash-2-4-128 of
  /// its last 32 bytes (the end of its signature, which no two verified
  /// tokens share), so that a lookup hashes a fixed few bytes however
  /// long the token; an entry holds the whole token, compared in full.
  siphash_digest verified_key_of(std::string_view token) const noexcept {
    constexpr size_t tail = 32;
    return siphash128(cache_hash_key_, token.size() > tail
                                         ? token.substr(token.size() - tail)
                                         : token);
  }
  static key_check check(const key_record& k);

  std::mutex db_mx_;
  std::unique_ptr<sql_connection> db_;
  int64_t seen_change_ = 0;

  /// The key of cache_key_of, drawn when the store opens.
  const siphash_key cache_hash_key_ = random_siphash_key();
  mutable std::shared_mutex cache_mx_;
  /// By the secret's cache key.
  std::unordered_map<siphash_digest, std::shared_ptr<cached_key>,
                     siphash_digest_hash>
    cache_;
  /// Cache keys of secrets found to be no key, with when.
  std::unordered_map<siphash_digest, std::chrono::steady_clock::time_point,
                     siphash_digest_hash>
    unknown_;
  /// End users' issuers by `iss`.
  std::unordered_map<std::string, std::shared_ptr<issuer_entry>> issuers_;
  /// Issuers found to be no tenant's, with when.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point>
    unknown_issuers_;
  /// Each tenant's own limits (those with any).
  mutable std::shared_mutex limits_mx_;
  std::unordered_map<std::string, limit_settings> limits_;
  /// Each tenant's weight, but those of weight 1.
  std::unordered_map<std::string, uint64_t> weights_;
  /// Tokens verified, by verified_key_of.
  mutable std::shared_mutex verified_mx_;
  std::unordered_map<siphash_digest, verified_token, siphash_digest_hash>
    verified_;
  std::atomic<uint64_t> jwt_verified_{0};
  std::atomic<uint64_t> jwt_hits_{0};
  /// When the refresher last read the log of changes.
  std::atomic<int64_t> refreshed_at_{0};

  /// Rises at every eviction: an answer read from the database before an
  /// eviction is used once, not cached.
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};

  std::mutex stop_mx_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread refresher_;
};

} // namespace tenancy
} // namespace spindle
