#pragma once

// What every fuzz target shares: the libFuzzer entry point's signature and
// an invariant check that stops the run with the input kept.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace spindle::fuzz {

/// The input as text.
inline std::string_view text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Aborts when an invariant does not hold: libFuzzer keeps the input as a
/// crash, the replay test fails on it.
inline void check(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
    std::abort();
  }
}

} // namespace spindle::fuzz
