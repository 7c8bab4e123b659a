#pragma once

// Digests of text (OpenSSL's).

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace spindle {

/// A SHA-256 digest.
using sha256_digest = std::array<unsigned char, 32>;

/// The SHA-256 of `text`. Thread-safe; allocates nothing after a thread's
/// first call (each thread keeps a digest context).
sha256_digest sha256(std::string_view text);

/// `digest` as 64 lowercase hexadecimal digits.
std::string hex_of(const sha256_digest& digest);

/// The SHA-256 of `text`, as 64 lowercase hexadecimal digits. Thread-safe.
std::string sha256_hex(std::string_view text);

/// Hashes a digest for unordered containers: its first bytes, which are
/// as uniform as the rest.
struct sha256_digest_hash {
  size_t operator()(const sha256_digest& d) const noexcept {
    size_t out;
    std::memcpy(&out, d.data(), sizeof out);
    return out;
  }
};

} // namespace spindle
