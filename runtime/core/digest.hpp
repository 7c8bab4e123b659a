#pragma once

// Digests of text (OpenSSL's).

#include <string>
#include <string_view>

namespace spindle {

/// The SHA-256 of `text`, as 64 lowercase hexadecimal digits. Thread-safe.
std::string sha256_hex(std::string_view text);

} // namespace spindle
