#include "core/allocator.hpp"

#include <cstddef>
#include <string>

#include <unistd.h>

// jemalloc's control interface, if the program links jemalloc. The library
// leaves the allocator to the program (CMakeLists.txt, spindle_allocator):
// a weak reference stays null under any other allocator.
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp,
                       void* newp, size_t newlen) __attribute__((weak));

namespace spindle {

namespace {

bool read_size(const char* name, uint64_t& out) {
  size_t value = 0;
  size_t len = sizeof(value);
  if (mallctl(name, &value, &len, nullptr, 0) != 0)
    return false;
  out = value;
  return true;
}

} // namespace

std::optional<allocator_stats> read_allocator_stats() {
  if (mallctl == nullptr)
    return std::nullopt;
  // The statistics are a snapshot taken when the epoch advances.
  uint64_t epoch = 1;
  size_t len = sizeof(epoch);
  if (mallctl("epoch", &epoch, &len, &epoch, len) != 0)
    return std::nullopt;
  allocator_stats s;
  if (!read_size("stats.allocated", s.allocated)
      || !read_size("stats.active", s.active)
      || !read_size("stats.metadata", s.metadata)
      || !read_size("stats.resident", s.resident))
    return std::nullopt;
  // Dirty pages of all arenas together (MALLCTL_ARENAS_ALL is 4096).
  uint64_t pages = 0;
  if (read_size("stats.arenas.4096.pdirty", pages))
    s.dirty = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return s;
}

} // namespace spindle
