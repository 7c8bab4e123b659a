#pragma once

#include <cstdint>
#include <optional>

namespace spindle {

/// What the process's allocator holds, when it is jemalloc (the spindle
/// executable's allocator; docs/architecture.md, "Threading"). An embedder
/// on another allocator gets nothing. Figures in bytes, as jemalloc's
/// `stats.*` counts them (docs/reliability.md, "Soak"):
struct allocator_stats {
  /// Live objects: bytes the program allocated and has not freed.
  uint64_t allocated = 0;
  /// Pages of runs that hold at least one live object (allocated plus
  /// the free space inside them: fragmentation).
  uint64_t active = 0;
  /// The allocator's own bookkeeping.
  uint64_t metadata = 0;
  /// Physically resident pages the allocator maps: active, metadata and
  /// dirty pages not yet given back.
  uint64_t resident = 0;
  /// Freed pages the allocator keeps resident before giving them back to
  /// the kernel (its decay).
  uint64_t dirty = 0;
};

/// Reads the allocator's statistics now; nullopt if it is not jemalloc.
std::optional<allocator_stats> read_allocator_stats();

} // namespace spindle
