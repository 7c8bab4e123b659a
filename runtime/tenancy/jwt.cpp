#include "tenancy/jwt.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/memory.hpp"

namespace spindle::tenancy {

namespace {

using json = nlohmann::json;

caf::error refused(const std::string& why) {
  return make_error(errc::invalid_argument, "the token is refused: " + why);
}

caf::error bad_keys(const std::string& why) {
  return make_error(errc::invalid_argument, why);
}

struct pkey_deleter {
  void operator()(EVP_PKEY* p) const noexcept {
    EVP_PKEY_free(p);
  }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_deleter>;

// One public key of the JWK Set.
struct public_key {
  std::string kid;
  /// "RS256" or "ES256": the one algorithm it checks.
  std::string alg;
  pkey_ptr key;
};

// The value of each byte as a base64url digit, -1 for none.
constexpr std::array<int8_t, 256> b64url_table = [] {
  std::array<int8_t, 256> t{};
  for (auto& v : t)
    v = -1;
  for (int c = 'A'; c <= 'Z'; ++c)
    t[static_cast<size_t>(c)] = static_cast<int8_t>(c - 'A');
  for (int c = 'a'; c <= 'z'; ++c)
    t[static_cast<size_t>(c)] = static_cast<int8_t>(c - 'a' + 26);
  for (int c = '0'; c <= '9'; ++c)
    t[static_cast<size_t>(c)] = static_cast<int8_t>(c - '0' + 52);
  t[static_cast<size_t>('-')] = 62;
  t[static_cast<size_t>('_')] = 63;
  return t;
}();

int8_t b64url_value(char c) noexcept {
  return b64url_table[static_cast<unsigned char>(c)];
}

// A big-endian unsigned integer of a JWK member.
struct bn_deleter {
  void operator()(BIGNUM* p) const noexcept {
    BN_free(p);
  }
};
using bn_ptr = std::unique_ptr<BIGNUM, bn_deleter>;

bn_ptr bignum_of(const std::string& bytes) {
  return bn_ptr{BN_bin2bn(reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()), nullptr)};
}

// A member that must be a string: "" when it is missing or not one.
std::string string_member(const json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>()
                                                : std::string{};
}

std::optional<std::string> member_bytes(const json& jwk, const char* name) {
  auto it = jwk.find(name);
  if (it == jwk.end() || !it->is_string())
    return std::nullopt;
  return base64url_decode(it->get<std::string>());
}

// An EVP_PKEY from OSSL_PARAMs built by `build`, of `type` ("RSA", "EC").
template <class Build>
pkey_ptr key_from(const char* type, Build build) {
  std::unique_ptr<OSSL_PARAM_BLD, void (*)(OSSL_PARAM_BLD*)> bld{
    OSSL_PARAM_BLD_new(), OSSL_PARAM_BLD_free};
  if (!bld || !build(bld.get()))
    return nullptr;
  std::unique_ptr<OSSL_PARAM, void (*)(OSSL_PARAM*)> params{
    OSSL_PARAM_BLD_to_param(bld.get()), OSSL_PARAM_free};
  std::unique_ptr<EVP_PKEY_CTX, void (*)(EVP_PKEY_CTX*)> ctx{
    EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr), EVP_PKEY_CTX_free};
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1)
    return nullptr;
  EVP_PKEY* out = nullptr;
  if (EVP_PKEY_fromdata(ctx.get(), &out, EVP_PKEY_PUBLIC_KEY, params.get())
      != 1)
    return nullptr;
  return pkey_ptr{out};
}

caf::expected<public_key> key_of(const json& jwk, size_t index) {
  auto where = "jwks.keys[" + std::to_string(index) + "]";
  if (!jwk.is_object())
    return bad_keys(where + " must be an object");
  auto kty = string_member(jwk, "kty");
  public_key out;
  out.kid = jwk.contains("kid") && jwk["kid"].is_string()
              ? jwk["kid"].get<std::string>()
              : std::string{};
  if (jwk.contains("use") && jwk["use"] != "sig")
    return bad_keys(where + ": only keys for signatures (use: sig)");
  if (kty == "RSA") {
    out.alg = "RS256";
    auto n = member_bytes(jwk, "n");
    auto e = member_bytes(jwk, "e");
    if (!n || !e || n->empty() || e->empty())
      return bad_keys(where + ": an RSA key needs n and e in base64url");
    if (n->size() < 256)
      return bad_keys(where + ": an RSA key needs at least 2048 bits");
    if (n->size() > 1024)
      return bad_keys(where + ": an RSA key of more than 8192 bits");
    auto bn_n = bignum_of(*n);
    auto bn_e = bignum_of(*e);
    out.key = key_from("RSA", [&](OSSL_PARAM_BLD* b) {
      return bn_n && bn_e
             && OSSL_PARAM_BLD_push_BN(b, OSSL_PKEY_PARAM_RSA_N, bn_n.get())
             && OSSL_PARAM_BLD_push_BN(b, OSSL_PKEY_PARAM_RSA_E, bn_e.get());
    });
  } else if (kty == "EC") {
    out.alg = "ES256";
    if (string_member(jwk, "crv") != "P-256")
      return bad_keys(where + ": an EC key must be on P-256 (crv)");
    auto x = member_bytes(jwk, "x");
    auto y = member_bytes(jwk, "y");
    if (!x || !y || x->size() != 32 || y->size() != 32)
      return bad_keys(where + ": a P-256 key needs x and y of 32 bytes");
    auto point = std::string{"\x04"} + *x + *y;
    static const char group[] = "prime256v1";
    out.key = key_from("EC", [&](OSSL_PARAM_BLD* b) {
      return OSSL_PARAM_BLD_push_utf8_string(b, OSSL_PKEY_PARAM_GROUP_NAME,
                                             group, 0)
             && OSSL_PARAM_BLD_push_octet_string(b, OSSL_PKEY_PARAM_PUB_KEY,
                                                 point.data(), point.size());
    });
  } else {
    return bad_keys(where + ": kty must be RSA or EC, not '"
                    + kty.substr(0, 16) + "'");
  }
  if (jwk.contains("alg") && jwk["alg"] != out.alg)
    return bad_keys(where + ": its alg must be " + out.alg);
  if (!out.key)
    return bad_keys(where + ": not a valid public key");
  return out;
}

bool verify_with(EVP_PKEY* key, const std::string& signing_input,
                 const std::string& signature) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(),
                                                         EVP_MD_CTX_free};
  if (!ctx
      || EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key)
           != 1)
    return false;
  return EVP_DigestVerify(
           ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
           signature.size(),
           reinterpret_cast<const unsigned char*>(signing_input.data()),
           signing_input.size())
         == 1;
}

// ES256's signature is r and s, 32 bytes each; OpenSSL wants DER.
std::optional<std::string> der_of(const std::string& raw) {
  if (raw.size() != 64)
    return std::nullopt;
  auto* sig = ECDSA_SIG_new();
  if (sig == nullptr)
    return std::nullopt;
  auto* r = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()), 32,
                      nullptr);
  auto* s = BN_bin2bn(
    reinterpret_cast<const unsigned char*>(raw.data()) + 32, 32, nullptr);
  if (r == nullptr || s == nullptr || ECDSA_SIG_set0(sig, r, s) != 1) {
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(sig);
    return std::nullopt;
  }
  unsigned char* der = nullptr;
  auto n = i2d_ECDSA_SIG(sig, &der);
  ECDSA_SIG_free(sig);
  if (n <= 0)
    return std::nullopt;
  std::string out{reinterpret_cast<char*>(der), static_cast<size_t>(n)};
  OPENSSL_free(der);
  return out;
}

// The three parts of a token, or nullopt.
std::optional<std::array<std::string_view, 3>> parts_of(std::string_view t) {
  auto a = t.find('.');
  if (a == std::string_view::npos)
    return std::nullopt;
  auto b = t.find('.', a + 1);
  if (b == std::string_view::npos || t.find('.', b + 1) != std::string_view::npos)
    return std::nullopt;
  return std::array<std::string_view, 3>{t.substr(0, a),
                                         t.substr(a + 1, b - a - 1),
                                         t.substr(b + 1)};
}

std::optional<json> object_of(std::string_view part) {
  auto text = base64url_decode(part);
  if (!text)
    return std::nullopt;
  auto parsed = json::parse(*text, nullptr, false);
  if (!parsed.is_object())
    return std::nullopt;
  return parsed;
}

// A NumericDate: a number of seconds.
std::optional<int64_t> seconds_of(const json& claims, const char* name) {
  auto it = claims.find(name);
  if (it == claims.end() || !it->is_number())
    return std::nullopt;
  auto v = it->get<double>();
  if (!(v > -1e15 && v < 1e15))
    return std::nullopt;
  return static_cast<int64_t>(v);
}

} // namespace

std::string base64url_encode(std::string_view bytes) {
  static constexpr char alphabet[]
    = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += alphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0)
    out += alphabet[(acc << (6 - bits)) & 63];
  return out;
}

std::optional<std::string> base64url_decode(std::string_view text) {
  if (text.size() % 4 == 1)
    return std::nullopt;
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    auto v = b64url_value(c);
    if (v < 0)
      return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  // The bits left over must be zero (one encoding per byte string).
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0)
    return std::nullopt;
  return out;
}

bool looks_like_jwt(std::string_view token) noexcept {
  if (token.size() > max_jwt_bytes)
    return false;
  auto parts = parts_of(token);
  if (!parts || (*parts)[0].empty() || (*parts)[1].empty())
    return false;
  // Every byte but the two dots a base64url digit: OR-ed, not branched on.
  int8_t bad = 0;
  for (auto part : *parts)
    for (char c : part)
      bad |= b64url_value(c);
  return bad >= 0;
}

std::optional<std::string> jwt_issuer(std::string_view token) {
  if (!looks_like_jwt(token))
    return std::nullopt;
  auto payload = object_of((*parts_of(token))[1]);
  if (!payload || !payload->contains("iss") || !(*payload)["iss"].is_string())
    return std::nullopt;
  return (*payload)["iss"].get<std::string>();
}

struct jwt_verifier::impl {
  issuer_keys keys;
  std::vector<public_key> public_keys;
};

jwt_verifier::jwt_verifier(std::unique_ptr<impl> p) : impl_(std::move(p)) {
}

jwt_verifier::~jwt_verifier() = default;

const issuer_keys& jwt_verifier::keys() const noexcept {
  return impl_->keys;
}

caf::expected<std::shared_ptr<const jwt_verifier>>
jwt_verifier::make(issuer_keys keys) {
  if (keys.issuer.empty() || keys.issuer.size() > 512)
    return bad_keys("issuer must have 1 to 512 characters");
  if (keys.audience.size() > 512)
    return bad_keys("audience must have at most 512 characters");
  if (keys.hs256_secret.empty() == keys.jwks.empty())
    return bad_keys("give hs256_secret or jwks, one of them");
  if (!keys.hs256_secret.empty()
      && (keys.hs256_secret.size() < 32 || keys.hs256_secret.size() > 1024))
    return bad_keys("hs256_secret must have 32 to 1024 bytes");
  auto p = std::make_unique<impl>();
  if (!keys.jwks.empty()) {
    if (keys.jwks.size() > 256 * 1024)
      return bad_keys("jwks is larger than 256 KiB");
    auto set = json::parse(keys.jwks, nullptr, false);
    if (!set.is_object() || !set.contains("keys") || !set["keys"].is_array()
        || set["keys"].empty())
      return bad_keys("jwks must be a JWK Set: an object with a non-empty "
                      "array 'keys'");
    if (set["keys"].size() > 64)
      return bad_keys("jwks holds at most 64 keys");
    for (size_t i = 0; i < set["keys"].size(); ++i) {
      auto k = key_of(set["keys"][i], i);
      if (!k)
        return k.error();
      p->public_keys.push_back(std::move(*k));
    }
  }
  p->keys = std::move(keys);
  return std::shared_ptr<const jwt_verifier>{new jwt_verifier(std::move(p))};
}

caf::expected<jwt_claims> jwt_verifier::verify(std::string_view token,
                                               int64_t now_s) const {
  if (!looks_like_jwt(token))
    return refused("it is not a JWT (three base64url parts, at most 8 KiB)");
  auto parts = *parts_of(token);
  auto header = object_of(parts[0]);
  auto claims = object_of(parts[1]);
  auto signature = base64url_decode(parts[2]);
  if (!header || !claims || !signature)
    return refused("its header or payload is not a base64url JSON object");
  auto alg = string_member(*header, "alg");
  if (header->contains("crit"))
    return refused("it names extensions (crit) this server does not know");
  std::string signing_input{token.substr(0, parts[0].size() + 1
                                                + parts[1].size())};
  bool good = false;
  if (alg == "HS256") {
    if (impl_->keys.hs256_secret.empty())
      return refused("HS256 is not how this issuer signs");
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    auto& secret = impl_->keys.hs256_secret;
    if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(signing_input.data()),
             signing_input.size(), mac, &size)
        == nullptr)
      return refused("it cannot be checked");
    good = signature->size() == size
           && CRYPTO_memcmp(mac, signature->data(), size) == 0;
  } else if (alg == "RS256" || alg == "ES256") {
    auto kid = header->contains("kid") && (*header)["kid"].is_string()
                 ? (*header)["kid"].get<std::string>()
                 : std::string{};
    auto sig = *signature;
    if (alg == "ES256") {
      auto der = der_of(sig);
      if (!der)
        return refused("an ES256 signature is 64 bytes");
      sig = std::move(*der);
    }
    bool candidate = false;
    for (auto& k : impl_->public_keys) {
      if (k.alg != alg || (!kid.empty() && k.kid != kid))
        continue;
      candidate = true;
      if (verify_with(k.key.get(), signing_input, sig)) {
        good = true;
        break;
      }
    }
    if (!candidate)
      return refused("no key of this issuer checks " + alg
                     + (kid.empty() ? std::string{}
                                    : " with kid '" + kid.substr(0, 64)
                                        + "'"));
  } else {
    return refused("alg '" + alg.substr(0, 16)
                   + "' is not accepted (HS256, RS256, ES256)");
  }
  if (!good)
    return refused("its signature does not match");
  // The signature holds: now what it says.
  jwt_claims out;
  out.algorithm = alg;
  if (!claims->contains("iss") || !(*claims)["iss"].is_string()
      || (*claims)["iss"] != impl_->keys.issuer)
    return refused("its issuer (iss) is not this tenant's");
  out.issuer = impl_->keys.issuer;
  if (!impl_->keys.audience.empty()) {
    auto aud = claims->find("aud");
    bool match = aud != claims->end()
                 && ((aud->is_string() && *aud == impl_->keys.audience)
                     || (aud->is_array()
                         && std::find(aud->begin(), aud->end(),
                                      json(impl_->keys.audience))
                              != aud->end()));
    if (!match)
      return refused("its audience (aud) is not '" + impl_->keys.audience
                     + "'");
  }
  auto exp = seconds_of(*claims, "exp");
  if (!exp)
    return refused("it has no expiry (exp)");
  if (now_s >= *exp + jwt_leeway_s)
    return refused("it has expired");
  if (claims->contains("nbf")) {
    auto nbf = seconds_of(*claims, "nbf");
    if (!nbf)
      return refused("its nbf is not a number of seconds");
    if (now_s + jwt_leeway_s < *nbf)
      return refused("it is not valid yet (nbf)");
  }
  out.expires = *exp;
  if (!claims->contains("sub") || !(*claims)["sub"].is_string())
    return refused("it names no end user (sub)");
  out.subject = (*claims)["sub"].get<std::string>();
  if (validate_client_user_id(out.subject))
    return refused("its subject (sub) is not a user ID: 1 to 128 of "
                   "A-Z a-z 0-9 . _ : @ + -");
  return out;
}

} // namespace spindle::tenancy
