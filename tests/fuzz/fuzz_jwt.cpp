// End users' tokens (docs/tenants.md, "End users"): the input is presented
// as a JWT to a store (in memory) where one tenant accepts HS256 tokens of
// its issuer and another ES256 tokens of a JWK Set made at start.
//
// Invariants: nothing crashes, and a refusal is `invalid_argument`; an
// accepted HS256 token carries the HMAC of its own header and payload (so
// no input is accepted that the secret did not sign), an accepted ES256
// token is exactly the one signed at start (no malleability), and either
// acts as a valid user ID in the issuer's tenant; base64url has one
// encoding per byte string.

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "fuzz.hpp"
#include "core/logging.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/memory.hpp"
#include "tenancy/jwt.hpp"
#include "tenancy/tenant_store.hpp"

using namespace spindle;
using spindle::fuzz::check;
using json = nlohmann::json;

namespace {

const std::string hs_issuer = "https://fuzz.example";
const std::string es_issuer = "https://jwks.fuzz.example";
const std::string secret = "the-fuzzed-tenants-secret-0123456789abcdef";

std::string hmac_of(const std::string& input) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
       &len);
  return {reinterpret_cast<const char*>(mac), len};
}

std::string coordinate(EVP_PKEY* key, const char* name) {
  BIGNUM* bn = nullptr;
  check(EVP_PKEY_get_bn_param(key, name, &bn) == 1, "the key has its point");
  std::string out(32, '\0');
  BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), 32);
  BN_free(bn);
  return tenancy::base64url_encode(out);
}

// ES256's signature: r and s of 32 bytes each, from OpenSSL's DER.
std::string es256_sign(EVP_PKEY* key, const std::string& input) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  check(EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key) == 1,
        "signing starts");
  size_t len = 0;
  EVP_DigestSign(ctx, nullptr, &len,
                 reinterpret_cast<const unsigned char*>(input.data()),
                 input.size());
  std::string der(len, '\0');
  check(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(der.data()),
                       &len,
                       reinterpret_cast<const unsigned char*>(input.data()),
                       input.size())
          == 1,
        "the seed is signed");
  der.resize(len);
  EVP_MD_CTX_free(ctx);
  auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  std::string raw(64, '\0');
  BN_bn2binpad(ECDSA_SIG_get0_r(sig),
               reinterpret_cast<unsigned char*>(raw.data()), 32);
  BN_bn2binpad(ECDSA_SIG_get0_s(sig),
               reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
  ECDSA_SIG_free(sig);
  return raw;
}

struct fixture {
  std::unique_ptr<tenancy::tenant_store> store;
  std::string hs_tenant;
  std::string es_tenant;
  std::string hs_seed;
  std::string es_seed;
};

fixture& the_fixture() {
  static fixture* f = [] {
    (void) setup_logging("off", "text");
    auto out = new fixture;
    storage_options so;
    so.data_dir = ":memory:";
    auto store = tenancy::tenant_store::open(so);
    check(static_cast<bool>(store), "the store opens");
    out->store = std::move(*store);
    auto hs = out->store->create_tenant("hs", 1);
    auto es = out->store->create_tenant("es", 1);
    check(hs && es, "the tenants are created");
    out->hs_tenant = hs->id;
    out->es_tenant = es->id;
    check(static_cast<bool>(out->store->set_auth(
            hs->id, {hs_issuer, "spindle", secret, ""})),
          "the HS256 settings are taken");
    EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
    check(key != nullptr, "a P-256 key is made");
    json jwks{{"keys",
               {{{"kty", "EC"},
                 {"crv", "P-256"},
                 {"kid", "k1"},
                 {"x", coordinate(key, OSSL_PKEY_PARAM_EC_PUB_X)},
                 {"y", coordinate(key, OSSL_PKEY_PARAM_EC_PUB_Y)}}}}};
    check(static_cast<bool>(out->store->set_auth(
            es->id, {es_issuer, "", "", jwks.dump()})),
          "the JWK Set is taken");
    json claims{{"iss", hs_issuer},
                {"aud", "spindle"},
                {"sub", "alice"},
                {"exp", 4102444800}};
    auto input = tenancy::base64url_encode(R"({"alg":"HS256"})") + "."
                 + tenancy::base64url_encode(claims.dump());
    out->hs_seed = input + "." + tenancy::base64url_encode(hmac_of(input));
    claims["iss"] = es_issuer;
    claims.erase("aud");
    input = tenancy::base64url_encode(R"({"alg":"ES256","kid":"k1"})") + "."
            + tenancy::base64url_encode(claims.dump());
    out->es_seed = input + "."
                   + tenancy::base64url_encode(es256_sign(key, input));
    EVP_PKEY_free(key);
    return out;
  }();
  return *f;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& f = the_fixture();
  std::string input{fuzz::text(data, size)};
  // '=' and '!' start near misses of the signed tokens: the rest replaces
  // the HS256 or ES256 token's tail.
  if (!input.empty() && (input[0] == '=' || input[0] == '!')) {
    auto& seed = input[0] == '=' ? f.hs_seed : f.es_seed;
    auto tail = input.substr(1, seed.size());
    input = seed.substr(0, seed.size() - tail.size()) + tail;
  }
  (void) tenancy::looks_like_jwt(input);
  (void) tenancy::jwt_issuer(input);
  if (auto bytes = tenancy::base64url_decode(input))
    check(tenancy::base64url_encode(*bytes) == input,
          "base64url has one encoding per byte string");
  bool needs_store = false;
  auto who = f.store->end_user(input, true, needs_store);
  check(!needs_store, "a blocking call never asks to block");
  if (!who) {
    auto code = classify(who.error());
    check(code == errc::invalid_argument,
          "a refused token is invalid_argument");
    return 0;
  }
  auto& p = **who;
  check(!validate_client_user_id(p.user), "the end user is a valid user ID");
  check(p.thread_prefix == p.prefix + p.user + "~",
        "its threads are its own");
  auto issuer = tenancy::jwt_issuer(input);
  check(static_cast<bool>(issuer), "an accepted token names its issuer");
  if (*issuer == hs_issuer) {
    check(p.tenant == f.hs_tenant, "in the issuer's tenant");
    auto dot = input.rfind('.');
    auto signature = tenancy::base64url_decode(input.substr(dot + 1));
    check(signature && *signature == hmac_of(input.substr(0, dot)),
          "an accepted HS256 token is signed with the secret");
  } else {
    check(*issuer == es_issuer && p.tenant == f.es_tenant,
          "in the issuer's tenant");
    check(input == f.es_seed, "an accepted ES256 token is the one signed");
  }
  return 0;
}
