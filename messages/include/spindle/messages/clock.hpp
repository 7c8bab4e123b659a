#pragma once

#include <chrono>
#include <cstdint>

namespace spindle {

/// Milliseconds since the Unix epoch, the unit of turn timestamps and of
/// the store's `created_ms` columns. This function is thread-safe.
inline int64_t unix_time_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch())
    .count();
}

} // namespace spindle
