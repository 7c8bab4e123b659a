#include "core/digest.hpp"

#include <memory>

#include <openssl/evp.h>

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

} // namespace spindle
