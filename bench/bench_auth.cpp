// The cost of authenticating one request (docs/tenants.md, "What it
// costs"): an end user's JWT verified with spindle's verifier (HS256,
// RS256 with a 2048-bit key, ES256 on P-256) beside the same signature
// checked by OpenSSL alone, the bare floor; a token already verified, as
// the store answers it from its cache; and a tenant's key from the cache
// of keys in use beside the SHA-256 it costs.
//
// Each figure is the median of five runs of N operations on one thread,
// in microseconds per operation.
//
// Usage: bench_auth [--quick] [--json PATH]

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spdlog/spdlog.h>

#include "core/digest.hpp"
#include "report.hpp"
#include "spindle/runtime/storage.hpp"
#include "tenancy/jwt.hpp"
#include "tenancy/tenant_store.hpp"

using namespace spindle;
using namespace spindle::bench;
using json = nlohmann::json;

namespace {

const std::string secret = "the-benchmark-tenants-secret-0123456789abcdef";
const int64_t far_exp = 4102444800; // 2100

struct key_deleter {
  void operator()(EVP_PKEY* p) const noexcept {
    EVP_PKEY_free(p);
  }
};
using pkey = std::unique_ptr<EVP_PKEY, key_deleter>;

std::string bn_b64(EVP_PKEY* key, const char* name, size_t pad = 0) {
  BIGNUM* bn = nullptr;
  EVP_PKEY_get_bn_param(key, name, &bn);
  size_t n = pad != 0 ? pad : static_cast<size_t>(BN_num_bytes(bn));
  std::string out(n, '\0');
  BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()),
               static_cast<int>(n));
  BN_free(bn);
  return tenancy::base64url_encode(out);
}

std::string der_signature(EVP_PKEY* key, const std::string& input) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key);
  size_t len = 0;
  EVP_DigestSign(ctx, nullptr, &len,
                 reinterpret_cast<const unsigned char*>(input.data()),
                 input.size());
  std::string sig(len, '\0');
  EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                 reinterpret_cast<const unsigned char*>(input.data()),
                 input.size());
  sig.resize(len);
  EVP_MD_CTX_free(ctx);
  return sig;
}

// JOSE's ES256 signature (r || s) from OpenSSL's DER.
std::string raw_of(const std::string& der) {
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

std::string signing_input(const std::string& alg, const std::string& iss,
                          const std::string& sub) {
  json header{{"alg", alg}, {"kid", "k1"}};
  json claims{{"iss", iss}, {"sub", sub}, {"exp", far_exp}};
  return tenancy::base64url_encode(header.dump()) + "."
         + tenancy::base64url_encode(claims.dump());
}

std::string hmac(const std::string& input) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
       &len);
  return {reinterpret_cast<const char*>(mac), len};
}

// The median over five runs of `n` calls of `fn`, in µs per call.
template <class F>
double micros(size_t n, F fn) {
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    auto start = clock::now();
    for (size_t i = 0; i < n; ++i)
      fn(i);
    runs.push_back(seconds_since(start) * 1e6 / static_cast<double>(n));
  }
  return percentile(runs, 50);
}

[[noreturn]] void die(const std::string& what) {
  std::cerr << "bench_auth: " << what << "\n";
  std::exit(1);
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  size_t n_fast = quick ? 20000 : 200000;
  size_t n_slow = quick ? 500 : 5000;
  spdlog::set_level(spdlog::level::warn);
  report rep{"auth"};

  pkey rsa{EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048})};
  pkey ec{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
  if (!rsa || !ec)
    die("cannot make the keys");
  json jwks{{"keys",
             {{{"kty", "RSA"},
               {"kid", "k1"},
               {"alg", "RS256"},
               {"n", bn_b64(rsa.get(), OSSL_PKEY_PARAM_RSA_N)},
               {"e", bn_b64(rsa.get(), OSSL_PKEY_PARAM_RSA_E)}}}}};
  json ec_jwks{{"keys",
                {{{"kty", "EC"},
                  {"crv", "P-256"},
                  {"kid", "k1"},
                  {"x", bn_b64(ec.get(), OSSL_PKEY_PARAM_EC_PUB_X, 32)},
                  {"y", bn_b64(ec.get(), OSSL_PKEY_PARAM_EC_PUB_Y, 32)}}}}};

  struct alg_case {
    std::string name;
    std::shared_ptr<const tenancy::jwt_verifier> verifier;
    std::string token;
    std::string input;
    std::string signature; // as the floor checks it
    size_t n;
  };
  std::vector<alg_case> cases;
  auto add = [&](const std::string& alg, tenancy::issuer_keys keys,
                 std::string signature, std::string jose_signature,
                 size_t n) {
    auto input = signing_input(alg, keys.issuer, "alice");
    auto v = tenancy::jwt_verifier::make(std::move(keys));
    if (!v)
      die("the settings of " + alg + " are refused");
    cases.push_back({alg, *v,
                     input + "." + tenancy::base64url_encode(jose_signature),
                     input, std::move(signature), n});
  };
  {
    auto input = signing_input("HS256", "https://hs.example", "alice");
    auto mac = hmac(input);
    add("HS256", {"https://hs.example", "", secret, ""}, mac, mac, n_fast);
  }
  {
    auto input = signing_input("RS256", "https://rs.example", "alice");
    auto sig = der_signature(rsa.get(), input);
    add("RS256", {"https://rs.example", "", "", jwks.dump()}, sig, sig,
        n_slow);
  }
  {
    auto input = signing_input("ES256", "https://es.example", "alice");
    auto der = der_signature(ec.get(), input);
    add("ES256", {"https://es.example", "", "", ec_jwks.dump()}, der,
        raw_of(der), n_slow);
  }

  table verify;
  verify.title = "An end user's JWT verified per request (microseconds)";
  verify.columns = {"algorithm", "spindle µs", "OpenSSL alone µs",
                    "spindle / OpenSSL"};
  verify.notes = {
    "spindle: jwt_verifier::verify, the whole token (split, base64url, "
    "header and claims parsed, signature, iss, aud, exp, sub); OpenSSL "
    "alone: only the signature of the same bytes (HMAC, or "
    "EVP_DigestVerify with the key made once), the floor.",
    "A token is verified once: later requests with it are answered from "
    "the store's cache (the next table) until it expires."};
  for (auto& c : cases) {
    int64_t now = far_exp - 1000;
    auto check = c.verifier->verify(c.token, now);
    if (!check)
      die(c.name + " token refused: " + to_string(check.error()));
    auto ours = micros(c.n, [&](size_t) {
      auto r = c.verifier->verify(c.token, now);
      if (!r)
        die("refused while measuring");
    });
    double floor = 0;
    if (c.name == "HS256") {
      floor = micros(c.n, [&](size_t) {
        auto mac = hmac(c.input);
        if (CRYPTO_memcmp(mac.data(), c.signature.data(), mac.size()) != 0)
          die("the floor's HMAC differs");
      });
    } else {
      EVP_PKEY* key = c.name == "RS256" ? rsa.get() : ec.get();
      floor = micros(c.n, [&](size_t) {
        EVP_MD_CTX* ctx = EVP_MD_CTX_new();
        EVP_DigestVerifyInit(ctx, nullptr, EVP_sha256(), nullptr, key);
        int ok = EVP_DigestVerify(
          ctx, reinterpret_cast<const unsigned char*>(c.signature.data()),
          c.signature.size(),
          reinterpret_cast<const unsigned char*>(c.input.data()),
          c.input.size());
        EVP_MD_CTX_free(ctx);
        if (ok != 1)
          die("the floor's signature does not verify");
      });
    }
    verify.add_row(c.name, bench::fmt(ours, 2), bench::fmt(floor, 2),
                   bench::fmt(ours / floor, 2) + "x");
  }
  rep.add(std::move(verify));

  // The store's answers: a cached end user's token, a cached key.
  storage_options so;
  so.data_dir = ":memory:";
  auto store = tenancy::tenant_store::open(so);
  if (!store)
    die("the tenant store does not open");
  auto t = (*store)->create_tenant("bench", 1);
  if (!t || !(*store)->set_auth(t->id, {"https://hs.example", "", secret, ""}))
    die("cannot make the tenant");
  auto key = (*store)->create_key(t->id, "k", tenancy::default_scopes, 0);
  if (!key)
    die("cannot make a key");
  // 1,000 end users' tokens and the one key, each used once before.
  std::vector<std::string> tokens;
  for (int i = 0; i < 1000; ++i) {
    auto input = signing_input("HS256", "https://hs.example",
                               "u" + std::to_string(i));
    tokens.push_back(input + "." + tenancy::base64url_encode(hmac(input)));
  }
  bool needs = false;
  for (auto& tok : tokens)
    if (!(*store)->end_user(tok, true, needs))
      die("a token is refused");
  tenancy::key_record found;
  if (!(*store)->authenticate(key->secret, found))
    die("the key is refused");

  table cached;
  cached.title = "A request's token as the store answers it once it is known "
                 "(microseconds)";
  cached.columns = {"token", "spindle µs", "baseline", "baseline µs"};
  cached.notes = {
    "An end user's token: tenant_store::end_user on a token verified before "
    "(1,000 tokens cycled), beside the HS256 verification it saves. A "
    "tenant's key: cached_principal, beside the SHA-256 of the key, the "
    "stored hash a look-up by it would compute (the caches are keyed by "
    "SipHash-2-4-128 under a key drawn at random by each process, a tenth "
    "of SHA-256's cost; never by the secret)."};
  auto jwt_cached = micros(n_fast, [&](size_t i) {
    auto p = (*store)->end_user(tokens[i % tokens.size()], false, needs);
    if (!p || !*p)
      die("a cached token is not answered from the cache");
  });
  auto hs_verify = micros(n_fast, [&](size_t) {
    auto r = cases[0].verifier->verify(cases[0].token, far_exp - 1000);
    if (!r)
      die("refused");
  });
  cached.add_row("end user (JWT)", bench::fmt(jwt_cached, 2), "HS256 verification",
                 bench::fmt(hs_verify, 2));
  auto key_cached = micros(n_fast, [&](size_t) {
    if (!(*store)->cached_principal(key->secret))
      die("the key is not cached");
  });
  auto sha = micros(n_fast, [&](size_t) {
    auto h = sha256(key->secret);
    if (h[0] == 0 && h[1] == 0 && h[2] == 0 && h[3] == 0)
      die("an unlikely hash");
  });
  cached.add_row("tenant key", bench::fmt(key_cached, 2), "SHA-256 of the key",
                 bench::fmt(sha, 2));
  rep.add(std::move(cached));

  if (!rep.write(report::json_path(argc, argv, "auth")))
    return 1;
  return 0;
}
