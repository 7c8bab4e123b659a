#include "core/digest.hpp"

#include <openssl/evp.h>

namespace spindle {

std::string sha256_hex(std::string_view text) {
  // Fetched once: EVP_sha256() makes every digest look its implementation
  // up again among OpenSSL 3's providers, under a lock, which costs more
  // than hashing a key.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest, &size,
             sha256 != nullptr ? sha256 : EVP_sha256(), nullptr);
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (unsigned int i = 0; i < size; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

} // namespace spindle
