#pragma once

// Reading what an upstream says of its capacity in its answer's headers
// (docs/limits.md, "When the upstream refuses").

#include <cstdint>
#include <ctime>
#include <string_view>

namespace spindle {

/// `Retry-After` in ms: delay-seconds ("2", "1.5") or an HTTP date (read
/// against `now`, a date in the past being 0); -1 when absent or not
/// understood. Thread-safe.
int64_t parse_retry_after(std::string_view value, std::time_t now);

/// A duration as OpenAI's `x-ratelimit-reset-*` headers write it ("1s",
/// "6m0s", "1m30.5s", "20ms", "2h"; a bare number is seconds) in ms; -1
/// when absent or not understood. Thread-safe.
int64_t parse_duration_ms(std::string_view value);

/// A non-negative integer header ("59"); -1 when absent or not one.
/// Thread-safe.
int64_t parse_count(std::string_view value);

} // namespace spindle
