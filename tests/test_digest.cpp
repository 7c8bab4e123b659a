// Digests (runtime/core/digest.hpp): SHA-256 and SipHash-2-4-128, the
// keyed hash of the tenant store's caches of keys and verified tokens.

#include <random>
#include <string>

#include <catch2/catch.hpp>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "core/digest.hpp"

using namespace spindle;

namespace {

std::string hex(const unsigned char* p, size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

siphash_key counting_key() {
  siphash_key k{};
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = static_cast<unsigned char>(i);
  return k;
}

std::string counting_text(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i)
    s[i] = static_cast<char>(i);
  return s;
}

// OpenSSL's SIPHASH MAC with a 16-byte output: the reference to agree with.
std::string openssl_siphash(const siphash_key& key, const std::string& text) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "SIPHASH", nullptr);
  REQUIRE(mac != nullptr);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  REQUIRE(ctx != nullptr);
  size_t size = 16;
  OSSL_PARAM params[] = {
    OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size),
    OSSL_PARAM_construct_end()};
  REQUIRE(EVP_MAC_init(ctx, key.data(), key.size(), params) == 1);
  REQUIRE(EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(
                                text.data()),
                         text.size())
          == 1);
  unsigned char out[16];
  size_t written = 0;
  REQUIRE(EVP_MAC_final(ctx, out, &written, sizeof out) == 1);
  REQUIRE(written == 16);
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return hex(out, written);
}

} // namespace

TEST_CASE("SipHash-2-4-128 gives the reference implementation's vectors") {
  // vectors_sip128 of the SipHash reference: key 00..0f, message 00..n-1.
  auto key = counting_key();
  auto empty = siphash128(key, "");
  CHECK(hex(empty.data(), empty.size()) == "a3817f04ba25a8e66df67214c7550293");
  auto fifteen = siphash128(key, counting_text(15));
  CHECK(hex(fifteen.data(), fifteen.size())
        == "5493e99933b0a8117e08ec0f97cfc3d9");
  auto sixty_four = siphash128(key, counting_text(64));
  CHECK(hex(sixty_four.data(), sixty_four.size())
        == "1eaf077dc0d4cd3f8cad4d383658a74b");
}

TEST_CASE("SipHash-2-4-128 agrees with OpenSSL's SIPHASH on random keys "
          "and texts of every length up to 300 bytes") {
  std::mt19937_64 rng{20261128};
  for (size_t n = 0; n <= 300; ++n) {
    siphash_key key{};
    for (auto& b : key)
      b = static_cast<unsigned char>(rng());
    std::string text(n, '\0');
    for (auto& c : text)
      c = static_cast<char>(rng());
    auto mine = siphash128(key, text);
    INFO("length " << n);
    CHECK(hex(mine.data(), mine.size()) == openssl_siphash(key, text));
  }
}

TEST_CASE("a SipHash key is drawn at random: two keys differ, and so do "
          "the values of one text under them") {
  auto a = random_siphash_key();
  auto b = random_siphash_key();
  CHECK(a != b);
  CHECK(siphash128(a, "spk_same-text") != siphash128(b, "spk_same-text"));
  // Under one key a value is a function of the text: the same text, the
  // same value; a change of one byte, another.
  CHECK(siphash128(a, "spk_same-text") == siphash128(a, "spk_same-text"));
  CHECK(siphash128(a, "spk_same-text") != siphash128(a, "spk_same-texu"));
}

TEST_CASE("SHA-256 gives the FIPS 180-2 vector, in hexadecimal as stored") {
  CHECK(sha256_hex("abc")
        == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex_of(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("same_bytes tells equal texts from every kind of difference") {
  // Lengths around the eight-byte words it compares, a difference at each
  // position (in a word and in the tail), and a different length.
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 16u, 31u, 32u, 33u, 200u}) {
    std::string a(n, 'x');
    for (size_t i = 0; i < n; ++i)
      a[i] = static_cast<char>('a' + i % 26);
    CHECK(same_bytes(a, a));
    CHECK(same_bytes(a, std::string{a}));
    for (size_t i = 0; i < n; ++i) {
      auto b = a;
      b[i] = static_cast<char>(b[i] ^ 0x80);
      INFO("length " << n << ", byte " << i);
      CHECK_FALSE(same_bytes(a, b));
      CHECK_FALSE(same_bytes(b, a));
    }
    CHECK_FALSE(same_bytes(a, a + "y"));
    CHECK_FALSE(same_bytes(a + "y", a));
  }
  CHECK(same_bytes("", ""));
}
