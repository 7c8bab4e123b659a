#pragma once

// Digests of text: SHA-256 (OpenSSL's) and SipHash-2-4-128, a keyed hash
// for in-memory tables of secrets.

#include <array>
#include <cstddef>
#include <cstdint>
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

/// A SipHash-2-4-128 value: 16 bytes, as the reference implementation
/// writes them.
using siphash_digest = std::array<unsigned char, 16>;

/// A SipHash key: 16 bytes.
using siphash_key = std::array<unsigned char, 16>;

/// SipHash-2-4 of `text` under `key`, with the 128-bit output
/// (Aumasson and Bernstein; the same as OpenSSL's SIPHASH MAC with a
/// 16-byte digest). A pseudorandom function: without the key, no one can
/// compute a value or find two texts with the same one, so a table of
/// secrets may be keyed by it under a key drawn at random and held in
/// memory only; it costs a tenth of SHA-256 on a key-sized text.
siphash_digest siphash128(const siphash_key& key, std::string_view text) noexcept;

/// A key from OpenSSL's random generator (throws when it has none).
siphash_key random_siphash_key();

/// True when `a` and `b` hold the same bytes, in a time that depends on
/// their length only (eight bytes at a time, no early exit): comparing a
/// guess with a secret tells nothing of how much of it was right. Texts
/// of different lengths are told apart at once.
bool same_bytes(std::string_view a, std::string_view b) noexcept;

/// Hashes a SipHash value for unordered containers: its first bytes.
struct siphash_digest_hash {
  size_t operator()(const siphash_digest& d) const noexcept {
    size_t out;
    std::memcpy(&out, d.data(), sizeof out);
    return out;
  }
};

} // namespace spindle
