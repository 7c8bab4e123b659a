// End users' tokens (runtime/tenancy/jwt.hpp, docs/tenants.md): HS256,
// RS256 and ES256 accepted with keys of their own kind only, and every
// other token refused with its reason: a wrong signature, another issuer or
// audience, expired, alg none, an algorithm the issuer does not sign with.

#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "tenancy/jwt.hpp"

using namespace spindle::tenancy;
using json = nlohmann::json;

namespace {

constexpr int64_t now = 1800000000;

struct key_pair {
  EVP_PKEY* key = nullptr;
  ~key_pair() {
    EVP_PKEY_free(key);
  }
};

std::string bn_bytes(EVP_PKEY* key, const char* name) {
  BIGNUM* bn = nullptr;
  REQUIRE(EVP_PKEY_get_bn_param(key, name, &bn) == 1);
  std::string out(static_cast<size_t>(BN_num_bytes(bn)), '\0');
  BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  BN_free(bn);
  return out;
}

json rsa_jwk(EVP_PKEY* key, const std::string& kid) {
  return {{"kty", "RSA"},
          {"kid", kid},
          {"use", "sig"},
          {"n", base64url_encode(bn_bytes(key, OSSL_PKEY_PARAM_RSA_N))},
          {"e", base64url_encode(bn_bytes(key, OSSL_PKEY_PARAM_RSA_E))}};
}

json ec_jwk(EVP_PKEY* key, const std::string& kid) {
  unsigned char point[80];
  size_t n = 0;
  REQUIRE(EVP_PKEY_get_octet_string_param(key, OSSL_PKEY_PARAM_PUB_KEY, point,
                                          sizeof point, &n)
          == 1);
  REQUIRE(n == 65);
  std::string raw{reinterpret_cast<char*>(point), n};
  return {{"kty", "EC"},
          {"crv", "P-256"},
          {"kid", kid},
          {"x", base64url_encode(raw.substr(1, 32))},
          {"y", base64url_encode(raw.substr(33, 32))}};
}

std::string sign_with(EVP_PKEY* key, const std::string& input) {
  auto* ctx = EVP_MD_CTX_new();
  REQUIRE(EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key) == 1);
  size_t n = 0;
  REQUIRE(EVP_DigestSign(ctx, nullptr, &n,
                         reinterpret_cast<const unsigned char*>(input.data()),
                         input.size())
          == 1);
  std::string out(n, '\0');
  REQUIRE(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(out.data()), &n,
                         reinterpret_cast<const unsigned char*>(input.data()),
                         input.size())
          == 1);
  out.resize(n);
  EVP_MD_CTX_free(ctx);
  return out;
}

// ES256 wants r || s, 32 bytes each, not DER.
std::string raw_of(const std::string& der) {
  auto* p = reinterpret_cast<const unsigned char*>(der.data());
  auto* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  REQUIRE(sig != nullptr);
  const BIGNUM* r = nullptr;
  const BIGNUM* s = nullptr;
  ECDSA_SIG_get0(sig, &r, &s);
  std::string out(64, '\0');
  BN_bn2binpad(r, reinterpret_cast<unsigned char*>(out.data()), 32);
  BN_bn2binpad(s, reinterpret_cast<unsigned char*>(out.data()) + 32, 32);
  ECDSA_SIG_free(sig);
  return out;
}

std::string hmac(const std::string& secret, const std::string& input) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
       &n);
  return std::string{reinterpret_cast<char*>(mac), n};
}

std::string input_of(const json& header, const json& claims) {
  return base64url_encode(header.dump()) + "." + base64url_encode(claims.dump());
}

json claims(std::string sub = "alice", int64_t exp = now + 300) {
  return {{"iss", "https://auth.example"}, {"sub", sub}, {"exp", exp}};
}

const std::string secret = "0123456789abcdef0123456789abcdef-secret";

std::string hs256(const json& c, json header = {{"alg", "HS256"}}) {
  auto in = input_of(header, c);
  return in + "." + base64url_encode(hmac(secret, in));
}

std::string why(const caf::expected<jwt_claims>& x) {
  return x ? std::string{"accepted"} : to_string(x.error());
}

} // namespace

TEST_CASE("jwt: base64url round-trips and refuses what is not base64url",
          "[jwt]") {
  for (std::string s : std::vector<std::string>{
         "", "f", "fo", "foo", "foob", "fooba", "foobar",
         std::string("\0\xff\x10", 3)})
    CHECK(base64url_decode(base64url_encode(s)) == s);
  CHECK(base64url_encode("\xfb\xff") == "-_8");
  CHECK_FALSE(base64url_decode("a"));      // a length no encoding has
  CHECK_FALSE(base64url_decode("ab+/"));   // base64, not base64url
  CHECK_FALSE(base64url_decode("Zm9v=")); // padding
  CHECK_FALSE(base64url_decode("Zh"));     // stray bits set
}

TEST_CASE("jwt: HS256 with the issuer's secret is accepted, and a wrong "
          "signature, issuer, audience, expiry or subject is refused",
          "[jwt]") {
  auto v = jwt_verifier::make({"https://auth.example", "", secret, ""});
  REQUIRE(v);
  auto ok = (*v)->verify(hs256(claims()), now);
  REQUIRE(ok);
  CHECK(ok->subject == "alice");
  CHECK(ok->algorithm == "HS256");
  CHECK(jwt_issuer(hs256(claims())) == std::string{"https://auth.example"});

  auto token = hs256(claims());
  auto tampered = token;
  tampered[tampered.size() - 2] = tampered[tampered.size() - 2] == 'A' ? 'B'
                                                                       : 'A';
  CHECK(why((*v)->verify(tampered, now)).find("signature") != std::string::npos);
  auto other_secret = input_of({{"alg", "HS256"}}, claims());
  other_secret += "." + base64url_encode(hmac(secret + "x", other_secret));
  CHECK_FALSE((*v)->verify(other_secret, now));

  auto c = claims();
  c["iss"] = "https://evil.example";
  CHECK(why((*v)->verify(hs256(c), now)).find("issuer") != std::string::npos);
  CHECK(why((*v)->verify(hs256(claims("alice", now - 100)), now))
          .find("expired")
        != std::string::npos);
  // Within the leeway it is still good.
  CHECK((*v)->verify(hs256(claims("alice", now - jwt_leeway_s + 1)), now));
  auto no_exp = claims();
  no_exp.erase("exp");
  CHECK(why((*v)->verify(hs256(no_exp), now)).find("exp") != std::string::npos);
  auto later = claims();
  later["nbf"] = now + 600;
  CHECK(why((*v)->verify(hs256(later), now)).find("nbf") != std::string::npos);
  CHECK(why((*v)->verify(hs256(claims("t1~alice")), now)).find("sub")
        != std::string::npos);
  auto no_sub = claims();
  no_sub.erase("sub");
  CHECK_FALSE((*v)->verify(hs256(no_sub), now));

  auto with_aud = jwt_verifier::make(
    {"https://auth.example", "spindle", secret, ""});
  REQUIRE(with_aud);
  CHECK(why((*with_aud)->verify(hs256(claims()), now)).find("audience")
        != std::string::npos);
  auto aud = claims();
  aud["aud"] = json::array({"other", "spindle"});
  CHECK((*with_aud)->verify(hs256(aud), now));
  aud["aud"] = "other";
  CHECK_FALSE((*with_aud)->verify(hs256(aud), now));
}

TEST_CASE("jwt: alg none, unknown algorithms and an algorithm the issuer "
          "does not sign with are refused",
          "[jwt]") {
  auto v = jwt_verifier::make({"https://auth.example", "", secret, ""});
  REQUIRE(v);
  auto none = input_of({{"alg", "none"}}, claims()) + ".";
  CHECK(why((*v)->verify(none, now)).find("alg 'none'") != std::string::npos);
  for (auto alg : {"HS512", "RS256", "ES256", "PS256", "", "hs256"}) {
    auto t = input_of({{"alg", alg}}, claims()) + "." + base64url_encode("x");
    INFO(alg);
    CHECK_FALSE((*v)->verify(t, now));
  }
  CHECK_FALSE((*v)->verify(hs256(claims(), {{"alg", "HS256"}, {"crit", {"x"}}}),
                           now));
  // Members of the wrong type are refused, never thrown.
  for (json alg : {json(5), json(nullptr), json::array({"HS256"}),
                   json::object()}) {
    INFO(alg.dump());
    CHECK_FALSE((*v)->verify(hs256(claims(), {{"alg", alg}}), now));
  }
  auto with_nbf = claims();
  with_nbf["nbf"] = "yesterday";
  CHECK(why((*v)->verify(hs256(with_nbf), now)).find("nbf")
        != std::string::npos);
  for (std::string junk : std::vector<std::string>{
         "", "a.b", "a.b.c.d", "...", "a b.c.d",
         std::string(9000, 'a') + ".b.c"})
    CHECK_FALSE((*v)->verify(junk, now));
}

TEST_CASE("jwt: RS256 and ES256 with the keys of a JWK Set, by kid, and an HS256 "
          "token made with a public key as its secret is refused",
          "[jwt]") {
  key_pair rsa{EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048})};
  key_pair ec{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
  key_pair other{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
  REQUIRE(rsa.key);
  REQUIRE(ec.key);
  json jwks{{"keys", {rsa_jwk(rsa.key, "r1"), ec_jwk(ec.key, "e1")}}};
  auto v = jwt_verifier::make(
    {"https://auth.example", "", "", jwks.dump()});
  REQUIRE(v);

  auto rs_in = input_of({{"alg", "RS256"}, {"kid", "r1"}}, claims());
  auto rs = rs_in + "." + base64url_encode(sign_with(rsa.key, rs_in));
  CHECK(why((*v)->verify(rs, now)) == "accepted");
  auto es_in = input_of({{"alg", "ES256"}, {"kid", "e1"}}, claims("bob"));
  auto es = es_in + "." + base64url_encode(raw_of(sign_with(ec.key, es_in)));
  auto got = (*v)->verify(es, now);
  REQUIRE(got);
  CHECK(got->subject == "bob");
  // Without kid, every key of the algorithm is tried.
  auto plain_in = input_of({{"alg", "ES256"}}, claims());
  CHECK((*v)->verify(plain_in + "."
                       + base64url_encode(raw_of(sign_with(ec.key, plain_in))),
                     now));
  // Another key, an unknown kid, a signature of the wrong length.
  auto forged = es_in + "."
                + base64url_encode(raw_of(sign_with(other.key, es_in)));
  CHECK_FALSE((*v)->verify(forged, now));
  auto unknown_in = input_of({{"alg", "ES256"}, {"kid", "nope"}}, claims());
  CHECK(why((*v)->verify(unknown_in + "."
                           + base64url_encode(
                             raw_of(sign_with(ec.key, unknown_in))),
                         now))
          .find("no key")
        != std::string::npos);
  CHECK_FALSE((*v)->verify(es_in + "." + base64url_encode(std::string(63, 'x')),
                           now));
  // Algorithm confusion: the RSA public key's bytes as an HMAC secret.
  auto n = base64url_encode(bn_bytes(rsa.key, OSSL_PKEY_PARAM_RSA_N));
  auto confused_in = input_of({{"alg", "HS256"}}, claims());
  auto confused = confused_in + "."
                  + base64url_encode(hmac(n, confused_in));
  CHECK(why((*v)->verify(confused, now)).find("HS256 is not")
        != std::string::npos);
}

TEST_CASE("jwt: malformed key settings are refused with what is wrong",
          "[jwt]") {
  auto bad = [](issuer_keys k) {
    auto v = jwt_verifier::make(std::move(k));
    REQUIRE_FALSE(v);
    return to_string(v.error());
  };
  CHECK(bad({"", "", secret, ""}).find("issuer") != std::string::npos);
  CHECK(bad({"i", "", "", ""}).find("one of them") != std::string::npos);
  CHECK(bad({"i", "", secret, "{}"}).find("one of them") != std::string::npos);
  CHECK(bad({"i", "", "short", ""}).find("32") != std::string::npos);
  for (std::string jwks :
       {"not json", "[]", R"({"keys":[]})", R"({"keys":{}})",
        R"({"keys":[1]})", R"({"keys":[{"kty":"oct","k":"AAAA"}]})",
        R"({"keys":[{"kty":"RSA","n":"AQAB"}]})",
        R"({"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]})",
        R"({"keys":[{"kty":"EC","crv":"P-384","x":"AA","y":"AA"}]})",
        R"({"keys":[{"kty":"EC","crv":"P-256","x":"AAAA","y":"AAAA"}]})",
        R"({"keys":[{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}]})",
        R"({"keys":[{"kty":5,"n":"AQAB","e":"AQAB"}]})",
        R"({"keys":[{"kty":"EC","crv":["P-256"],"x":"AA","y":"AA"}]})",
        R"({"keys":[{"kty":"RSA","use":1,"n":"AQAB","e":"AQAB"}]})"}) {
    INFO(jwks);
    CHECK_FALSE(jwt_verifier::make({"i", "", "", jwks}));
  }
  // A point that is not on the curve.
  json off_curve{{"keys",
                  {{{"kty", "EC"},
                    {"crv", "P-256"},
                    {"x", base64url_encode(std::string(32, '\x01'))},
                    {"y", base64url_encode(std::string(32, '\x02'))}}}}};
  CHECK_FALSE(jwt_verifier::make({"i", "", "", off_curve.dump()}));
}
