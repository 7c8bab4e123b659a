#pragma once

// JSON Web Tokens of a tenant's end users (docs/tenants.md, "End users"):
// verified with OpenSSL directly, HS256 with a shared secret, RS256 and
// ES256 (P-256) with the public keys of a JWK Set. `alg: none` and every
// other algorithm are refused, and an algorithm is accepted only with a key
// of its own kind, so a token cannot pick how it is checked.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <caf/expected.hpp>

namespace spindle::tenancy {

/// How a tenant's end users' tokens are checked.
struct issuer_keys {
  /// The `iss` every token must carry.
  std::string issuer;
  /// When set, `aud` must be it or hold it.
  std::string audience;
  /// HS256's shared secret (at least 32 bytes), or empty.
  std::string hs256_secret;
  /// A JWK Set (JSON text) of RSA and P-256 public keys, or empty.
  std::string jwks;
};

/// What a verified token says.
struct jwt_claims {
  std::string issuer;
  /// The end user.
  std::string subject;
  /// When it expires, seconds since the Unix epoch.
  int64_t expires = 0;
  std::string algorithm;
};

/// The longest token accepted.
inline constexpr size_t max_jwt_bytes = 8192;
/// How far clocks may disagree, for `exp` and `nbf`.
inline constexpr int64_t jwt_leeway_s = 30;

class jwt_verifier {
public:
  /// Checks and compiles `keys`. Errors: invalid_argument naming what is
  /// wrong (no issuer, no key, a short secret, a malformed JWK Set, a key
  /// of an unsupported kind).
  static caf::expected<std::shared_ptr<const jwt_verifier>>
  make(issuer_keys keys);

  ~jwt_verifier();
  jwt_verifier(const jwt_verifier&) = delete;
  jwt_verifier& operator=(const jwt_verifier&) = delete;

  /// Verifies `token` at `now_s`. Errors: invalid_argument with the
  /// reason, which the HTTP layer answers with 401 (a
  /// malformed token, a refused algorithm, no key for it, a bad signature,
  /// another issuer or audience, expired, not yet valid, no `sub`).
  caf::expected<jwt_claims> verify(std::string_view token, int64_t now_s) const;

  const issuer_keys& keys() const noexcept;

private:
  struct impl;
  explicit jwt_verifier(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Whether `token` has a JWT's form: three base64url parts, the first two
/// not empty.
bool looks_like_jwt(std::string_view token) noexcept;

/// The `iss` of a token's payload, unverified: which tenant's keys to
/// check it with. nullopt when it has none.
std::optional<std::string> jwt_issuer(std::string_view token);

/// `bytes` in base64url without padding, and back (nullopt for text that
/// is not base64url).
std::string base64url_encode(std::string_view bytes);
std::optional<std::string> base64url_decode(std::string_view text);

} // namespace spindle::tenancy
