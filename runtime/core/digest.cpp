#include "core/digest.hpp"

#include <cstring>
#include <memory>
#include <stdexcept>

#include <openssl/evp.h>
#include <openssl/rand.h>

namespace spindle {

namespace {

struct ctx_deleter {
  void operator()(EVP_MD_CTX* ctx) const noexcept {
    EVP_MD_CTX_free(ctx);
  }
};

} // namespace

sha256_digest sha256(std::string_view text) {
  // Fetched once: EVP_sha256() makes every digest look its implementation
  // up again among OpenSSL 3's providers, under a lock, which costs more
  // than hashing a key. One context per thread, reused: EVP_Digest makes
  // and frees one per call.
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  thread_local std::unique_ptr<EVP_MD_CTX, ctx_deleter> ctx{EVP_MD_CTX_new()};
  sha256_digest out{};
  unsigned int size = 0;
  auto* type = md != nullptr ? md : EVP_sha256();
  if (!ctx || EVP_DigestInit_ex2(ctx.get(), type, nullptr) != 1
      || EVP_DigestUpdate(ctx.get(), text.data(), text.size()) != 1
      || EVP_DigestFinal_ex(ctx.get(), out.data(), &size) != 1)
    EVP_Digest(text.data(), text.size(), out.data(), &size, type, nullptr);
  return out;
}

std::string hex_of(const sha256_digest& digest) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out(digest.size() * 2, '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view text) {
  return hex_of(sha256(text));
}

namespace {

// SipHash reads and writes its words little-endian.
uint64_t load64(const unsigned char* p) noexcept {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
#else
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
#endif
}

void store64(unsigned char* p, uint64_t v) noexcept {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  std::memcpy(p, &v, sizeof v);
#else
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
#endif
}

constexpr uint64_t rotl(uint64_t x, int b) noexcept {
  return (x << b) | (x >> (64 - b));
}

struct sip_state {
  uint64_t v0, v1, v2, v3;

  void rounds(int n) noexcept {
    for (int i = 0; i < n; ++i) {
      v0 += v1;
      v1 = rotl(v1, 13);
      v1 ^= v0;
      v0 = rotl(v0, 32);
      v2 += v3;
      v3 = rotl(v3, 16);
      v3 ^= v2;
      v0 += v3;
      v3 = rotl(v3, 21);
      v3 ^= v0;
      v2 += v1;
      v1 = rotl(v1, 17);
      v1 ^= v2;
      v2 = rotl(v2, 32);
    }
  }
};

} // namespace

bool same_bytes(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size())
    return false;
  uint64_t diff = 0;
  size_t i = 0;
  for (; i + 8 <= a.size(); i += 8)
    diff |= load64(reinterpret_cast<const unsigned char*>(a.data()) + i)
            ^ load64(reinterpret_cast<const unsigned char*>(b.data()) + i);
  for (; i < a.size(); ++i)
    diff |= static_cast<uint64_t>(static_cast<unsigned char>(a[i])
                                  ^ static_cast<unsigned char>(b[i]));
  return diff == 0;
}

siphash_digest siphash128(const siphash_key& key,
                          std::string_view text) noexcept {
  auto k0 = load64(key.data());
  auto k1 = load64(key.data() + 8);
  sip_state s{0x736f6d6570736575ULL ^ k0, 0x646f72616e646f6dULL ^ k1,
              0x6c7967656e657261ULL ^ k0, 0x7465646279746573ULL ^ k1};
  s.v1 ^= 0xee;
  auto* in = reinterpret_cast<const unsigned char*>(text.data());
  size_t whole = text.size() - text.size() % 8;
  for (size_t at = 0; at < whole; at += 8) {
    auto m = load64(in + at);
    s.v3 ^= m;
    s.rounds(2);
    s.v0 ^= m;
  }
  unsigned char tail[8] = {};
  std::memcpy(tail, in + whole, text.size() % 8);
  uint64_t last = load64(tail) | static_cast<uint64_t>(text.size()) << 56;
  s.v3 ^= last;
  s.rounds(2);
  s.v0 ^= last;
  s.v2 ^= 0xee;
  s.rounds(4);
  siphash_digest out{};
  store64(out.data(), s.v0 ^ s.v1 ^ s.v2 ^ s.v3);
  s.v1 ^= 0xdd;
  s.rounds(4);
  store64(out.data() + 8, s.v0 ^ s.v1 ^ s.v2 ^ s.v3);
  return out;
}

siphash_key random_siphash_key() {
  siphash_key key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1)
    throw std::runtime_error{"OpenSSL has no random bytes for a SipHash key"};
  return key;
}

} // namespace spindle
